"""From a graph the passes annotated to compiled segments: partition.py cuts it into segments, select.py (the
seam) chooses each segment's implementation, lower.py compiles it with a kernel backend (backends.py: inductor.py,
aten.py), layouts.py carries the strides values really have between segments, and capture_plan.py and
host_split.py decide how reduce-overhead captures the graph. Nothing here runs a graph: airgraph/runtime does.

This package's ``__init__`` imports nothing: ``airgraph.config`` reads the kernel backend registry
(backends.py) without importing torch.
"""
