"""Run a model eagerly and with airgraph on the same inputs and weights, and compare outputs and gradients.

Each run gets its own copy of the model (``copy.deepcopy``) and of the inputs, so a buffer updated in place (a KV
cache) or an input written by the model does not leak from one run into the other; the caller's model is not run.
The compiled copy runs as often as the config needs to reach its steady state (reduce-overhead: warm-up, then a
captured replay; tuning: the tuning run, then the tuned one), its parameters and buffers restored in place before
each call, so every call starts from the state eager started from. Copies stay on the device of what they copy
(precision/device.py). With autograd on (an output requires grad),
both runs go backward from the same seeded output gradients, and every parameter's and input's gradient is
compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_map

from airgraph.precision.device import RunDevice
from airgraph.precision.tolerance import TensorDiff, diff, tolerance_for

__all__ = ["Outcome", "compare_runs", "compiled_calls"]


@dataclass
class Outcome:
    """What one run produced: its outputs (flattened, named) and its gradients (named)."""

    outputs: dict[str, Any]
    grads: dict[str, torch.Tensor]


def compiled_calls(config: Any) -> int:
    """Calls that reach the config's steady state (see the module docstring)."""
    calls = 1
    if config.mode == "reduce-overhead":
        calls = config.reduce_overhead.warmup_iters + 2
    if config.tuning.mode:
        calls = max(calls, 2)
    return calls


def _fresh_inputs(inputs: Any, device: RunDevice) -> Any:
    def fresh(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return device.copy_tensor(value, value.detach().clone().requires_grad_(value.requires_grad))
        return value

    return tree_map(fresh, inputs)


def _state(model: Any) -> dict[str, torch.Tensor]:
    if not isinstance(model, torch.nn.Module):
        return {}
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def run_once(
    fn: Callable[..., Any],
    model: Any,
    inputs: tuple,
    kwargs: dict,
    grad_seed: int,
    device: RunDevice,
    call: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Outcome:
    """Call ``fn`` (under ``call()``) on fresh copies of the inputs and, when an output requires grad, go
    backward."""
    args, kwargs = _fresh_inputs((inputs, kwargs), device)
    with call():
        result = fn(*args, **kwargs)
    leaves, _ = tree_flatten_with_path(result)
    outputs = {f"output{keystr(path)}": value for path, value in leaves}
    grads: dict[str, torch.Tensor] = {}
    needs = [v for v in outputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    if needs:
        generator = torch.Generator().manual_seed(grad_seed)
        seeds = [torch.randn(v.shape, generator=generator).to(v.device, v.dtype) for v in needs]
        with call():
            torch.autograd.backward(needs, seeds)
        for name, param in _state(model).items():
            if isinstance(param, torch.nn.Parameter) and param.grad is not None:
                grads[f"grad {name}"] = param.grad.detach().clone()
        arg_leaves, _ = tree_flatten_with_path((args, kwargs))
        for path, value in arg_leaves:
            if isinstance(value, torch.Tensor) and value.grad is not None:
                grads[f"grad input{keystr(path)}"] = value.grad.detach().clone()
    return Outcome({k: _detached(v) for k, v in outputs.items()}, grads)


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def compare_runs(
    model: Any,
    inputs: tuple,
    kwargs: dict,
    compile_fn: Callable[[Any], Callable[..., Any]],
    calls: int,
    *,
    rtol: float | None,
    atol: float | None,
    grad_seed: int = 0,
    device: RunDevice | None = None,
) -> tuple[Outcome, Outcome, list[TensorDiff]]:
    """Eager's and the compiled run's outcomes, and every output and gradient compared."""
    device = device or RunDevice()
    eager_model = device.copy_model(model)
    eager = run_once(eager_model, eager_model, inputs, kwargs, grad_seed, device)
    compiled_model = device.copy_model(model)
    state = {name: t.detach().clone() for name, t in _state(compiled_model).items()}
    compiled_fn = compile_fn(compiled_model)
    compiled = None
    for _ in range(calls):
        compiled = None  # let the last call's outputs go: a replay would otherwise find them held and run uncaptured
        with torch.no_grad():
            for name, tensor in _state(compiled_model).items():
                tensor.copy_(state[name])
                tensor.grad = None
        compiled = run_once(compiled_fn, compiled_model, inputs, kwargs, grad_seed, device, device.call)
    assert compiled is not None
    diffs = [*compare_values(eager.outputs, compiled.outputs, "output", rtol, atol)]
    diffs += compare_values(eager.grads, compiled.grads, "grad", rtol, atol)
    return eager, compiled, diffs


def compare_values(
    eager: dict[str, Any], compiled: dict[str, Any], kind: str, rtol: float | None, atol: float | None
) -> list[TensorDiff]:
    """Each named value of eager's against the compiled one of the same name."""
    diffs = []
    for name, expected in eager.items():
        actual = compiled.get(name)
        if isinstance(expected, torch.Tensor):
            tolerance = tolerance_for(expected.dtype, rtol, atol)
            if not isinstance(actual, torch.Tensor):
                note = f"compiled gave {type(actual).__name__}"
                shape, dtype = tuple(expected.shape), str(expected.dtype).removeprefix("torch.")
                diffs.append(TensorDiff(name, kind, shape, dtype, float("inf"), float("inf"), tolerance, False, note))
            else:
                diffs.append(diff(name, kind, expected, actual, tolerance))
        elif expected != actual:
            tolerance = tolerance_for(torch.int64, rtol, atol)
            note = f"compiled gave {actual!r} where eager gave {expected!r}"
            diffs.append(TensorDiff(name, kind, (), type(expected).__name__, 0.0, 0.0, tolerance, False, note))
    return diffs
