"""The seed's multi-stream example model (TorchAir's, with the NPU device dropped), parameterized by API."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from airgraph import ops, scope

AIRGRAPH_API = SimpleNamespace(
    create_event=ops.create_tagged_event,
    record=ops.tagged_event_record,
    wait=ops.tagged_event_wait,
    record_stream=ops.record_tagged_stream,
    stream_switch=scope.stream_switch,
)


class SeedModel(torch.nn.Module):
    def __init__(self, api: SimpleNamespace = AIRGRAPH_API, size: int = 64) -> None:
        super().__init__()
        self.api = api
        self.size = size
        self.tagged_event1 = api.create_event(tag="66")
        self.tagged_event2 = api.create_event(tag="77")

    def forward(self, in1, in2, in3, in4):
        api = self.api
        add_result = torch.add(in1, in2)
        api.record(self.tagged_event1)
        with api.stream_switch("1"):
            api.wait(self.tagged_event1)
            mm_result = torch.mm(in3, in4)
            api.record(self.tagged_event2)
        B = in3 + in4
        api.record_stream(B, "1")
        mm1 = torch.mm(in3, in4)
        del B
        C = torch.ones(self.size, self.size, dtype=in1.dtype, device=in1.device)
        C.add_(2)
        with api.stream_switch("2"):
            api.wait(self.tagged_event2)
            add2 = torch.add(in3, in4)
        return add_result, mm_result, mm1, add2, C
