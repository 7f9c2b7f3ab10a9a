"""Runs what lowering produced: the device runtimes (device.py: CUDA, the CPU, and the simulator in simulated.py),
the executor (executor.py), reduce-overhead's capture and replay (capture.py) and the host work around a replay
(host.py). Imports nothing from airgraph/passes or airgraph/lowering: it never builds or lowers a graph."""
