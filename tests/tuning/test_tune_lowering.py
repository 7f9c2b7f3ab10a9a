"""A segment lowered with frozen weights compiles on its first call, outside the call's dispatch modes."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from airgraph.lowering.request import LowerRequest
from airgraph.tuning.lowering import lower_tuned
from tests.helpers import assert_close, make_config


class CallersMode(TorchDispatchMode):
    """Stands for AOTAutograd's first-call analysis mode (or a caller's own): every op through Python."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_frozen_segment_compiles_outside_the_calls_dispatch_modes():
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.linear(x, w).relu(),)

    x, w = torch.randn(4, 8), torch.randn(16, 8)
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(x), mode.from_tensor(w)]
    with mode:
        gm = make_fx(fn)(*fakes)
    seen: list[list] = []

    def lower(request: LowerRequest):
        seen.append(list(_get_current_dispatch_mode_stack()))
        return lambda args: request.gm(*args)

    request = LowerRequest(gm, fakes, "inference", torch.device("cpu"), make_config(), options={"frozen": [1]})
    segment = lower_tuned(request, lower, inductor=False)
    with CallersMode():
        (out,) = segment([x, w])
    assert_close(out, fn(x, w)[0])
    assert seen == [[]]  # compiled once, with no mode active
