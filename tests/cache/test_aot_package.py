"""``airgraph.cache_compile``: a later process loads the AOTInductor package the first one stored, without Dynamo
or Inductor; the key, the guards, weights as inputs, damaged entries, what export refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import airgraph
from airgraph.cache.folder import CacheFolder
from airgraph.cli import main
from airgraph.log import forget_warnings
from airgraph.models.mixer import MlpMixer
from tests.helpers import assert_close, make_config

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"blocks": 1, "tokens": 8, "channels": 16, "token_hidden": 16, "channel_hidden": 32}


def _mixer(seed: int = 0, **sizes) -> MlpMixer:
    return MlpMixer(**{**SIZES, **sizes}, seed=seed).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """One cache for the module's in-process tests: each AOTInductor compile costs seconds."""
    return tmp_path_factory.mktemp("aot-cache")


def _fast(model, folder: Path, **options):
    return airgraph.cache_compile(model, config=make_config(compile_cache=str(folder), **options))


def _worker(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "tests/cache/aot_worker.py", *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_loads_the_package_without_dynamo_or_inductor(capsys):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = _worker(env)
    assert first["stats"] == {"loaded": 0, "compiled": 1, "torch.compile": 0}
    assert first["max_abs_diff"] < 1e-5
    second = _worker(env)
    assert second["stats"] == {"loaded": 1, "compiled": 0, "torch.compile": 0}
    assert second["imported"] == {
        "torch._dynamo.convert_frame": False, "torch._inductor.compile_fx": False, "torch.export._trace": False
    }  # fmt: skip
    assert second["max_abs_diff"] < 1e-5
    other_weights = _worker(env, "--seed", "3")
    assert other_weights["stats"]["loaded"] == 1 and other_weights["max_abs_diff"] < 1e-5
    # what `airgraph cache list` shows of it
    assert main(["cache", "list", "--json", "--check"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["entries"]
    assert entry["model"] == "MlpMixer.forward" and entry["mode"] == "cache_compile" and entry["state"] == "ok"
    assert entry["device"] == "cpu" and entry["bytes"] > 10_000
    assert main(["cache", "clear"]) == 0
    assert not list((Path(os.environ["AIRGRAPH_CACHE_DIR"]) / "entries").glob("*.entry"))
    assert _worker(env)["stats"]["compiled"] == 1, "a cleared cache compiles again"


@pytest.mark.slow
def test_two_processes_compiling_one_entry_leave_one_whole_entry():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "tests/cache/aot_worker.py"]
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)]
    both.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    for process in both:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["max_abs_diff"] < 1e-5
    folder = CacheFolder(os.environ["AIRGRAPH_CACHE_DIR"])
    (entry,) = folder.scan()
    assert folder.check(entry.key) is None
    assert not [p for p in folder.entries.iterdir() if p.name.endswith(".tmp")], "no torn temporary file is left"
    assert _worker(env)["stats"] == {"loaded": 1, "compiled": 0, "torch.compile": 0}


def test_weights_are_inputs_other_weights_and_changed_weights_give_their_outputs(folder):
    x = _mixer().example_input(2)
    with torch.no_grad():
        first = _fast(_mixer(seed=0), folder)
        assert_close(first(x), _mixer(seed=0)(x))
        model = _mixer(seed=1)
        second = _fast(model, folder)
        assert_close(second(x), model(x))
        assert second.stats["loaded"] == 1, "a model with other weights loads the same entry"
        model.head.weight.mul_(-2.0)  # changed in place after the load
        model.blocks[0].norm1.bias.add_(0.5)
        assert_close(second(x), model(x))
        model.head.bias = nn.Parameter(torch.ones_like(model.head.bias))  # a new tensor of the same shape
        assert_close(second(x), model(x))
    assert second.stats == {"loaded": 1, "compiled": 0, "torch.compile": 0}


def test_another_architecture_or_input_shape_compiles_its_own_entry(folder):
    x = _mixer().example_input(2)
    with torch.no_grad():
        _fast(_mixer(), folder)(x)
        entries = {p.name for p in (folder / "entries").glob("*.entry")}
        wider = _mixer(channel_hidden=48)
        fast = _fast(wider, folder)
        assert_close(fast(x), wider(x))
        assert fast.stats["compiled"] == 1, "another architecture misses"
        model = _mixer()
        fast = _fast(model, folder)
        y = model.example_input(3)  # another batch: the guard sends it to an entry of its own
        assert_close(fast(x), model(x))
        assert_close(fast(y), model(y))
        assert_close(fast(x.double().float()), model(x))  # the same signature again: this process's program
        assert fast.stats == {"loaded": 1, "compiled": 1, "torch.compile": 0}
        relu = _mixer(activation="relu")
        fast = _fast(relu, folder)
        assert_close(fast(x), relu(x))
        assert fast.stats["compiled"] == 1, "another computation with the same weights' shapes misses"
        other_config = _fast(_mixer(), folder, mode="reduce-overhead")
        other_config(x)
        assert other_config.stats["compiled"] == 1, "another configuration misses"
    assert len({p.name for p in (folder / "entries").glob("*.entry")} - entries) == 4


def test_a_damaged_entry_is_refused_with_one_warning_and_rebuilt(tmp_path):
    x = _mixer().example_input(2)
    with torch.no_grad():
        _fast(_mixer(), tmp_path)(x)
        (entry,) = (tmp_path / "entries").glob("*.entry")
        entry.write_bytes(entry.read_bytes()[:-100])  # torn
        forget_warnings()
        model = _mixer(seed=2)
        fast = _fast(model, tmp_path)
        with pytest.warns(UserWarning, match=r"compile cache entry .* is refused: .*payload bytes"):
            assert_close(fast(x), model(x))
    assert fast.stats["compiled"] == 1
    assert CacheFolder(tmp_path).check(entry.name.removesuffix(".entry")) is None, "rewritten whole"


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
            return self.linear(x)
        return -self.linear(x)


def test_what_export_refuses_and_a_cache_switched_off_run_through_torch_compile(folder):
    torch._dynamo.reset()
    forget_warnings()
    model = _Branchy().eval()
    x = torch.randn(4, 8)
    fast = _fast(model, folder, kernel_backend="aten")
    with torch.no_grad(), pytest.warns(UserWarning, match=r"_Branchy.forward cannot be exported \(torch.export: "):
        assert_close(fast(x), model(x))
    with torch.no_grad():
        assert_close(fast(-x.abs() - 1), model(-x.abs() - 1))
    assert fast.stats == {"loaded": 0, "compiled": 0, "torch.compile": 1}  # one signature; Dynamo guards the rest
    mixer = _mixer()
    off = airgraph.cache_compile(mixer, config=make_config(compile_cache=False, kernel_backend="aten"))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(off(mixer.example_input(2)), mixer(mixer.example_input(2)))
    assert off.stats == {"loaded": 0, "compiled": 0, "torch.compile": 1}


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("offset", torch.full((4,), 0.25))

    def step(self, x: torch.Tensor, *, scale: torch.Tensor, shift: float = 0.0) -> dict[str, torch.Tensor]:
        y = self.linear(x) * scale + self.offset + shift
        return {"y": y, "sum": y.sum(-1)}


def test_a_method_keyword_arguments_and_a_dict_output(folder):
    model = _Scaled().eval()
    x, scale = torch.randn(3, 8), torch.randn(3, 1)
    with torch.no_grad():
        fast = _fast(model.step, folder)
        expected = model.step(x, scale=scale, shift=1.5)
        assert_close(fast(x, scale=scale, shift=1.5), expected)
        assert_close(fast(x, shift=1.5, scale=scale), expected)  # keywords in another order: the same entry
        assert fast.stats["compiled"] == 1 and len(fast._loaded) == 1
        assert_close(fast(x, scale=scale, shift=-1.0), model.step(x, scale=scale, shift=-1.0))  # another value
        model.offset.fill_(3.0)  # a buffer is an input too
        assert_close(fast(x, scale=scale, shift=1.5), model.step(x, scale=scale, shift=1.5))
    assert fast.stats["compiled"] == 2


def test_decode_steps_write_their_kv_cache_like_eager(folder):
    """The KV cache is a buffer the step writes in place: the package's writes reach the module's own buffers."""
    from airgraph.models import build_tiny_llama, decode_inputs

    model, reference = build_tiny_llama("micro"), build_tiny_llama("micro")
    fast = _fast(model, folder)
    with torch.no_grad():
        for pos in range(4, 8):
            tokens, input_pos = decode_inputs(model.config, 1, pos, seed=pos)
            assert_close(fast(tokens, input_pos), reference(tokens, input_pos))
    assert fast.stats["compiled"] + fast.stats["loaded"] == 1, "every position is one signature"
    for ours, theirs in zip(model.buffers(), reference.buffers(), strict=True):
        assert_close(ours, theirs)


def test_autograd_frozen_parameters_and_what_is_not_a_module_are_refused(folder):
    model = _mixer()
    x = model.example_input(2)
    with pytest.raises(RuntimeError, match=r"runs inference only.*torch.no_grad\(\)"):
        _fast(model, folder)(x)
    with pytest.raises(TypeError, match=r"neither an nn.Module nor a bound method of one"):
        airgraph.cache_compile(lambda t: t)
    with pytest.raises(ValueError, match=r"turn config.frozen_parameters off"):
        _fast(model, folder, frozen_parameters=True)
    with torch.no_grad(), pytest.raises(TypeError, match=r"an input of type object is neither a tensor"):
        _fast(_Scaled().step, folder)(x, scale=object())


@pytest.mark.slow
def test_a_hugging_face_model_loads_with_its_cache_output(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        _fast(model, tmp_path)(ids)
        fast = _fast(model, tmp_path)
        out = fast(ids)
    assert fast.stats == {"loaded": 1, "compiled": 0, "torch.compile": 0}
    assert type(out) is type(expected)
    assert_close(out.logits, expected.logits)
    for layer, expected_layer in zip(out.past_key_values.layers, expected.past_key_values.layers, strict=True):
        assert_close(layer.keys, expected_layer.keys)
        assert_close(layer.values, expected_layer.values)


def test_torchair_cache_compile_names_the_cache_folder(tmp_path):
    from airgraph.compat import torchair as tng

    model = _mixer()
    x = model.example_input(2)
    fast = tng.inference.cache_compile(model.forward, config=tng.CompilerConfig(), cache_dir=str(tmp_path))
    with torch.no_grad():
        assert_close(fast(x), model(x))
    assert fast.stats["compiled"] == 1 and len(list((tmp_path / "entries").glob("*.entry"))) == 1
    with pytest.raises(TypeError, match=r"backend str is not airgraph's"):
        tng.inference.cache_compile(model.forward, backend="inductor")


@pytest.mark.cuda
def test_a_fresh_process_on_cuda_loads_the_package():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert _worker(env, "--device", "cuda")["stats"]["compiled"] == 1
    second = _worker(env, "--device", "cuda")
    assert second["stats"] == {"loaded": 1, "compiled": 0, "torch.compile": 0}
    assert not second["imported"]["torch._inductor.compile_fx"] and second["max_abs_diff"] < 1e-4
