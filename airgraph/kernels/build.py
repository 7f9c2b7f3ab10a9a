"""Building one static kernel: a segment's graph compiled by Inductor for one shape key, as an AOTInductor package.

The segment's graph (ATen, possibly with symbolic sizes) is specialized to the key's concrete inputs: Python
values (SymInts of the key) become constants, tensors get the key's dtypes, sizes and strides. ``torch.export``
traces it into an ExportedProgram with static shapes (in-place writes to inputs, such as a KV-cache update, are
kept as mutations of those inputs), and ``torch._inductor.aoti_compile_and_package`` compiles that with Inductor
(the segment's Inductor options; on CUDA, Triton kernels autotuned for these sizes) into one ``.pt2`` file holding
the compiled code and its C++ launcher (``kernels/dispatch.py`` loads it).

AOTInductor packages rather than Inductor's output code: one file, loaded through a public API on the CPU and on
CUDA alike, with a C++ launcher (why: docs/design/static-kernel-loading.md).

Inductor writes a build's files under its cache folder, named by a digest of the generated code, and writes some of
them in place (the metadata JSON files, with ``open(..., "w")`` and ``shutil.copy``): two processes building the same
code at once (two libraries on one machine, two test workers) could package each other's half-written file, a
package whose loader then fails on an empty JSON file. So a build holds a cross-process lock named by a digest of
what it compiles (airgraph/store.py ``locked``, in Inductor's cache folder), and a package is checked before it is
used: every JSON file in it must parse.

The built module returns the segment's tensor outputs only; outputs that are Python values (sizes computed from
the key) are constants of the key, and the dispatcher puts them back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from airgraph.store import locked

__all__ = ["build_kernel", "check_package", "example_tensors", "outside_compilation", "tensor_outputs"]

_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def example_tensors(specs: list[dict[str, Any]], device: torch.device) -> list[torch.Tensor]:
    """Tensors with the specs' dtypes, sizes and strides on ``device``: small random floats, zeros otherwise (valid
    indices for any gather or index_copy the graph does)."""
    tensors = []
    for s in specs:
        if "dtype" not in s:
            continue
        dtype = _DTYPES[s["dtype"]]
        t = torch.empty_strided(s["shape"], s["stride"], dtype=dtype, device=device)
        if dtype.is_floating_point or dtype.is_complex:
            t.uniform_(-0.5, 0.5)
        else:
            t.zero_()
        tensors.append(t)
    return tensors


def tensor_outputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the segment's outputs that are tensors (its traced values say)."""
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    return [
        i
        for i, out in enumerate(outputs)
        if isinstance(out, torch.fx.Node) and isinstance(out.meta.get("val"), torch.Tensor)
    ]


@contextlib.contextmanager
def outside_compilation() -> Iterator[None]:
    """Compile as if called at top level, not as part of the graph call this is nested in: a graph's first run
    happens inside Dynamo's tracing and compile contexts and AOTAutograd's dispatch mode that checks custom ops,
    where export and Inductor would find the wrong fake mode or trace through the mode."""
    with _disable_current_modes(), torch._guards.tracing(None), torch._guards.compile_context(None):
        yield


class _Specialized(torch.nn.Module):
    """The segment with its Python-valued inputs fixed to the key's values: tensors in, tensor outputs out."""

    def __init__(self, gm: torch.fx.GraphModule, specs: list[dict[str, Any]]) -> None:
        super().__init__()
        self.gm = gm
        self.count = len(specs)
        self.tensors = [i for i, s in enumerate(specs) if "dtype" in s]
        self.values = {i: s["value"] for i, s in enumerate(specs) if "dtype" not in s}
        self.outputs = tensor_outputs(gm)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args: list[Any] = [None] * self.count
        for i, t in zip(self.tensors, tensors, strict=True):
            args[i] = t
        for i, v in self.values.items():
            args[i] = v
        outs = self.gm(*args)
        return tuple(outs[i] for i in self.outputs)


def build_kernel(
    gm: torch.fx.GraphModule,
    specs: list[dict[str, Any]],
    device: torch.device,
    path: Path,
    *,
    inductor_config: dict[str, Any] | None = None,
) -> float:
    """Compile ``gm`` for inputs of ``specs`` (kernels/shapes.py) on ``device`` into the AOTInductor package
    ``path``; returns the seconds it took. Raises what export or Inductor raise for a graph they cannot compile."""
    from torch._inductor import aoti_compile_and_package
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    module = _Specialized(gm, specs)
    options = dict(inductor_config or {})
    what = json.dumps([gm.code, specs, str(device), sorted(options.items())], default=str)
    lock = Path(cache_dir()) / "airgraph-builds" / hashlib.sha256(what.encode()).hexdigest()[:32]
    with locked(lock), torch.no_grad(), outside_compilation():  # one build of the same code at a time (docstring)
        program = torch.export.export(module, tuple(example_tensors(specs, device)), strict=False)
        aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    check_package(path)
    return time.perf_counter() - start


def check_package(path: Path) -> None:
    """Raise RuntimeError if a JSON file in the AOTInductor package ``path`` does not parse (docstring)."""
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(".json"):
                try:
                    json.loads(archive.read(name))
                except ValueError:
                    raise RuntimeError(
                        f"the package Inductor wrote holds a torn file, {name} (another process building the same "
                        "code wrote it at the same time?)"
                    ) from None
