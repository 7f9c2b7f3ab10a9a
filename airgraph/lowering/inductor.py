"""The "inductor" kernel backend: a segment compiled by torch's Inductor (Triton on CUDA, C++ on CPU).

The segment is already an ATen graph (AOTAutograd ran, with Inductor's decompositions when this backend
is selected), so it goes straight to ``compile_fx_inner``, Inductor's per-graph entry point, which exists
with the same keyword arguments from torch 2.11 to 2.13. Inductor's own CUDA graphs stay off: capture is
airgraph's job (runtime/capture.py), over all segments at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from airgraph.lowering.request import LowerRequest


def compile_inductor(request: LowerRequest) -> Callable[[list], Any]:
    """Compile one segment. ``request.options["inductor_config"]``: Inductor config patches (e.g. freezing,
    max_autotune_gemm) chosen by the seam; ``request.options["cpp_wrapper"]``: a C++ wrapper instead of Python's
    (Inductor's own option); ``request.donated``: inputs Inductor may overwrite (backward only)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner

    kind = request.kind
    # Random ops run as ATen's own (fallback_random): Inductor lowers them natively only after its joint-graph
    # pass replaced them, which runs inside its own AOTAutograd (not airgraph's); ATen's draw the numbers eager
    # draws, in the same order, so dropout masks equal eager's.
    patches = {**request.options.get("inductor_config", {}), "triton.cudagraphs": False, "fallback_random": True}
    with inductor_config.patch(patches), _donating(request.donated if kind == "backward" else None):
        compiled = compile_fx_inner(
            _copy(request.gm),
            request.example_inputs,
            is_inference=kind == "inference",
            is_backward=kind == "backward",
            cudagraphs=False,
            cpp_wrapper=bool(request.options.get("cpp_wrapper", False)),
        )
    compiled._boxed_call = True  # Inductor's compiled graphs take the boxed (list) calling convention
    return compiled


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the segment's graph for Inductor, whose passes rewrite the graph they are given in place: the
    segment's own graph stays as traced (the tuning bank and the kernel library key segments by it, after
    lowering too). Nodes and their meta dicts are copied; the values in them are shared, not copied."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)


@contextlib.contextmanager
def _donating(donated: list[int] | None) -> Iterator[None]:
    """Inductor lets a backward graph overwrite the inputs AOTAutograd lists as donated (``bw_donated_idxs``),
    read as positions among the graph it compiles. For a segment they are set to ``donated``, the segment's
    own positions (lowering.donated_inputs), for the duration; None leaves them alone (not a backward)."""
    tracing = torch._guards.TracingContext.try_get()
    metadata = getattr(tracing, "fw_metadata", None)
    if donated is None or metadata is None or not hasattr(metadata, "bw_donated_idxs"):
        yield
        return
    saved = metadata.bw_donated_idxs
    metadata.bw_donated_idxs = donated
    try:
        yield
    finally:
        metadata.bw_donated_idxs = saved
