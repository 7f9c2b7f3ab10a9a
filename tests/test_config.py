import copy

import pytest

import airgraph
from airgraph.config import CompilerConfig


def test_defaults_and_readable_forms():
    config = CompilerConfig()
    assert config.mode == "max-autotune"
    assert config.kernel_backend == "inductor"
    assert config.reduce_overhead.capture_limit == 64
    assert config.debug.run_eagerly is False and config.debug.graph_dump is None
    as_dict = config.as_dict()
    assert as_dict["mode"] == "max-autotune"
    assert as_dict["passes"] == {
        "streams": True,
        "concat_linear": True,
        "host_placement": True,
        "dead_code_elimination": True,
        "remove_noops": True,
        "fallback": True,
    }
    assert as_dict["fallback"] == {"aten_nodes": (), "keep_ops": (), "pass_nodes": ()}
    assert config.frozen_parameters is False
    assert as_dict["export"]["experimental"]["enable_record_nn_module_stack"] is False
    text = repr(config)
    assert "mode = 'max-autotune'" in text and "reduce_overhead:" in text and "capture_limit = 64" in text


def test_assignment_and_round_trip():
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.kernel_backend = "aten"
    config.reduce_overhead.capture_limit = 3
    config.debug.graph_dump = "/tmp/x"
    other = CompilerConfig()
    other.update(config.as_dict())
    assert other == config
    assert other.as_dict()["reduce_overhead"]["capture_limit"] == 3


def test_deepcopy_is_independent():
    config = CompilerConfig()
    clone = copy.deepcopy(config)
    clone.debug.run_eagerly = True
    clone.mode = "reduce-overhead"
    assert config.debug.run_eagerly is False and config.mode == "max-autotune"


def test_bad_choice_names_option_value_and_allowed_values():
    config = CompilerConfig()
    with pytest.raises(
        ValueError, match=r"CompilerConfig\.mode: invalid value 'fast'.*'max-autotune', 'reduce-overhead'"
    ):
        config.mode = "fast"
    with pytest.raises(ValueError, match=r"kernel_backend: invalid value 'triton'.*'inductor', 'aten'"):
        config.kernel_backend = "triton"


@pytest.mark.parametrize(
    ("group", "name", "value", "pattern"),
    [
        ("reduce_overhead", "capture_limit", 0, r"capture_limit: invalid value 0 \(must be >= 1\)"),
        ("reduce_overhead", "capture_limit", 2.5, r"capture_limit: invalid value 2.5 \(got float\)"),
        ("reduce_overhead", "warmup_iters", True, r"warmup_iters: invalid value True \(a bool is not accepted"),
        ("debug", "run_eagerly", 1, r"run_eagerly: invalid value 1 \(got int\); allowed values: bool"),
        ("debug", "graph_dump", 3, r"graph_dump: invalid value 3.*a folder path \(str\) or None"),
        ("passes", "remove_noops", "yes", r"remove_noops: invalid value 'yes'"),
    ],
)
def test_bad_values_raise_value_error(group, name, value, pattern):
    config = CompilerConfig()
    with pytest.raises(ValueError, match=pattern):
        setattr(getattr(config, group), name, value)


def test_unknown_option_suggests_nearest_name():
    config = CompilerConfig()
    with pytest.raises(AttributeError, match=r"has no option 'mdoe'; did you mean 'mode'\?"):
        config.mdoe = "reduce-overhead"
    with pytest.raises(
        AttributeError, match=r"CompilerConfig\.debug has no option 'run_eagrly'; did you mean 'run_eagerly'"
    ):
        config.debug.run_eagrly = True
    with pytest.raises(AttributeError, match=r"did you mean 'capture_limit'"):
        _ = config.reduce_overhead.capture_limt
    with pytest.raises(AttributeError, match="is an option group"):
        config.debug = None


def test_update_rejects_bad_nested_values():
    config = CompilerConfig()
    with pytest.raises(ValueError, match="is an option group; give it a dict"):
        config.update({"debug": True})
    with pytest.raises(ValueError, match="capture_limit"):
        config.update({"reduce_overhead": {"capture_limit": -1}})


def test_environment_variables_are_read_in_config(monkeypatch):
    monkeypatch.setenv("AIRGRAPH_MODE", "reduce-overhead")
    monkeypatch.setenv("AIRGRAPH_RUN_EAGERLY", "1")
    config = CompilerConfig()
    assert config.mode == "reduce-overhead" and config.debug.run_eagerly is True
    monkeypatch.setenv("AIRGRAPH_MODE", "warp-speed")
    with pytest.raises(ValueError, match=r"CompilerConfig\.mode: invalid value 'warp-speed'"):
        CompilerConfig()


def test_describe_documents_every_option():
    docs = CompilerConfig().describe()
    assert "reduce_overhead.capture_limit" in docs and "Default: 64" in docs["reduce_overhead.capture_limit"]
    assert all(doc for doc in docs.values())


def test_get_backend_rejects_non_config():
    with pytest.raises(TypeError, match=r"compiler_config must be an airgraph\.CompilerConfig, not dict"):
        airgraph.get_backend({"mode": "reduce-overhead"})


def test_backend_keeps_its_own_copy():
    config = CompilerConfig()
    backend = airgraph.get_backend(config)
    config.mode = "reduce-overhead"
    assert backend.config.mode == "max-autotune"


def test_tuning_options_their_aliases_and_environment(monkeypatch):
    monkeypatch.delenv("AIRGRAPH_TUNE_BANK")  # the test session's bank and locks (tests/conftest.py)
    monkeypatch.delenv("AIRGRAPH_TUNE_LOCK_DIR")
    config = CompilerConfig()
    assert config.as_dict()["tuning"] == {
        "mode": None,
        "bank_dir": None,
        "work_path": None,
        "ops": None,
        "repeat": False,
        "use_bank": True,
        "budget_s": 6.0,
        "subgraph_budget_s": 30.0,
        "lock_dir": None,
        "lock_timeout_s": 600.0,
    }
    config.tuning.mode = "2"  # AOE's operator tuning
    assert config.tuning.mode == "op"
    config.tuning.mode = "1"
    assert config.tuning.mode == "subgraph"
    config.tuning.ops = "addmm, mlp.0/mm"
    assert config.tuning.ops == ("addmm", "mlp.0/mm")
    config.tuning.budget_s = 2
    assert config.tuning.budget_s == 2.0
    with pytest.raises(ValueError, match=r"tuning\.mode: invalid value '3'; allowed values: None, 'op', 'subgraph'"):
        config.tuning.mode = "3"
    with pytest.raises(ValueError, match=r"tuning\.ops: invalid value \[1\] \(expected op types or node names"):
        config.tuning.ops = [1]
    with pytest.raises(ValueError, match=r"tuning\.budget_s: invalid value 0.0 \(must be > 0\)"):
        config.tuning.budget_s = 0
    with pytest.raises(ValueError, match=r"tuning\.lock_timeout_s: invalid value -1.0 \(must be > 0\)"):
        config.tuning.lock_timeout_s = -1
    monkeypatch.setenv("AIRGRAPH_TUNE_MODE", "2")
    monkeypatch.setenv("AIRGRAPH_TUNE_OPS", "bmm,gemm")
    monkeypatch.setenv("AIRGRAPH_TUNE_REPEAT", "true")
    monkeypatch.setenv("AIRGRAPH_WORK_PATH", "/tmp/aoe")
    monkeypatch.setenv("XDG_CACHE_HOME", "/tmp/cache-home")
    from_env = CompilerConfig().tuning
    assert (from_env.mode, from_env.ops, from_env.repeat, from_env.work_path) == (
        "op",
        ("bmm", "gemm"),
        True,
        "/tmp/aoe",
    )
    assert from_env.resolved_bank_dir() == "/tmp/cache-home/airgraph/tuning-bank"
    assert from_env.resolved_lock_dir() == "/tmp/cache-home/airgraph/device-locks"
    monkeypatch.setenv("AIRGRAPH_TUNE_BANK", "/tmp/bank")
    monkeypatch.setenv("AIRGRAPH_TUNE_LOCK_DIR", "/tmp/locks")
    assert CompilerConfig().tuning.resolved_bank_dir() == "/tmp/bank"
    assert CompilerConfig().tuning.resolved_lock_dir() == "/tmp/locks"
    monkeypatch.setenv("AIRGRAPH_TUNE_MODE", "warp")
    with pytest.raises(ValueError, match=r"tuning\.mode: invalid value 'warp'"):
        CompilerConfig()


def test_the_seeds_environment_for_the_torchair_backend(monkeypatch):
    from airgraph.config import torchair_tuning_environment

    assert torchair_tuning_environment() == {}
    monkeypatch.setenv("AOE_MODE", "1")
    monkeypatch.setenv("TUNE_BANK_PATH", "/home/user/custom_tune_bank")
    monkeypatch.setenv("REPEAT_TUNE", "False")
    monkeypatch.setenv("ASCEND_WORK_PATH", "/tmp/work")
    assert torchair_tuning_environment() == {
        "mode": "1",
        "bank_dir": "/home/user/custom_tune_bank",
        "work_path": "/tmp/work",
        "repeat": False,
    }


def test_the_kernel_backend_registry_is_the_one_list_of_allowed_values(monkeypatch):
    from airgraph.lowering import backends

    monkeypatch.setitem(backends.KERNEL_BACKENDS, "mine", backends._Entry(lambda request: None, True, "a test's"))
    config = CompilerConfig()
    config.kernel_backend = "mine"  # registered: allowed
    assert "'mine'" in config.describe()["kernel_backend"]
    with pytest.raises(ValueError, match="invalid value 'interpreter'"):  # registered, but chosen only by the seam
        config.kernel_backend = "interpreter"
    monkeypatch.delitem(backends.KERNEL_BACKENDS, "mine")
    with pytest.raises(ValueError, match=r"invalid value 'mine'.*allowed values: 'inductor', 'aten'"):
        config.kernel_backend = "mine"


def test_static_kernel_options_defaults_validation_and_environment(monkeypatch):
    config = CompilerConfig()
    assert config.as_dict()["static_kernels"] == {
        "enabled": False,
        "build_dir": None,
        "library_dir": None,
        "build": True,
        "local_world_size": None,
        "local_rank": None,
        "world_size": None,
    }
    with pytest.raises(ValueError, match=r"static_kernels\.build_dir: invalid value '' \(an empty path\)"):
        config.static_kernels.build_dir = ""
    with pytest.raises(ValueError, match=r"static_kernels\.local_world_size: invalid value 0 \(must be >= 1\)"):
        config.static_kernels.local_world_size = 0
    with pytest.raises(ValueError, match=r"static_kernels\.enabled: invalid value 'yes'"):
        config.static_kernels.enabled = "yes"
    monkeypatch.setenv("AIRGRAPH_STATIC_KERNELS", "1")
    monkeypatch.setenv("AIRGRAPH_STATIC_KERNELS_BUILD_DIR", "/tmp/kernels")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    options = CompilerConfig().static_kernels
    assert (options.enabled, options.build_dir, options.local_world_size, options.local_rank) == (
        True,
        "/tmp/kernels",
        4,
        3,
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(ValueError, match=r"environment variable LOCAL_WORLD_SIZE='four' is not an integer"):
        CompilerConfig()


def test_config_file_round_trip(tmp_path):
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.reduce_overhead.capture_sizes = [4, 1, 2]
    config.reduce_overhead.pad_values = {"attention_mask": 1}
    config.tuning.ops = ["addmm", "bmm"]
    config.fallback.keep_ops = ["aten.silu"]
    config.fallback.aten_nodes = "forward:addmm_1, mm"
    config.static_kernels.build_dir = None
    path = tmp_path / "airgraph.json"
    config.to_file(path)
    import json

    stored = json.loads(path.read_text())
    assert stored["reduce_overhead"]["capture_sizes"] == [1, 2, 4]
    assert stored["fallback"] == {"aten_nodes": ["forward:addmm_1", "mm"], "keep_ops": ["aten.silu"], "pass_nodes": []}
    loaded = CompilerConfig.from_file(path)
    assert loaded == config and loaded.fallback.aten_nodes == ("forward:addmm_1", "mm")
    assert CompilerConfig.from_dict(config.to_dict()) == config
    partial = tmp_path / "partial.json"
    partial.write_text('{"passes": {"concat_linear": false}}')
    only = CompilerConfig.from_file(partial)
    assert only.passes.concat_linear is False and only.mode == "max-autotune"


@pytest.mark.parametrize(
    "text, pattern",
    [
        ('{"mode": "warp"}', r"bad\.json: CompilerConfig\.mode: invalid value 'warp'; allowed values: 'max-autotune'"),
        (
            '{"passes": {"concat_lnear": false}}',
            r"bad\.json: CompilerConfig\.passes has no option 'concat_lnear'; "
            r"did you mean 'concat_linear'",
        ),
        (
            '{"fallback": {"keep_ops": ["silu"]}}',
            r"bad\.json: CompilerConfig\.fallback\.keep_ops: .*'silu' is not an "
            r"aten op name.*allowed values: a list of 'aten\.NAME'",
        ),
        ('{"passes": true}', r"bad\.json: CompilerConfig\.passes is an option group; give it a dict"),
        ("[1, 2]", r"bad\.json: expected a JSON object of options"),
        (
            '{"fallback": {"pass_nodes": ["mul"]}}',
            r"bad\.json: CompilerConfig\.fallback\.pass_nodes: .*'mul' is not 'pass:node'",
        ),
        ("{mode: 1", r"bad\.json: not JSON"),
    ],
)
def test_bad_config_file_is_refused_naming_file_key_and_allowed(tmp_path, text, pattern):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=pattern):
        CompilerConfig.from_file(path)
    with pytest.raises(ValueError, match=r"missing\.json: cannot be read"):
        CompilerConfig.from_file(tmp_path / "missing.json")


def test_airgraph_config_names_a_file_read_over_the_variables(tmp_path, monkeypatch):
    path = tmp_path / "airgraph.json"
    path.write_text('{"mode": "reduce-overhead", "fallback": {"keep_ops": "aten.silu,aten.gelu"}}')
    monkeypatch.setenv("AIRGRAPH_MODE", "max-autotune")
    monkeypatch.setenv("AIRGRAPH_RUN_EAGERLY", "1")
    monkeypatch.setenv("AIRGRAPH_CONFIG", str(path))
    config = CompilerConfig()
    assert config.mode == "reduce-overhead" and config.debug.run_eagerly is True
    assert config.fallback.keep_ops == ("aten.silu", "aten.gelu")
    path.write_text('{"mode": 3}')
    with pytest.raises(ValueError, match=r"airgraph\.json: CompilerConfig\.mode: invalid value 3"):
        CompilerConfig()
