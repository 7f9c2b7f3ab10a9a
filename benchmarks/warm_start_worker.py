"""One process of benchmarks/warm_start.py: a model's first output, timed from this file's first line.

    python benchmarks/warm_start_worker.py CASE VARIANT [--profile FILE]

CASE: ``gpt2`` (HF GPT-2 from a tiny config, default mode), ``mixer`` (a two-block MLP mixer, reduce-overhead),
and held-out models of the same kinds: ``llama`` (HF LLaMA from a tiny config, default mode), ``mixer3`` (a
three-block mixer of other sizes, reduce-overhead); ``decode``: the tiny LLaMA decode step at batch 2 with
``dynamic=True`` (the static kernels' case: the driver turns them on through their environment variables).
VARIANT: ``eager``, ``torch.compile`` (Inductor), ``airgraph`` (torch.compile with the airgraph backend) or
``cache_compile`` (``airgraph.cache_compile``: a warm process loads an AOTInductor package without Dynamo). Caches
come from the environment the driver sets (``TORCHINDUCTOR_CACHE_DIR``, ``AIRGRAPH_CACHE_DIR``): a fresh folder
makes a cold process, the folder of an earlier process a warm one. One thread, no autograd.

Prints one JSON line: seconds from the first line to ``import torch`` done, to the model built, and to the first
output; the call's own seconds; what ran (Dynamo graphs, AOTAutograd traces, Inductor's cache hits and misses,
airgraph's compile-cache hits); the largest difference from eager. ``--profile FILE``: cProfile from the first line
to the first output, written to FILE (the driver reads it).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

CASES = ("gpt2", "mixer", "llama", "mixer3", "decode", "decode-cuda")
MODES = {"gpt2": "max-autotune", "llama": "max-autotune", "mixer": "reduce-overhead", "mixer3": "reduce-overhead"}
MODES["decode"] = "max-autotune"
MODES["decode-cuda"] = "reduce-overhead"


def build(case: str) -> tuple[Any, tuple]:
    """The model (weights from a fixed seed) and its input; HF models from tiny configs, no downloads."""
    import torch

    if case == "decode":
        from airgraph.models import build_tiny_llama, decode_inputs

        model = build_tiny_llama("tiny", max_batch_size=4)
        return model, decode_inputs(model.config, 2, 8, seed=2)
    if case == "decode-cuda":  # issue #35's CUDA case: the small preset's decode step, batch 1
        from airgraph.models import build_tiny_llama, decode_inputs

        model = build_tiny_llama("small", device="cuda")
        return model, decode_inputs(model.config, 1, 8, seed=2, device="cuda")
    if case in ("mixer", "mixer3"):
        from airgraph.models.mixer import MlpMixer

        sizes = {} if case == "mixer" else {"blocks": 3, "tokens": 8, "channels": 48, "channel_hidden": 192}
        model = MlpMixer(**sizes).eval()
        return model, (model.example_input(),)
    import transformers as hf

    torch.manual_seed(0)
    if case == "gpt2":
        config = hf.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        model = hf.GPT2LMHeadModel(config)
    else:
        config = hf.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
        model = hf.LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    return model.eval(), (ids,)


def logits(output: Any) -> Any:
    return output.logits if hasattr(output, "logits") else output


def counts(backend: Any) -> dict[str, Any]:
    """What this process compiled, from torch's counters and the backend's reports."""
    from torch._dynamo.utils import counters

    found = {
        "dynamo_graphs": counters["stats"]["unique_graphs"],
        "aot_autograd_traces": counters["aot_autograd"]["total"],
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "aot_autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "inductor_imported": "torch._inductor.compile_fx" in sys.modules,
        "inductor_counters": {k: v for k, v in counters["inductor"].items() if "cache" in k},
    }
    if backend is not None:
        cache = getattr(backend, "compile_cache", None)
        found["compile_cache"] = dict(cache.counts) if cache is not None else None
        found["chosen_by"] = sorted({s.chosen_by for r in backend.reports for s in r.segments if s.chosen_by})
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=CASES)
    parser.add_argument("variant", choices=["eager", "torch.compile", "airgraph", "cache_compile"])
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    import torch

    imported = time.perf_counter()
    torch.set_num_threads(1)
    model, inputs = build(args.case)
    built = time.perf_counter()
    backend = None
    if args.variant == "torch.compile":
        mode = None if MODES[args.case] == "max-autotune" else "reduce-overhead"
        run = torch.compile(model, mode=mode, dynamic=True if args.case == "decode" else None)
    elif args.variant == "airgraph":
        import airgraph

        config = airgraph.CompilerConfig()
        config.mode = MODES[args.case]
        backend = airgraph.get_backend(config)
        run = torch.compile(model, backend=backend, dynamic=True if args.case == "decode" else None)
    elif args.variant == "cache_compile":
        import airgraph

        config = airgraph.CompilerConfig()
        config.mode = MODES[args.case]
        run = airgraph.cache_compile(model, config=config)
    else:
        run = model
    cuda = args.case.endswith("-cuda")
    with torch.no_grad():
        called = time.perf_counter()
        out = logits(run(*inputs))
        if cuda:
            torch.cuda.synchronize()
        first = time.perf_counter()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        calls = [first - START]
        captured_first = backend is not None and sum(r.capture_keys for r in backend.reports) > 0
        out = out.clone()  # a CUDA graph's next replay may overwrite it
        # torch's CUDA graph trees: a new step (imports Inductor, so only where they run)
        step = torch.compiler.cudagraph_mark_step_begin if cuda and args.variant == "torch.compile" else lambda: None
        step()
        again = logits(run(*inputs))
        if cuda:  # the next calls too: when does the first replayed step come out
            torch.cuda.synchronize()
            calls.append(time.perf_counter() - START)
            step()
            again = logits(run(*inputs))
            torch.cuda.synchronize()
            calls.append(time.perf_counter() - START)
        reference = logits(model(*inputs))
    result = {
        "case": args.case,
        "variant": args.variant,
        "import_s": round(imported - START, 4),
        "built_s": round(built - START, 4),
        "from_start_s": round(first - START, 4),
        "first_call_s": round(first - called, 4),
        "max_abs_diff": max((out - reference).abs().max().item(), (again - reference).abs().max().item()),
    }
    if cuda:  # eager and cache_compile replay nothing: their first output; airgraph records at its first call
        # when it captures (its replay is the second), torch.compile's CUDA graph trees record at the second
        replay = {"eager": 0, "cache_compile": 0, "airgraph": 1 if captured_first else 2, "torch.compile": 2}
        result["calls_from_start_s"] = [round(t, 4) for t in calls]
        result["first_replay_s"] = round(calls[replay[args.variant]], 4)
    if args.variant == "cache_compile":  # what the first output needed, before counts() imports Dynamo's utils
        result["cache_compile"] = run.stats
        result["dynamo_imported"] = "torch._dynamo.convert_frame" in sys.modules
        result["inductor_imported"] = "torch._inductor.compile_fx" in sys.modules
    elif args.variant != "eager":
        result.update(counts(backend))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
