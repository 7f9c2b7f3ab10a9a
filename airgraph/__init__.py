"""airgraph: a graph-mode torch.compile backend for CUDA GPUs and CPUs.

import torch, airgraph
config = airgraph.CompilerConfig()
config.mode = "reduce-overhead"
model = torch.compile(model, backend=airgraph.get_backend(compiler_config=config))
"""

from airgraph.backend import get_backend
from airgraph.config import CompilerConfig
from airgraph.explain import explain

__all__ = ["CompilerConfig", "explain", "get_backend"]
__version__ = "0.1.0"
