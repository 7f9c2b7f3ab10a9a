"""Static kernels on a GPU: Triton kernels built per shape, loaded in a fresh process without compiling, captured in
reduce-overhead; a kernel built for another compute capability is refused. Skipped without a GPU."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from airgraph.backend import AirgraphBackend
from airgraph.kernels.machine import describe
from airgraph.kernels.static import StaticKernels
from tests.helpers import assert_close
from tests.kernels.conftest import run_python, static_config
from tests.kernels.models import Step, inputs

pytestmark = [pytest.mark.cuda, pytest.mark.slow]


def _run_cuda(backend: AirgraphBackend, batches: tuple[int, ...]) -> None:
    model, reference = Step().cuda(), Step().cuda()
    compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for batch in batches:
            tokens, pos = (t.cuda() for t in inputs(batch))
            assert_close(compiled(tokens, pos), reference(tokens, pos))
            assert_close(model.cache, reference.cache)


FRESH = """
import json, sys
import torch
from torch._inductor.graph import GraphLowering
lowered = []
original = GraphLowering.__init__
def counting(self, *args, **kwargs):
    lowered.append(1)
    original(self, *args, **kwargs)
GraphLowering.__init__ = counting
import airgraph
from tests.kernels.models import Step, inputs
config = airgraph.CompilerConfig()
config.mode = "reduce-overhead"
config.static_kernels.enabled = True
config.static_kernels.build_dir = sys.argv[1]
config.static_kernels.build = False
backend = airgraph.get_backend(config)
model, reference = Step().cuda(), Step().cuda()
compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
diff = 0.0
with torch.no_grad():
    for batch in (2, 3, 2, 3, 2):
        tokens, pos = (t.cuda() for t in inputs(batch))
        diff = max(diff, (compiled(tokens, pos) - reference(tokens, pos)).abs().max().item())
report = backend.reports[0]
print(json.dumps({"lowered": len(lowered), "diff": diff, "captured": report.captured,
                  "keys": report.capture_keys, **report.segments[0].source}))
"""


def test_cuda_kernels_are_built_then_loaded_by_a_fresh_process_and_captured(tmp_path):
    backend = AirgraphBackend(static_config(tmp_path))
    _run_cuda(backend, (2, 3))
    (segment,) = backend.reports[0].segments
    assert segment.chosen_by == "static_kernels" and segment.source["static_keys"] == ["[2]", "[3]"]
    build = json.loads(next((tmp_path / "static_kernel_library").glob("index.json")).read_text())
    devices = {e["build"]["device"]["capability"] for e in build["kernels"].values()}
    assert devices == {describe(torch.device("cuda"))["device"]["capability"]}
    done = run_python(FRESH, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lowered"] == 0 and result["diff"] <= 1e-4
    assert result["captured"] and result["keys"] == 2 and result["static_keys"] == ["[2]", "[3]"]


def test_a_kernel_for_another_compute_capability_is_refused(tmp_path):
    backend = AirgraphBackend(static_config(tmp_path))
    _run_cuda(backend, (2,))
    index_path = tmp_path / "static_kernel_library" / "index.json"
    index = json.loads(index_path.read_text())
    for entry in index["kernels"].values():
        entry["build"]["device"]["capability"] = "1.0"
    index_path.write_text(json.dumps(index))
    kernels = StaticKernels(static_config(tmp_path, build=False))
    (kid,) = index["kernels"]
    graph, shape = kid.split("/")
    with pytest.warns(UserWarning, match=r"built for CUDA compute capability 1\.0"):
        assert kernels.load(graph, shape, torch.device("cuda")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels.load(graph, shape, torch.device("cuda")) is None
