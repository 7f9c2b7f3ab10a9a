"""The host cost of one reduce-overhead replay, measured on the CPU (issue #2's target: <= 20 us per replay).

On a GPU, ``benchmarks/llama_decode.py`` measures it directly. Without one, this script runs the tiny LLaMA
decode step through the same Python path with the device work taken out: the simulated runtime's graphs
(runtime/simulated.py) are replaced by graphs whose replay does nothing, so a call is Dynamo's guards,
AOTAutograd's wrapper, GraphCapture's key and address checks, the input copies into the static buffers
(here CPU copies of a few bytes; on a GPU, copy launches) and the output copy-out. Side by side in one
process, interleaved rounds:

- ``airgraph replay``: the decode step compiled in reduce-overhead, every call a (null) replay;
- ``framework floor``: the same Dynamo graph with an AOTAutograd compiler that returns precomputed outputs,
  i.e. what any backend pays before its own first line runs;
- ``airgraph fast path``: ``airgraph.compile(..., fast_path=True)`` (issue #19): the recorded key called past
  Dynamo and AOTAutograd, its output handed over without a copy;
- ``airgraph fast path, static inputs``: the same, called with input buffers marked static
  (``torch._dynamo.mark_static_address``): the graph reads them in place, no input copy per call.

``airgraph replay - framework floor`` is GraphCapture's own cost per replay (with the floor's AOTAutograd told to
keep the KV caches' in-place updates in the graph, as airgraph's backend does: otherwise the floor pays copies
airgraph does not); ``graph_capture_alone_us`` times the GraphCapture called by itself, the same cost without
the noise of a difference. A GPU adds the launches of the
input copies, the graph and the output copy (a few microseconds each) on top.

    python benchmarks/replay_host_cost.py [--preset tiny] [--calls 2000] [--rounds 9] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

import airgraph
from airgraph.backend import AirgraphBackend
from airgraph.bench.results import environment, write_json
from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs
from airgraph.runtime.simulated import SimulatedCuda


class _NullGraph:
    def replay(self) -> None:
        pass


class NullReplay(SimulatedCuda):
    """The simulated runtime whose recorded graphs do no work when replayed (outputs stay as recorded), and
    whose copies are plain copies, as CUDA's (the simulator's race checks are not measured). Its graphs cannot fill
    their own input buffers (in-graph input copies cost CUDA driver calls this proxy has no stand-in for)."""

    can_feed = False

    def capture(self, fn: Any, args: list, *, pool: Any, stream: Any, device: Any, fed: Any = ()) -> tuple:
        return _NullGraph(), fn(list(args))  # (fed: always empty, as it cannot feed)

    def copy_(self, dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None:  # no race checks
        dst.copy_(src)

    def replay(self, graph: Any, recorded: list, args: list) -> None:  # as CUDA's: nothing to bind
        graph.replay()

    def copy_many(self, dsts: Any, srcs: Any) -> None:
        torch._foreach_copy_(dsts, srcs)

    def reading(self, values: Any) -> None:
        pass


def _floor_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
    def compiler(graph: torch.fx.GraphModule, inputs: list) -> Any:
        first: list = []  # the first call's outputs (the compiler sees fake inputs), returned every call

        def run(*args: Any) -> list:
            if not first:
                first.append(graph(*args))
            return list(first[0])

        return make_boxed_func(run)

    # In-place updates of inputs (the KV caches) stay in the graph, as airgraph's backend keeps them: without it
    # AOTAutograd copies every mutated cache back after the graph, a cost airgraph does not pay.
    return aot_autograd(fw_compiler=compiler, inference_compiler=compiler, keep_inference_input_mutations=True)(
        gm, example_inputs
    )


def per_call_us(
    fns: dict[str, Any], args: tuple, calls: int, rounds: int, sync: Any = lambda: None
) -> dict[str, float]:
    """Per callable, the median us per call of ``fn(*args)`` over ``rounds`` bursts of ``calls`` calls, the
    callables' bursts interleaved; ``sync`` (a device's synchronize) runs before each burst, outside its time."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def capture_and_key(fast: Any, tokens: torch.Tensor, pos: torch.Tensor) -> tuple[Any, Any, list]:
    """The GraphCapture behind the fast path ``fast``'s one route, its recorded key, and the graph's arguments for
    a call with ``tokens`` and ``pos``."""
    (route,) = fast._routes.values()
    args = route.template.copy()
    for position, index in route.slots:
        args[position] = (tokens, pos)[index]
    return route.replayer.__self__, route.run.key, args


def _loop_us(fn: Any, calls: int) -> float:
    """Microseconds per call of ``fn()`` over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _address_check_us(fast: Any, tokens: torch.Tensor, pos: torch.Tensor, calls: int) -> float:
    capture, entry, args = capture_and_key(fast, tokens, pos)
    return _loop_us(lambda: capture._static_moved(args, entry), calls)


def _capture_alone_us(fast: Any, tokens: torch.Tensor, pos: torch.Tensor, calls: int) -> float:
    """One call of the GraphCapture itself (key, address check, replay), as AOTAutograd makes it: what airgraph
    adds to a call through torch.compile, without the noise of a difference of two whole calls."""
    capture, _, args = capture_and_key(fast, tokens, pos)
    return _loop_us(lambda: capture(list(args)), calls)


def _static_count(fast: Any) -> int:
    return len(next(iter(fast._routes.values())).run.key.static_checked)


def run(preset: str, calls: int, rounds: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    model = build_tiny_llama(preset, seed=0)
    config = airgraph.CompilerConfig()
    config.mode, config.kernel_backend = "reduce-overhead", "aten"
    backend = AirgraphBackend(config, runtime=NullReplay())
    step = torch.compile(model, backend=backend, fullgraph=True)
    fast = airgraph.compile(model, config, fast_path=True, runtime=NullReplay(), fullgraph=True)
    floor = torch.compile(model, backend=_floor_backend, fullgraph=True)
    # The fast path given input buffers marked static (torch._dynamo.mark_static_address), which the caller
    # refills in place: the graph reads them where they are, no input copy per call
    fast_static = airgraph.compile(model, config, fast_path=True, runtime=NullReplay(), fullgraph=True)
    with torch.no_grad():
        model(*prefill_inputs(model.config, 1, 8))
        tokens, pos = decode_inputs(model.config, 1, 8)
        static_inputs = (tokens.clone(), pos.clone())
        for buffer in static_inputs:
            torch._dynamo.mark_static_address(buffer)
        for _ in range(5):  # warm-up, record, replays
            step(tokens, pos)
            floor(tokens, pos)
            fast(tokens, pos)
            fast_static(*static_inputs)
        assert backend.reports[0].captured, backend.reports[0].uncaptured_reason
        assert fast.routes == 1 and not fast.refused, fast.refused
        assert fast_static.routes == 1 and not capture_and_key(fast_static, *static_inputs)[1].copy_indices
        variants = {
            "airgraph_replay": step,
            "framework_floor": floor,
            "airgraph_fast_path": fast,
            "airgraph_fast_path_static_inputs": lambda *_: fast_static(*static_inputs),
        }
        times = per_call_us(variants, (tokens, pos), calls, rounds)
        check_us = _address_check_us(fast, tokens, pos, calls)
        alone_us = statistics.median(_capture_alone_us(fast, tokens, pos, calls) for _ in range(rounds))
    times = {name: round(value, 2) for name, value in times.items()}
    return {
        **environment(torch.device("cpu")),
        "benchmark": "replay_host_cost",
        "settings": {"preset": preset, "calls": calls, "rounds": rounds, "kernel_backend": "aten", "threads": 1},
        "per_call_us": times,
        "graph_capture_us": round(times["airgraph_replay"] - times["framework_floor"], 2),
        "graph_capture_alone_us": round(alone_us, 2),
        # Of the fast path's cost: the per-call check that no parameter or buffer moved, one data_ptr() per tensor.
        # Python on CPU builds of torch (this machine), one C++ call in CUDA builds
        # (torch._C._tensors_data_ptrs_at_indices_equal), which costs the same: data_ptr() is the cost.
        "fast_path_address_check_us": round(check_us, 2),
        "static_inputs_checked": _static_count(fast),
        "target": "host cost of one replay <= 20 us (GPU: benchmarks/llama_decode.py); #19: a fast-path call <= 10 us",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", default="benchmarks/results/replay_host_cost_cpu.json")
    args = parser.parse_args(argv)
    result = run(args.preset, args.calls, args.rounds)
    times = result["per_call_us"]
    print(
        f"per call: airgraph replay {times['airgraph_replay']:.1f} us, framework floor "
        f"{times['framework_floor']:.1f} us -> GraphCapture {result['graph_capture_us']:.1f} us (called alone "
        f"{result['graph_capture_alone_us']:.1f} us); fast path "
        f"{times['airgraph_fast_path']:.1f} us (address check {result['fast_path_address_check_us']:.1f} us), "
        f"with static input buffers {times['airgraph_fast_path_static_inputs']:.1f} us"
    )
    write_json(result, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
