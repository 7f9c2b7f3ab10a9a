"""Benchmarks airgraph runs itself (``airgraph demo``, ``airgraph bench``) and helpers for the scripts under
benchmarks/: decode.py (the tiny LLaMA decode step, every mode), streams.py (the two-branch multi-stream model),
results.py (where a result was measured, and writing it), ties.py (token mismatches: rounding tie or wrong). This
module holds the settings the command line offers; it imports no torch.
"""

__all__ = ["CUDA_ONLY_MODES", "DEFAULT_STEPS", "DEFAULT_WARMUP", "DTYPE_NAMES", "MODES", "MODE_ALIASES"]

MODES = (
    "eager",
    "torch.compile",
    "airgraph max-autotune",
    "airgraph reduce-overhead",
    "airgraph fast-path",
    "torch.compile reduce-overhead",
)
CUDA_ONLY_MODES = frozenset({"torch.compile reduce-overhead"})
# Short spellings accepted by parse_modes (and so by `airgraph bench --modes`).
MODE_ALIASES = {
    "compile": "torch.compile",
    "inductor": "torch.compile",
    "max-autotune": "airgraph max-autotune",
    "reduce-overhead": "airgraph reduce-overhead",
    "fast-path": "airgraph fast-path",
    "torch-reduce-overhead": "torch.compile reduce-overhead",
}
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DEFAULT_STEPS = 100
DEFAULT_WARMUP = 10
