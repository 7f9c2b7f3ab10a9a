"""Running compiled graphs: the executor (segments in order) and CUDA graph capture (reduce-overhead)."""

from airgraph.runtime.capture import CaptureState, GraphCapture, MemoryPool, find_uncapturable
from airgraph.runtime.executor import build_executor

__all__ = ["CaptureState", "GraphCapture", "MemoryPool", "build_executor", "find_uncapturable"]
