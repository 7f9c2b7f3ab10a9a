"""``airgraph.compare``'s implementation: where a compiled model leaves eager, and in which node of whose code.

Named ``precision`` (TorchAir's precision comparison) so as not to shadow the function ``airgraph.compare``.
Reading order: run.py (eager against compiled, outputs and gradients), record.py (what each compiled graph
ran on), reference.py (every node's eager value), locate.py (the first divergent node of each segment), report.py,
dump.py; device.py (copies and calls on the backend's runtime); api.py ties them together.
"""
