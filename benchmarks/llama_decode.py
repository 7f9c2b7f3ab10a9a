"""GPU benchmark: tiny LLaMA decode (batch 1) and the host cost of one CUDA graph replay.

Targets (issue #2, on the GPU machine): airgraph reduce-overhead / torch.compile(mode="reduce-overhead")
latency <= 1.0 (aim 0.9); eager / airgraph reduce-overhead >= 3x; host cost of one replay <= 20 us. Issue #19:
airgraph's fast path (``airgraph.compile(..., fast_path=True)``) / torch.compile reduce-overhead <= 0.9 on the tiny
and small presets; host time to issue one step <= 20 us.

    python benchmarks/llama_decode.py [--preset tiny] [--steps 200] [--output PATH]

The latency table comes from airgraph.bench.decode.run_bench (all modes side by side in one process). The host
cost is the wall time of issuing one airgraph reduce-overhead decode call without synchronizing (Dynamo
guards, AOTAutograd's wrapper, input copies, the replay launch and the output copy), over a burst short
enough that the GPU never makes the host wait. Then what torch costs to launch the same step at all
(``launch_floor_us``), and what other ways to put the inputs into the graph's buffers would cost
(``input_copy_mechanisms``: the input-copy launch is most of that floor). Every timing runs before the profiler
first runs in the process: it leaves CUPTI loaded (``TEARDOWN_CUPTI=0``, which live CUDA graphs need), and CUDA calls
cost the host more from then on; ``launch_floor_after_profiler_us`` times the floor again after the profiles, to
show by how much.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from replay_host_cost import capture_and_key, per_call_us

import airgraph
from airgraph.bench.decode import print_results, run_bench
from airgraph.bench.results import environment, write_json
from airgraph.models import build_tiny_llama, decode_inputs, prefill_inputs
from airgraph.runtime.device import CudaRuntime
from airgraph.runtime.feeding import copies_first, memcpy_nodes

# The fast path with its replays' input copies made one ``copy_`` each instead of one ``torch._foreach_copy_`` per
# dtype: which of the two costs the host less on a GPU is measured side by side (the CPU proxy cannot say).
COPY_PER_INPUT = "airgraph fast-path, copy_ per input"
# The fast path called with input buffers marked static (torch._dynamo.mark_static_address) that a decode loop
# refills in place (``torch.argmax(logits, -1, out=tokens)``): the graph reads them where they are, no copy launch.
STATIC_INPUTS = "airgraph fast-path, static inputs"
# The fast path with config.reduce_overhead.input_copies = "in-graph": the inputs' copies are memcpy nodes of the
# graph, pointed at each call's tensors (runtime/feeding.py), instead of a copy launch before each replay.
IN_GRAPH_COPIES = "airgraph fast-path, in-graph input copies"


def _step(model: torch.nn.Module, variant: str) -> Any:
    """The decode step of ``variant``: "airgraph" (reduce-overhead through torch.compile), "airgraph fast-path"
    (and :data:`COPY_PER_INPUT`, :data:`STATIC_INPUTS`), or "torch.compile" (its reduce-overhead mode)."""
    torch._dynamo.reset()
    if variant == "torch.compile":
        return torch.compile(model, mode="reduce-overhead", fullgraph=True)
    config = airgraph.CompilerConfig()
    config.mode = "reduce-overhead"
    if variant == IN_GRAPH_COPIES:
        config.reduce_overhead.input_copies = "in-graph"
    return airgraph.compile(model, config, fast_path=variant != "airgraph", fullgraph=True)


def _inputs(model: torch.nn.Module, variant: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's tokens and position (marked static for :data:`STATIC_INPUTS`)."""
    tokens, pos = decode_inputs(model.config, 1, 8, device=device)  # type: ignore[arg-type]
    if variant == STATIC_INPUTS:
        for buffer in (tokens, pos):
            torch._dynamo.mark_static_address(buffer)
    return tokens, pos


@contextlib.contextmanager
def _copies(variant: str) -> Iterator[None]:
    """For :data:`COPY_PER_INPUT`, CUDA's ``copy_many`` made of one ``copy_`` per tensor while inside."""
    if variant != COPY_PER_INPUT:
        yield
        return

    def one_by_one(self: Any, dsts: Any, srcs: Any) -> None:
        for dst, src in zip(dsts, srcs, strict=True):
            dst.copy_(src)

    batched = CudaRuntime.__dict__["copy_many"]  # (as defined: a staticmethod)
    CudaRuntime.copy_many = one_by_one  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        CudaRuntime.copy_many = batched  # type: ignore[method-assign]


def host_cost_us(preset: str, variant: str, bursts: int = 20, calls: int = 20, device: str = "cuda") -> dict[str, Any]:
    """Host time to issue one decode call of ``variant`` without synchronizing: the median over bursts short enough
    that the GPU never makes the host wait (``us_per_call_short``: bursts of 4 calls, which would be cheaper per
    call if the device's launch queue made the longer bursts wait). Timed in a process the profiler has not run in
    yet (main: the profiles come after every timing; :func:`host_profile`)."""
    with _copies(variant):
        step, tokens, pos, sync = _warmed(preset, variant, device)
        with torch.no_grad():
            if variant == STATIC_INPUTS and capture_and_key(step, tokens, pos)[1].copy_indices:
                raise RuntimeError("the inputs marked static are copied into buffers: the variant measures nothing new")
            if variant == IN_GRAPH_COPIES and capture_and_key(step, tokens, pos)[1].batches:
                raise RuntimeError("the inputs are copied by a launch: the variant measures nothing new")
            # Each call's inputs from one of two sets in turn, at other addresses (a decode loop's new tensors: an
            # in-graph copy is pointed at each); static input buffers are the same tensors every call
            sets = [(tokens, pos)] * 2 if variant == STATIC_INPUTS else [(tokens, pos), (tokens.clone(), pos.clone())]
            samples, short = [], []
            for _ in range(bursts):
                for n, into in ((calls, samples), (4, short)):
                    sync()
                    start = time.perf_counter()
                    for i in range(n):
                        step(*sets[i & 1])  # the output dropped at once: a replay then copies nothing
                    into.append((time.perf_counter() - start) / n * 1e6)
            sync()
    return {"us_per_call": statistics.median(samples), "us_per_call_short": statistics.median(short)}


def host_profile(preset: str, variant: str, calls: int = 20, device: str = "cuda") -> dict[str, Any]:
    """Where a call of ``variant``'s host time goes: the profiler's self CPU time per call of the ten costliest
    events (aten ops and CUDA runtime calls such as cudaGraphLaunch or cudaMemcpyAsync), and cProfile's own time per
    call of the twelve costliest Python functions and C calls (Dynamo, AOTAutograd, airgraph's replay,
    ``CUDAGraph.replay``). Both profilers add their own cost: the shares are the point, not the sums. The profiler
    leaves CUPTI loaded (``TEARDOWN_CUPTI=0``, which live CUDA graphs need), and CUDA calls cost the host more from
    then on (``launch_floor_after_profiler_us``): main runs this after every timing."""
    with _copies(variant):
        step, tokens, pos, sync = _warmed(preset, variant, device)
        with torch.no_grad():
            python = cProfile.Profile()
            python.enable()
            for _ in range(calls):
                step(tokens, pos)
            python.disable()
            sync()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(calls):
                    step(tokens, pos)
                sync()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    profile = {
        e.key: round(e.self_cpu_time_total / calls, 2)
        for e in events[:10]
        if e.self_cpu_time_total and "Synchronize" not in e.key
    }
    return {"profile_self_cpu_us_per_call": profile, "python_own_us_per_call": _python_breakdown(python, calls)}


def _warmed(preset: str, variant: str, device: str) -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
    """The decode step of ``variant`` on a prefilled model, warmed up, recorded and replayed a few times; its
    tokens and position; the device's synchronize."""
    model = build_tiny_llama(preset, device=device)
    step = _step(model, variant)
    with torch.no_grad():
        model(*prefill_inputs(model.config, 1, 8, device=device))
        tokens, pos = _inputs(model, variant, device)
        for _ in range(5):
            step(tokens, pos)
    return step, tokens, pos, torch.cuda.synchronize if device == "cuda" else (lambda: None)


def launch_floor_us(preset: str, bursts: int = 20, calls: int = 20, device: str = "cuda") -> dict[str, float]:
    """What one fast-path step costs the host against what torch costs to launch its work at all (median us per
    call over interleaved bursts): the same recorded graph's ``CUDAGraph.replay()`` alone, its replay's input copies
    alone (one ``torch._foreach_copy_`` per dtype, as airgraph makes them), and both; the fast-path call minus the
    last is what airgraph's Python adds."""
    step, tokens, pos, sync = _warmed(preset, "airgraph fast-path", device)
    with torch.no_grad():
        _, entry, args = capture_and_key(step, tokens, pos)
        copies = [(buffers, list(inputs(args))) for buffers, inputs in entry.batches]
        graph = entry.graph

        def copy() -> None:
            for buffers, inputs in copies:
                torch._foreach_copy_(buffers, inputs)

        def copy_and_replay() -> None:
            copy()
            graph.replay()

        fns = {
            "fast-path call": lambda: step(tokens, pos),
            "graph replay": graph.replay,
            "input copies": copy,
            "input copies + graph replay": copy_and_replay,
        }
        floor = _interleaved_us(fns, bursts, calls, sync)
    floor["airgraph above the floor"] = round(floor["fast-path call"] - floor["input copies + graph replay"], 2)
    return floor


def input_copy_mechanisms(preset: str, bursts: int = 20, calls: int = 20, device: str = "cuda") -> dict[str, Any]:
    """Ways to put a step's inputs into its recorded graph's buffers: what each costs the host (median us per call
    over interleaved bursts, the step's ``CUDAGraph.replay()`` after each) and whether it copied the right values.
    Each call's sources alternate between two sets of tensors, as a decode loop's new input tensors do.

    - ``foreach``: one ``torch._foreach_copy_`` per dtype (airgraph's way);
    - ``cudaMemcpyAsync``: one ``cudaMemcpyAsync`` per input through ``cuda.bindings`` (a dependency of torch's Linux
      CUDA wheels), past ATen's dispatcher;
    - ``memcpy-node updates``: the copies recorded as memcpy nodes whose sources each call changes with
      ``cudaGraphExecMemcpyNodeSetParams1D``. Here the nodes are a graph of their own (``+ copy graph``: replayed
      before the step's); recorded as the step graph's first nodes, the updates alone would remain.

    ``in_flight_ok``: an update did not reach launches already queued (CUDA says updates reach later launches
    only): six launches of a graph (a sleep kernel, the memcpy node, ``acc += buffer``) queued behind each other,
    each after an update to the other source, then ``acc`` compared with the sum of the sources."""
    from cuda.bindings import runtime as cudart

    d2d, success = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, cudart.cudaError_t.cudaSuccess

    def ok(result: tuple) -> Any:
        if result[0] != success:
            raise RuntimeError(f"CUDA runtime call failed: {result[0]}")
        return result[1] if len(result) == 2 else result[1:]

    def record_copies(dsts: list[torch.Tensor], srcs: list[torch.Tensor], around: Any = None) -> tuple[Any, Any, list]:
        """A graph of memcpy nodes (srcs into dsts, between ``around``'s two callables where given), instantiated:
        (the graph, its cudaGraphExec_t, the memcpy nodes in the order of dsts)."""
        before, after = around if around is not None else (lambda: None, lambda: None)
        copies_then_after = copies_first(lambda _: after(), list(zip(dsts, srcs, strict=True)))  # (as airgraph's)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            before()
            copies_then_after([])
        graph.instantiate()
        found = memcpy_nodes(graph.raw_cuda_graph())  # (as FedGraph finds its own)
        nodes = [found[(dst.data_ptr(), src.data_ptr())] for dst, src in zip(dsts, srcs, strict=True)]
        return graph, cudart.cudaGraphExec_t(init_value=graph.raw_cuda_graph_exec()), nodes

    step, tokens, pos, sync = _warmed(preset, "airgraph fast-path", device)
    result: dict[str, Any] = {}
    with torch.no_grad():
        _, entry, args = capture_and_key(step, tokens, pos)
        batches = [(buffers, list(inputs(args))) for buffers, inputs in entry.batches]
        dsts = [b for buffers, _ in batches for b in buffers]
        # Two sets of sources, per batch and in a row (the second one's values are the first one's plus one)
        per_batch = [[[s.clone() for s in srcs] for _, srcs in batches], [[s + 1 for s in srcs] for _, srcs in batches]]
        sets = [[s for srcs in one for s in srcs] for one in per_batch]
        sizes, dst_ptrs = [d.nbytes for d in dsts], [d.data_ptr() for d in dsts]
        stream = cudart.cudaStream_t(init_value=torch.cuda.current_stream().cuda_stream)
        graph, turn = entry.graph, [0]
        copies, copies_exec, nodes = record_copies(dsts, sets[0])

        def sources() -> list[torch.Tensor]:
            turn[0] ^= 1
            return sets[turn[0]]

        def foreach() -> None:
            turn[0] ^= 1
            for (buffers, _), srcs in zip(batches, per_batch[turn[0]], strict=True):
                torch._foreach_copy_(buffers, srcs)
            graph.replay()

        def memcpy_async() -> None:
            for dst, src, size in zip(dst_ptrs, sources(), sizes, strict=True):
                ok(cudart.cudaMemcpyAsync(dst, src.data_ptr(), size, d2d, stream))
            graph.replay()

        def update() -> None:
            for node, dst, src, size in zip(nodes, dst_ptrs, sources(), sizes, strict=True):
                ok(cudart.cudaGraphExecMemcpyNodeSetParams1D(copies_exec, node, dst, src.data_ptr(), size, d2d))

        def update_and_replay() -> None:
            update()
            graph.replay()

        def update_copy_graph_and_replay() -> None:
            update()
            copies.replay()
            graph.replay()

        fns = {
            "foreach + graph replay": foreach,
            "cudaMemcpyAsync + graph replay": memcpy_async,
            "memcpy-node updates + graph replay": update_and_replay,
            "memcpy-node updates + copy graph + graph replay": update_copy_graph_and_replay,
            "graph replay": graph.replay,
        }
        result["us_per_call"] = _interleaved_us(fns, bursts, calls, sync)
        checks = {}
        for name, fn in (("foreach", foreach), ("cudaMemcpyAsync", memcpy_async)):
            fn()
            sync()
            checks[name] = all(torch.equal(d, s) for d, s in zip(dsts, sets[turn[0]], strict=True))
        update()
        copies.replay()
        sync()
        checks["memcpy-node updates"] = all(torch.equal(d, s) for d, s in zip(dsts, sets[turn[0]], strict=True))
        result["values_ok"] = checks
        # Launches queued behind each other (a sleep kernel first), each after an update to the other source
        probe_sources = [torch.full((256,), 1.0, device=device), torch.full((256,), 10.0, device=device)]
        buffer, acc = torch.zeros(256, device=device), torch.zeros(256, device=device)
        sync()
        around = (lambda: torch.cuda._sleep(20_000_000), lambda: acc.add_(buffer))
        probe, probe_exec, (node,) = record_copies([buffer], [probe_sources[0]], around)
        acc.zero_()
        sync()
        start = time.perf_counter()
        for k in range(6):
            src = probe_sources[k % 2].data_ptr()
            ok(cudart.cudaGraphExecMemcpyNodeSetParams1D(probe_exec, node, buffer.data_ptr(), src, buffer.nbytes, d2d))
            probe.replay()
        issued = time.perf_counter() - start
        sync()
        done = time.perf_counter() - start
        result["in_flight_ok"] = bool((acc == 33.0).all())
        result["in_flight_acc"] = acc[0].item()
        # Far less than the six sleeps (``done``): neither an update nor a launch waited for the launches queued
        result["in_flight_issue_ms"], result["in_flight_done_ms"] = round(issued * 1e3, 3), round(done * 1e3, 3)
    return result


def _interleaved_us(fns: dict[str, Any], bursts: int, calls: int, sync: Any) -> dict[str, float]:
    """replay_host_cost's per_call_us on a device: synchronized before each burst and after the last, rounded."""
    medians = per_call_us(fns, (), calls, bursts, sync)
    sync()
    return {name: round(value, 2) for name, value in medians.items()}


def _python_breakdown(profile: cProfile.Profile, calls: int, top: int = 12) -> dict[str, float]:
    """cProfile's own time (tottime) per call of the ``top`` costliest functions, as "file:line(name)" with the
    file shortened to what follows site-packages/ or the repository."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    result = {}
    for (file, line, name), (_, _, own, _, _) in rows:
        short = file.split("site-packages/")[-1].split("/airgraph/")[-1] if file != "~" else ""
        result[f"{short}:{line}({name})" if short else name] = round(own / calls * 1e6, 2)
    return result


def _kept(measure: Any, *args: Any) -> dict[str, Any]:
    """``measure(*args)``, or its error: one measurement's failure (the profiler, say) leaves the others' figures."""
    try:
        return measure(*args)
    except Exception as error:
        print(f"{getattr(measure, '__name__', measure)}{args}: failed: {type(error).__name__}: {error}")
        return {"error": f"{type(error).__name__}: {error}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output", default="benchmarks/results/llama_decode_cuda.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (run it on the GPU machine)")
    result = run_bench(preset=args.preset, batch=1, steps=args.steps, warmup=20, device="cuda", progress=False)
    print_results(result)
    median = {r["mode"]: r["median_ms"] for r in result["results"]}
    torch_ro = median["torch.compile reduce-overhead"]
    result["ratios"] = {
        "airgraph reduce-overhead / torch.compile reduce-overhead": median["airgraph reduce-overhead"] / torch_ro,
        "airgraph fast-path / torch.compile reduce-overhead": median["airgraph fast-path"] / torch_ro,
        "eager / airgraph reduce-overhead": median["eager"] / median["airgraph reduce-overhead"],
    }
    result.update({k: v for k, v in environment(torch.device("cuda")).items() if k not in result})
    print(result["ratios"])
    write_json(result, args.output)  # the latency table kept whatever the host-cost part below does
    # Every timing first, then the profiles: the profiler leaves CUPTI loaded, and CUDA calls cost the host more
    # from then on (at 1cda07b, timed after it: CUDAGraph.replay() of the tiny step 13.6-14.1 us, against 2.9-5.2
    # us in processes that never profiled)
    host: dict[str, Any] = {}
    result["host_cost"] = host
    variants = [
        ("airgraph", "replay"),
        ("airgraph fast-path", "fast_path_call"),
        ("torch.compile", "torch_compile_call"),
        (COPY_PER_INPUT, "fast_path_call_copy_per_input"),
        (STATIC_INPUTS, "fast_path_call_static_inputs"),
        (IN_GRAPH_COPIES, "fast_path_call_in_graph_copies"),
    ]
    for variant, field in variants:
        cost = host[variant] = _kept(host_cost_us, args.preset, variant)
        if "error" not in cost:
            result[f"host_cost_per_{field}_us"] = cost["us_per_call"]
            print(
                f"{variant}: host cost {cost['us_per_call']:.1f} us per call in bursts of 20, "
                f"{cost['us_per_call_short']:.1f} us in bursts of 4"
            )
        write_json(result, args.output)
    for field, measure in (("launch_floor_us", launch_floor_us), ("input_copy_mechanisms", input_copy_mechanisms)):
        result[field] = _kept(measure, args.preset)
        print(f"{field}:", result[field])
        write_json(result, args.output)
    result["profiled_after_the_timings"] = True
    for variant, _ in variants:
        if "error" not in host[variant]:  # (a failed profile is its own key: the timing stays a result)
            profile = _kept(host_profile, args.preset, variant)
            host[variant].update({"profile_error": profile["error"]} if "error" in profile else profile)
            print(f"{variant}: self CPU us per call (profiled)", host[variant].get("profile_self_cpu_us_per_call"))
            print(f"{variant}: Python's own us per call (cProfile)", host[variant].get("python_own_us_per_call"))
        write_json(result, args.output)
    result["launch_floor_after_profiler_us"] = _kept(launch_floor_us, args.preset)
    print("launch_floor_after_profiler_us:", result["launch_floor_after_profiler_us"])
    write_json(result, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
