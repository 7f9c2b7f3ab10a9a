"""The fast path: a call of a compiled model that goes straight to its compiled graph (``airgraph.compile(...,
fast_path=True)``), past Dynamo's guards and AOTAutograd's wrapper, which cost a decode step more than its replay.

Once a call signature has been seen, :class:`FastPath` calls the graph's own callable (the GraphCapture's fast
replayer, or the executor where nothing is captured) with the arguments Dynamo would have passed, and returns
what the model would have returned. The second call of a signature learns its route while it goes through
``torch.compile`` (:class:`Direct` graphs report their arguments and outputs).

Invariants: a route is made only when exactly one airgraph inference graph ran, its tensor arguments are the
call's tensors or the model's parameters and buffers, the model returned only graph outputs or call tensors, and
nothing outside the graph wrote them; otherwise the signature is refused for good. Every call checks what a
skipped guard would have caught (the signature, grad and inference mode, training flags, Dynamo's global state,
assignments to modules, moved parameters); a call that fails a check goes through ``torch.compile``. What it does
not check (Python state the forward reads besides its arguments, parameters and buffers; a parameter given
another layout at its address) is why it is opt-in: :meth:`FastPath.reset` after changing such state.
docs/design/fastpath.md has every rule and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C._dynamo.guards import GlobalStateGuard

from airgraph.boxed import boxed
from airgraph.runtime.keys import MISS

__all__ = ["MISS", "Direct", "FastPath"]

# The calls of Direct graphs seen while a FastPath learns a signature (None: nobody is learning).
_learning: list[_Seen] | None = None
# Counts parameter, buffer and submodule assignments in the process (registration hooks, installed once).
_assignments = [0]
_hooks_installed = False

_SCALARS = (int, float, bool, str, type(None))
_grad, _inference = torch.is_grad_enabled, torch.is_inference_mode_enabled
# On, Module._apply (model.to, .half, .cuda) puts new Parameter objects straight into the module's _parameters,
# where the registration hooks never see them
_overwrites_parameters = torch.__future__.get_overwrite_module_params_on_conversion
_Tensor = torch.Tensor
_increment_version = torch._C._increment_version  # torch.autograd.graph.increment_version, without its checks
# Dynamo's check of tensors against the type, dtype, device, sizes, strides, requires_grad and dispatch keys it was
# made from, in one C++ call, cheaper than a signature (docs/design/fastpath.md): how a call is matched to the last
# guarded route taken (FastPath.__call__). None where torch lacks it: then every call computes its signature.
_TensorGuards = getattr(torch._C._dynamo.guards, "TensorGuards", None)


@dataclass
class _Seen:
    direct: Direct
    args: list[Any]  # as the graph got them
    versions_before: list[int | None]
    versions_after: list[int | None]
    outputs: Any


def _versions(values: list[Any]) -> list[int | None]:
    return [v._version if isinstance(v, torch.Tensor) else None for v in values]


class Direct:
    """A compiled graph's boxed callable, as the backend returns it to AOTAutograd (or Dynamo), which a
    :class:`FastPath` may call directly. ``kind``: "inference", "forward" or "backward". A GraphCapture ``run`` gives
    the fast path a replayer per recorded key (``fast_replayer``), which returns :data:`MISS` for a call it must
    leave to ``torch.compile``; any other ``run`` is called as it is."""

    def __init__(self, run: Callable[[list], Any], kind: str) -> None:
        boxed(self)
        self.run, self.kind = run, kind

    def __call__(self, args: list) -> Any:
        if _learning is None:
            return self.run(args)
        seen = list(args)
        before = _versions(seen)
        outputs = self.run(args)
        _learning.append(_Seen(self, seen, before, _versions(seen), outputs))
        return outputs


def _count_assignment(*_: Any) -> None:
    # Not while Dynamo traces a forward that assigns a buffer (the counter would be a guarded global that changes
    # every call: a recompile per call). The assignment Dynamo replays after its graph runs this hook for real.
    if not torch.compiler.is_compiling():
        _assignments[0] += 1


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    from torch.nn.modules import module

    module.register_module_parameter_registration_hook(_count_assignment)
    module.register_module_buffer_registration_hook(_count_assignment)
    module.register_module_module_registration_hook(_count_assignment)
    _hooks_installed = True


def _signature(args: tuple, kwargs: dict, training: bool | None) -> tuple | None:
    """The call's signature: grad mode, inference mode, the parameter-overwriting flag, the model's ``training``
    flag, and per argument its tensor type and metadata or its value; None when an argument is neither a tensor nor
    a plain scalar (a nested structure, an object). (The rest of the global state: each route's GlobalStateGuard.)"""
    parts: list[Any] = [_grad(), _inference(), _overwrites_parameters(), training]
    add = parts.append
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, _Tensor):
            # (the conjugate and negative bits: a view whose value is not its bytes, which Dynamo's guards tell apart)
            add(
                (
                    type(value),
                    value.dtype,
                    value.shape,
                    value.stride(),
                    value.device,
                    value.requires_grad,
                    value.is_conj(),
                    value.is_neg(),
                )
            )
        elif isinstance(value, _SCALARS):
            add((type(value), value))
        else:
            return None
    if kwargs:
        parts.append(tuple(kwargs))
    return tuple(parts)


class _Route:
    """How one signature's call reaches its graph: the graph's arguments (statics in place, the call's tensors
    at ``slots``) and the model's result (``build``)."""

    def __init__(
        self,
        direct: Direct,
        template: list[Any],
        slots: list[tuple[int, int]],
        statics: list[int],
        bumps: list[int],
        build: Callable[[list, list], Any] | int,
        epoch: int,
        state: GlobalStateGuard,
    ) -> None:
        self.template, self.slots = template, slots
        self.slot_positions = {position for position, _ in slots}
        # A GraphCapture: its replayer of the recorded key, found on the first call (run: None until then)
        self.replayer = getattr(direct.run, "fast_replayer", None)
        self.run: Callable[[list], Any] | None = None if self.replayer is not None else direct.run
        # The model's result: the graph's output at ``pick`` (a decode step's logits), or made by ``build``
        self.pick, self.build = (build, None) if isinstance(build, int) else (None, build)
        self.epoch, self.state = epoch, state
        self.bumps = bumps  # graph inputs whose version AOTAutograd increments before the graph: so does the route
        static = set(statics)
        self.bumped = tuple(template[i] for i in bumps) if static.issuperset(bumps) else ()  # the same every call
        # Captured graphs check their static inputs' addresses themselves (GraphCapture.fast_replayer); other
        # graphs read whatever tensors they get, so the route checks them.
        self.checked = [] if self.replayer is not None else [(template[i], template[i].data_ptr()) for i in statics]
        # How a call of only tensor arguments is matched to this route without its signature (FastPath.__call__):
        # the signature's flags, the number of arguments and their TensorGuards (None: not for this route)
        self.flags: tuple = ()
        self.arity = 0
        self.guards: Any = None

    def __call__(self, values: list[Any]) -> Any:
        if self.epoch != _assignments[0] or not self.state.check():
            return MISS
        for tensor, ptr in self.checked:
            if tensor.data_ptr() != ptr:
                return MISS
        args = self.template.copy()
        for position, index in self.slots:
            args[position] = values[index]
        bumped = (self.bumped or tuple(args[i] for i in self.bumps)) if self.bumps else ()  # the call empties args
        run = self.run
        if run is None:
            run = self.run = self.replayer(args, self.slot_positions)  # type: ignore[misc]
            if run is None:  # not recorded yet
                return MISS
        outputs = run(args)
        if outputs is MISS:
            return MISS
        if bumped:  # only for a call that ran: a missed one goes through AOTAutograd, which bumps them itself
            _increment_version(bumped)
        pick = self.pick
        return outputs[pick] if pick is not None else self.build(outputs, values)  # type: ignore[operator]


class FastPath:
    """``model`` compiled by ``compiled`` (``torch.compile`` with airgraph's backend, built to wrap its graphs in
    :class:`Direct`), called through routes (module docstring). ``refused``: signature -> why it has no route."""

    def __init__(self, model: Any, compiled: Callable[..., Any]) -> None:
        _install_hooks()
        self.model, self.compiled = model, compiled
        self._module = model if isinstance(model, torch.nn.Module) else None  # its training flag: in the signature
        self.backend: Any = None  # the AirgraphBackend (airgraph.compile sets it)
        self._routes: dict[tuple, _Route] = {}
        self.refused: dict[tuple, str] = {}
        self._seen: set[tuple] = set()  # signatures called once (the next call learns)
        self._last: _Route | None = None  # the last route with guards that a call took
        self.fast_calls = 0  # calls that took a route (tests, benchmarks)

    def reset(self) -> None:
        """Forget every route (after changing Python state the forward reads)."""
        self._forget_routes()
        self.refused.clear()
        self._seen.clear()

    def _forget_routes(self) -> None:
        self._routes.clear()
        self._last = None

    @property
    def routes(self) -> int:
        return len(self._routes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        training = self._module.training if self._module is not None else None
        last, missed = self._last, None
        # A call that passes the last guarded route's checks has that route's signature (the guards are stricter:
        # they also compare dispatch keys), found without computing this call's: the same flags, tensors passing
        # the route's guards
        if (
            last is not None
            and not kwargs
            and len(args) == last.arity
            and (_grad(), _inference(), _overwrites_parameters(), training) == last.flags
            and last.guards.check(*args)
        ):
            result = last(args)
            if result is not MISS:
                self.fast_calls += 1
                return result
            missed = last
        signature = _signature(args, kwargs, training)
        route = self._routes.get(signature) if signature is not None else None
        if route is not None:
            if route is not missed:  # (a route that missed would miss again)
                result = route((*args, *kwargs.values()) if kwargs else args)
                if result is not MISS:
                    self.fast_calls += 1
                    if route.guards is not None:
                        self._last = route
                    return result
            if route.epoch != _assignments[0]:
                self._forget_routes()  # a parameter, buffer or submodule was assigned somewhere: learn again
        if _overwrites_parameters():  # parameters may be replaced unseen: no route now, none kept from before
            self._forget_routes()
            return self.compiled(*args, **kwargs)
        if signature is None or signature in self.refused:
            return self.compiled(*args, **kwargs)
        if signature not in self._seen:
            self._seen.add(signature)
            return self.compiled(*args, **kwargs)
        return self._learn(signature, args, kwargs)

    def _learn(self, signature: tuple, args: tuple, kwargs: dict) -> Any:
        global _learning
        values = [*args, *kwargs.values()]
        statics = self._statics()
        watched = [v for v in values if isinstance(v, torch.Tensor)] + list(statics.values())
        before = _versions(watched)
        epoch, state = _assignments[0], GlobalStateGuard()
        guards = None  # made from the tensors as the signature saw them, before the call
        if _TensorGuards is not None and not kwargs and all(type(a) is torch.Tensor for a in args):
            sizes, strides = [list(a.shape) for a in args], [list(a.stride()) for a in args]
            guards = _TensorGuards(*args, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        previous, _learning = _learning, []
        seen = _learning
        try:
            result = self.compiled(*args, **kwargs)
        finally:
            _learning = previous
        after = _versions(watched)
        route = _route(seen, values, statics, result, (watched, before, after), epoch, state)
        training = self._module.training if self._module is not None else None
        if not isinstance(route, str) and _signature(args, kwargs, training) != signature:
            # (x.requires_grad_(), a flag switched: no version counts it, and a route would skip it)
            route = "the call changed an argument's metadata or a flag of its signature (the forward's side effect)"
        if isinstance(route, str):
            self.refused[signature] = route
        elif epoch == _assignments[0]:
            self._routes[signature] = route
            self._last = None  # it may be the route this one replaces: the last route is one of the routes
            if guards is not None:
                route.flags, route.arity, route.guards = signature[:4], len(args), guards
        return result

    def _statics(self) -> dict[int, torch.Tensor]:
        if not isinstance(self.model, torch.nn.Module):
            return {}
        return {id(t): t for t in (*self.model.parameters(), *self.model.buffers())}


def _route(
    seen: list[_Seen],
    values: list[Any],
    statics: dict[int, torch.Tensor],
    result: Any,
    versions: tuple[list, list, list],
    epoch: int,
    state: GlobalStateGuard,
) -> _Route | str:
    """The route for a call that ran ``seen`` (module docstring's conditions), or why there is none."""
    if len(seen) != 1:
        return f"{len(seen)} compiled graphs ran in one call (graph breaks?): the fast path takes calls of one graph"
    (call,) = seen
    if call.direct.kind != "inference":
        return f"a {call.direct.kind} graph (autograd) runs through AOTAutograd"
    by_id = {id(v): i for i, v in enumerate(values) if isinstance(v, torch.Tensor)}
    template: list[Any] = list(call.args)
    slots, static_positions = [], []
    for position, arg in enumerate(call.args):
        if not isinstance(arg, torch.Tensor):
            continue  # a size: the same for every call of this signature
        if id(arg) in by_id:
            slots.append((position, by_id[id(arg)]))
            template[position] = None
        elif id(arg) in statics:
            static_positions.append(position)
        else:
            return f"graph input {position} is neither an argument nor a parameter or buffer of the model"
    bumps = []
    watched, before, after = versions
    for t, b, a in zip(watched, before, after, strict=True):
        graph_pos = next((i for i, arg in enumerate(call.args) if arg is t), None)
        if graph_pos is None:
            if a != b:
                return "a tensor of the call was written outside the compiled graph"
            continue
        if call.versions_after[graph_pos] != a:
            return f"graph input {graph_pos} was written after the compiled graph (an input mutation applied after it)"
        ahead = call.versions_before[graph_pos] - b
        if ahead == 1:  # AOTAutograd marks an input its graph writes (Inductor's kernels write memory unseen)
            bumps.append(graph_pos)
        elif ahead:
            return f"graph input {graph_pos} was written before the compiled graph"
    build = _builder(result, call.outputs, by_id)
    if isinstance(build, str):
        return build
    return _Route(call.direct, template, slots, static_positions, bumps, build, epoch, state)


def _builder(result: Any, outputs: Any, by_id: dict[int, int]) -> Callable[[list, list], Any] | int | str:
    """How to make the model's result from the graph's outputs and the call's values (the position of the output
    that is the result, or a callable), or why it cannot."""
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    out_ids = {id(o): j for j, o in enumerate(outputs) if isinstance(o, torch.Tensor)}
    leaves, spec = pytree.tree_flatten(result)
    plan: list[tuple[str, Any]] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in out_ids:
                plan.append(("out", out_ids[id(leaf)]))
            elif id(leaf) in by_id:
                plan.append(("arg", by_id[id(leaf)]))
            else:
                return "the model returned a tensor that is not an output of its graph (made outside the graph)"
        elif isinstance(leaf, _SCALARS):
            plan.append(("constant", leaf))
        else:
            return f"the model returned a {type(leaf).__name__}"
    if isinstance(result, torch.Tensor) and plan[0][0] == "out":
        return plan[0][1]
    flat = type(result) in (tuple, list) and len(result) == len(leaves)  # no nesting: each element a leaf
    if flat and all(kind == "out" for kind, _ in plan):
        picks, kind_of = [j for _, j in plan], type(result)
        return lambda outs, values: kind_of(outs[j] for j in picks)

    def build(outs: list, values: list) -> Any:
        made = [outs[x] if kind == "out" else values[x] if kind == "arg" else x for kind, x in plan]
        return pytree.tree_unflatten(made, spec)

    return build
