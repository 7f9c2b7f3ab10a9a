"""Follow a graph through ``AirgraphBackend.compile_graph`` call by call (issue #21's measure of the compile path).

    python scripts/pipeline_walk.py [--show]

Compiles two models on the CUDA simulator in reduce-overhead with the aten kernel backend: the tiny LLaMA decode
step (no host split) and seed 003's shape fragment, scaled (host work split off around the replay; the fragment
alone leaves the device only a view, which is not captured). ``--full``: with static kernels on (building into a
temporary folder) and a tuning bank (empty, in a temporary folder), as the issue walked it. For each, every call
of an airgraph function (a file under airgraph/) that receives a ``torch.fx.GraphModule`` or ``torch.fx.Graph``
while ``compile_graph`` runs is a *stop*, at the depth of airgraph frames below ``compile_graph``. Then:

- *stops*: how many there were, and in how many modules;
- *entries* per module: runs of consecutive stops in one module count once (helpers a stage calls one after
  another in its own module are one entry), so a module entered five times was reached by five separate paths;
  backend.py, the driver whose named steps run in turn, is not counted;
- *climbs*: stops shallower than the stop before them (the walk came back up to go down elsewhere).

Prints one line per model (``--show``: every stop) and exits 1 when a model's walk climbs more than 10 times or
enters a module more than 4 times (issue #21's aim).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import airgraph  # noqa: E402
from airgraph.backend import AirgraphBackend  # noqa: E402
from airgraph.runtime.simulated import SimulatedCuda  # noqa: E402
from tests.helpers import make_config  # noqa: E402

PACKAGE = str(Path(airgraph.__file__).resolve().parent) + os.sep
# compile_graph's own module: its named steps return to it between stages by design (a driver read top to bottom),
# so coming back to it is not a re-entry; climbs still count every return upward.
DRIVER = "backend.py"
MAX_CLIMBS, MAX_ENTRIES = 10, 4


def _holds_graph(frame) -> bool:
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, (torch.fx.GraphModule, torch.fx.Graph)):
            return True
    return False


def walk(compile_once) -> list[tuple[int, str, str]]:
    """(depth, module, function) of each stop while ``compile_graph`` runs in ``compile_once()``."""
    stops: list[tuple[int, str, str]] = []
    depth = [0]
    inside = [0]

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        path = frame.f_code.co_filename
        if not path.startswith(PACKAGE):
            return
        if event == "return":
            if inside[0]:
                depth[0] -= 1
                if frame.f_code.co_name == "compile_graph" and depth[0] == 0:
                    inside[0] = 0
            return
        if frame.f_code.co_name == "compile_graph" and not inside[0]:
            inside[0], depth[0] = 1, 0
        if not inside[0]:
            return
        depth[0] += 1
        if depth[0] > 1 and _holds_graph(frame):
            module = os.path.relpath(path, PACKAGE)
            stops.append((depth[0] - 1, module, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        compile_once()
    finally:
        sys.setprofile(None)
    return stops


def summary(stops: list[tuple[int, str, str]]) -> dict:
    entries: collections.Counter[str] = collections.Counter()
    climbs, previous = 0, None
    for depth, module, _ in stops:
        if (previous is None or module != previous[1]) and module != DRIVER:
            entries[module] += 1
        if previous is not None and depth < previous[0]:
            climbs += 1
        previous = (depth, module)
    return {"stops": len(stops), "modules": len(entries), "climbs": climbs, "entries": dict(entries.most_common())}


OPTIONS: dict = {"mode": "reduce-overhead", "kernel_backend": "aten"}


def _backend(sim: SimulatedCuda) -> AirgraphBackend:
    return AirgraphBackend(make_config(**OPTIONS), runtime=sim)


def _decode(sim: SimulatedCuda):
    from airgraph.models import build_tiny_llama, decode_inputs

    model = sim.to_device(build_tiny_llama("tiny"))
    tokens, pos = (sim.to_device(t) for t in decode_inputs(model.config, 1, 8))

    def once():
        backend = _backend(sim)
        torch._dynamo.reset()
        with torch.no_grad(), sim.call():
            torch.compile(model, backend=backend, fullgraph=True)(tokens, pos)

    return once


def _fragment(sim: SimulatedCuda):
    from tests.passes.test_host_placement import scaled_fragment as fragment  # (device work to capture)

    x = sim.to_device(torch.randn(4, 6))

    def once():
        backend = _backend(sim)
        torch._dynamo.reset()
        torch._dynamo.config.capture_scalar_outputs = True
        try:
            with sim.call():
                torch.compile(fragment, backend=backend)(x)
        finally:
            torch._dynamo.config.capture_scalar_outputs = False
        assert backend.reports[0].host_prologue, "the fragment's host work was not split off"

    return once


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--show", action="store_true", help="print every stop")
    parser.add_argument("--full", action="store_true", help="static kernels and a tuning bank on")
    args = parser.parse_args(argv)
    if args.full:
        folder = Path(tempfile.mkdtemp(prefix="airgraph-walk-"))
        OPTIONS.update(
            {
                "static_kernels.enabled": True,
                "static_kernels.build_dir": str(folder / "kernels"),
                "tuning.bank_dir": str(folder / "bank"),
            }
        )
    failed = False
    for name, build in (("decode step", _decode), ("host-split fragment", _fragment)):
        stops = walk(build(SimulatedCuda()))
        result = summary(stops)
        over = {m: n for m, n in result["entries"].items() if n > MAX_ENTRIES}
        failed |= result["climbs"] > MAX_CLIMBS or bool(over)
        print(
            f"{name}: {result['stops']} stops in {result['modules']} modules, {result['climbs']} climbs; "
            f"entries: {result['entries']}"
        )
        if args.show:
            for depth, module, function in stops:
                print(f"  {'  ' * depth}{module}:{function}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
