"""Property test: random DAGs of small ops under random stream scopes with valid record/wait patterns equal eager."""

from __future__ import annotations

import contextlib

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from airgraph import ops, scope
from tests.helpers import assert_close, compile_with

UNARY = [torch.sin, torch.relu, lambda t: t * 1.5, lambda t: t.t(), torch.tanh]
BINARY = [torch.add, torch.mul, torch.mm]
TAGS = [None, "a", "b"]

# One step: (scope tag index, op kind, operand picks, event action): event action 0 none, 1 record, 2 wait.
step = st.tuples(st.integers(0, 2), st.integers(0, 7), st.integers(0, 40), st.integers(0, 40), st.integers(0, 2))


def build(steps):
    events = [ops.create_tagged_event(f"e{i}") for i in range(len(steps))]

    def program(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x, y]
        recorded: list[int] = []
        for index, (tag_index, kind, i, j, action) in enumerate(steps):
            tag = TAGS[tag_index]
            a, b = values[i % len(values)], values[j % len(values)]

            with contextlib.nullcontext() if tag is None else scope.stream_switch(tag):
                if action == 2 and recorded:  # wait on an event recorded earlier
                    ops.tagged_event_wait(events[recorded[j % len(recorded)]])
                out = BINARY[kind - 5](a, b) if kind >= 5 else UNARY[kind](a)
                values.append(out)
                if action == 1:
                    ops.tagged_event_record(events[index])
                    recorded.append(index)
                if kind == 0:
                    ops.record_tagged_stream(out, "b")
        return tuple(values[2:])

    return program


def expected_streams(steps) -> tuple[list[str | None], list[tuple[str, str | None, str | None]]]:
    """What the streams pass must find in ``build(steps)``: each step's op on its scope's stream, in order, and one
    event edge (event tag, recording stream, waiting stream) per wait."""
    streams, edges, recorded = [], [], []
    for index, (tag_index, _, _, j, action) in enumerate(steps):
        if action == 2 and recorded:
            event = recorded[j % len(recorded)]
            edges.append((f"e{event}", TAGS[steps[event][0]], TAGS[tag_index]))
        streams.append(TAGS[tag_index])
        if action == 1:
            recorded.append(index)
    return streams, edges


@settings(max_examples=25, deadline=None)
@given(st.lists(step, min_size=1, max_size=8), st.sampled_from(["max-autotune", "reduce-overhead"]))
def test_random_stream_dags_match_eager_with_each_op_on_its_stream(steps, mode):
    torch._dynamo.reset()
    program = build(steps)
    x, y = torch.randn(4, 4) * 0.5, torch.randn(4, 4) * 0.5
    compiled, backend = compile_with(program, kernel_backend="aten", mode=mode, fullgraph=True)
    for got, want in zip(compiled(x, y), program(x, y), strict=True):
        assert_close(got, want)
    (report,) = backend.reports
    streams, edges = expected_streams(steps)
    ops = [n for n in report.nodes if n.target not in ("placeholder", "output") and "airgraph." not in n.target]
    assert [n.stream for n in ops] == streams
    assert [(e["tag"], e["record_stream"], e["wait_stream"]) for e in report.events] == edges
