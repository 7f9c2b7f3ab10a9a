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
        "host_placement": True,
        "dead_code_elimination": True,
        "remove_noops": True,
    }
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
