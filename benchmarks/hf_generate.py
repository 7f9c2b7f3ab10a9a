"""HF transformers ``generate`` with a static cache (issue #19): ms per new token of eager, torch.compile,
torch.compile(mode="reduce-overhead") and airgraph reduce-overhead, side by side in one process.

The model is a ``LlamaForCausalLM`` built from a ``LlamaConfig`` with random weights (seeded, nothing
downloaded); bfloat16 is the float32 model cast. Decoding is greedy (``do_sample=False``), ``max_new_tokens``
tokens per call (no EOS token, so every call makes all of them), ``cache_implementation="static"``.

How each variant compiles is how transformers 5.x does it for a static cache: ``generate`` itself compiles the
model's forward (``PreTrainedModel.get_compiled_call``: ``torch.compile(model.__call__, **compile_config)``) and
calls it for every decode step once ``_valid_auto_compile_criteria`` holds (a compileable cache, and a GPU or
``compile_config._compile_all_devices``); the prefill stays eager. Each variant passes its own
``compile_config=CompileConfig(...)``:

- eager: ``disable_compile=True`` (without it, generate compiles with reduce-overhead on a GPU);
- torch.compile: ``CompileConfig(backend="inductor", mode="default", dynamic=False)``;
- torch.compile reduce-overhead: ``CompileConfig(backend="inductor", mode="reduce-overhead", dynamic=False)``;
- airgraph reduce-overhead: ``CompileConfig(backend=airgraph.get_backend(config), mode=None, dynamic=False)``
  with ``config.mode = "reduce-overhead"`` (``mode=None``: torch.compile hands a non-Inductor backend its
  ``mode`` as a keyword argument; airgraph's mode is in its config).

``dynamic=False`` for all: batch 1 and 8 get a static-shape graph each (Dynamo would otherwise recompile the
second batch size for a dynamic batch dimension). Each variant has its own copy of the model (same weights):
transformers keeps one compiled forward per model and re-wraps it whenever the compile config changes.

Checks: every call's tokens (first call, warm-up and timed ones) must equal eager's for the same dtype and
batch; where they differ, the JSON says so (``tokens_match``, each case's ``token_mismatch``: the first differing
step, eager's top-2 logit gap there) and the exit status is 1. A mismatch is then diagnosed: every token of the
variant is judged on eager's logits for the variant's own prefix (one eager forward over its sequence); when
each is eager's greedy choice or within ``TIE_TOLERANCE`` of it, the verdict is "rounding tie" (with random
weights, bfloat16 logits tie exactly now and then: one unit in the last place decides), else "wrong".
``--accept-ties`` exits 0 when every mismatch is a rounding tie (they are still listed).

After timing, one untimed generate per case is profiled: a compiled variant must show one "Torch-Compiled
Region" per decode step (max_new_tokens - 1; the prefill is eager), and the compiled regions of different
variants must be different Dynamo compilations; eager must show none. Dynamo's recompile limit is raised and
``fail_on_recompile_limit_hit`` set, so no variant silently falls back to eager, and Dynamo's counters are
recorded per case during the timed calls (a recompile there is a problem). airgraph's graph reports say whether
its graphs were captured (CUDA graphs: only on a GPU; on the CPU reduce-overhead runs its executor uncaptured).
transformers' ``CompileConfig.to_dict()`` deep-copies the backend, so the reports are read from the copy that
torch.compile calls (``running_backend``).

Timing: the first call (compile, and for reduce-overhead the capture, inside the same generate) is timed alone
with cold Inductor caches (a fresh cache folder, in-memory caches cleared), then ``--warmup`` untimed calls;
then ``--rounds`` interleaved rounds: each round runs every (dtype, batch) group, the variants of a group back
to back in a shuffled (seeded) order, one whole generate call each (device synchronized around it on CUDA).
Reported: median ms per new token (generate wall time / max_new_tokens, so the eager prefill and generate's own
host work are included, the same for every variant), p10/p90, tokens/s, and ratios to torch.compile
reduce-overhead: of the medians, and the median of per-round ratios (paired samples). A variant that fails is
recorded (exception type, message, traceback tail) and the others go on; the exit status is then 1.
Partial results are written after every warm-up and round (``complete: false``), so a timeout leaves them.

    python benchmarks/hf_generate.py --preset small --device cpu
    python benchmarks/hf_generate.py --preset gpu --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

# Measure the airgraph of this checkout (python benchmarks/hf_generate.py puts only benchmarks/ on the path; an
# installed airgraph elsewhere would be imported instead). The JSON records which one ran.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import airgraph
from airgraph.bench import ties
from airgraph.bench.results import counter_delta, counters, environment, failure, write_json
from airgraph.bench.ties import TIE_TOLERANCE

VARIANTS = ("eager", "torch.compile", "torch.compile reduce-overhead", "airgraph reduce-overhead")
# Asked for by name only (--variants): airgraph reduce-overhead with reduce_overhead.input_copies = "in-graph" (the
# step's inputs copied by memcpy nodes of its graph instead of a launch before each replay; runtime/feeding.py)
IN_GRAPH = "airgraph in-graph input copies"
REFERENCE = "torch.compile reduce-overhead"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PRESETS: dict[str, dict[str, Any]] = {
    # CPU: all variants, batch 1 and 8, both dtypes in a few minutes on 2 cores.
    "small": {
        "model": {
            "hidden_size": 256,
            "intermediate_size": 688,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "vocab_size": 1000,
            "tie_word_embeddings": False,
        },
        "prompt_len": 16,
        "new_tokens": 64,
        "rounds": 7,
    },
    # H100: TinyLlama-1.1B's layer shapes (hidden 2048, 32 heads / 4 KV heads, MLP 5632, vocab 32000), 8 layers.
    "gpu": {
        "model": {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 8,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
        },
        "prompt_len": 128,
        "new_tokens": 64,
        "rounds": 7,
    },
    # Llama-3.2-1B's shapes (as benchmarks/llm_roofline.py's 1b preset): the end-to-end figure users see (#33);
    # on a GPU, run it with --dtypes bfloat16 --batches 1 (eager makes 256 tokens at HF's eager pace per call).
    "1b": {
        "model": {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "tie_word_embeddings": True,
        },
        "prompt_len": 128,
        "new_tokens": 256,
        "rounds": 5,
    },
}


@dataclass
class Case:
    """One (dtype, batch, variant): its model copy, generate's arguments and what happened."""

    dtype: str
    batch: int
    variant: str
    model: Any
    kwargs: dict[str, Any]
    backend: Any = None  # the airgraph backend torch.compile calls (its graph reports): running_backend()
    reports: tuple[int, int] = (0, 0)  # airgraph: its reports compiled by this case's warm-up (a slice)
    error: dict[str, str] | None = None
    first_call_s: float | None = None
    second_call_s: float | None = None
    compile_counters: dict[str, int] = field(default_factory=dict)
    timed_counters: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    samples_s: list[float] = field(default_factory=list)
    calls_checked: int = 0
    mismatch: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    reference: torch.Tensor | None = None  # eager's tokens for this dtype and batch (on the CPU)
    mismatch_tokens: torch.Tensor | None = None  # the first call's tokens that differ from eager's
    first_tokens: torch.Tensor | None = None  # the first call's tokens (on the CPU)


# -- model and variants --------------------------------------------------------------------------------------
def build_model(preset: dict[str, Any], max_len: int, seed: int, device: torch.device) -> Any:
    """A LlamaForCausalLM with random float32 weights (seeded), eval mode, no EOS token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **preset["model"],
        max_position_embeddings=max(max_len, 128),
        bos_token_id=1,
        eos_token_id=None,  # greedy decoding of random weights may pick any token: never stop early
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    with device:  # initialized where it runs (the GPU preset's float32 weights take a while on a CPU)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def generate_kwargs(variant: str, device: torch.device, new_tokens: int) -> dict[str, Any]:
    """generate's keyword arguments for a variant."""
    from transformers import CompileConfig

    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "cache_implementation": "static",
    }
    if variant == "eager":
        kwargs["disable_compile"] = True
        return kwargs
    if variant == "torch.compile":
        compile_config = CompileConfig(backend="inductor", mode="default", dynamic=False)
    elif variant == "torch.compile reduce-overhead":
        compile_config = CompileConfig(backend="inductor", mode="reduce-overhead", dynamic=False)
    elif variant in ("airgraph reduce-overhead", IN_GRAPH):
        config = airgraph.CompilerConfig()
        config.mode = "reduce-overhead"
        if variant == IN_GRAPH:
            config.reduce_overhead.input_copies = "in-graph"
        backend = airgraph.get_backend(compiler_config=config)
        compile_config = CompileConfig(backend=backend, mode=None, dynamic=False)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    if device.type == "cpu":
        compile_config._compile_all_devices = True  # generate compiles on a GPU only, unless told so
    kwargs["compile_config"] = compile_config
    return kwargs


def prompt(vocab: int, batch: int, prompt_len: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed + batch)
    ids = torch.randint(3, vocab, (batch, prompt_len), generator=generator)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


# -- running ---------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_generate(case: Case, inputs: dict[str, torch.Tensor], device: torch.device) -> tuple[float, torch.Tensor]:
    _sync(device)
    start = time.perf_counter()
    out = case.model.generate(**inputs, **case.kwargs)
    _sync(device)
    return time.perf_counter() - start, out


def _fresh_cache(folder: str) -> Any:
    """Cold Inductor caches: a new cache folder, in-memory caches cleared (as benchmarks/zoo.py)."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or utils.fresh_inductor_cache  # renamed in torch 2.8
    return fresh(dir=folder, delete=False)


def _warm_workers(cache_root: str, device: torch.device) -> None:
    """Start Inductor's compile workers and imports before any timed first call."""
    with _fresh_cache(cache_root):
        torch.compile(lambda x: (x * 2).sin())(torch.randn(8, device=device))
    torch._dynamo.reset()


def warm_up(case: Case, inputs: dict[str, torch.Tensor], device: torch.device, warmup: int, cache_root: str) -> None:
    """First call (timed alone, cold Inductor caches), then ``warmup`` untimed calls, each call's tokens checked."""
    if case.variant.startswith("airgraph"):
        earlier = running_backend(case)  # compiled for the other batch size already, or None
        reports_before = len(earlier.reports) if earlier is not None else 0
    before = counters()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _fresh_cache(cache_root):
            case.first_call_s, first = timed_generate(case, inputs, device)
        case.first_tokens = first.cpu()
        check_tokens(case, first)
        for i in range(warmup):
            seconds, out = timed_generate(case, inputs, device)
            if i == 0:
                case.second_call_s = seconds
            check_tokens(case, out)
    case.compile_counters = counter_delta(before, counters())
    if case.variant.startswith("airgraph"):
        case.backend = running_backend(case)
        case.reports = (reports_before, len(case.backend.reports) if case.backend is not None else 0)
    case.warnings = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return first


def check_tokens(case: Case, out: torch.Tensor) -> None:
    """Count a call as checked; remember the first call whose tokens differ from eager's."""
    case.calls_checked += 1
    out = out.cpu()
    if case.mismatch is None and not torch.equal(out, case.reference):
        rows = (out != case.reference).any(dim=1).nonzero().flatten().tolist()
        case.mismatch = {"call": case.calls_checked, "rows_differing": rows}
        case.mismatch_tokens = out


def teacher_forced_margins(model: Any, sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """For each generated token: eager's top logit minus eager's logit for that token, both from one eager forward
    over the whole sequence (so each token is judged on the prefix the variant itself had), as a fraction of
    max(1, |top logit|). 0 where the token is eager's greedy choice."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=sequences[:, :-1].to(device), use_cache=False).logits
    return ties.margins(logits, sequences, prompt_len)


def diagnose(case: Case, eager: Case, inputs: dict[str, torch.Tensor], prompt_len: int) -> None:
    """What a token mismatch is: where the tokens first differ and how close eager's top two logits were there;
    then every token of the variant judged against eager's logits on the variant's own prefix. A variant whose
    every token is eager's greedy choice or within ``TIE_TOLERANCE`` of it diverged at a rounding tie (verdict
    "rounding tie"); one that picked a token eager ranks clearly lower computes something else ("wrong")."""
    mismatch = case.mismatch
    extra = {"output_logits": True, "return_dict_in_generate": True}
    try:
        want = eager.model.generate(**inputs, **eager.kwargs, **extra)
        got = case.model.generate(**inputs, **case.kwargs, **extra)
        margins = teacher_forced_margins(eager.model, case.mismatch_tokens, prompt_len)
        own = teacher_forced_margins(eager.model, eager.reference, prompt_len)
    except Exception as exc:  # keep the mismatch; say why there is no diagnosis
        mismatch["diagnosis_error"] = failure(exc, "diagnosis")
        return
    new_want = want.sequences[:, prompt_len:].cpu()
    new_got = got.sequences[:, prompt_len:].cpu()
    differ = (new_want != new_got).nonzero()
    if len(differ):
        step = int(differ[:, 1].min())
        rows = sorted({int(r) for r, s in differ.tolist() if s == step})
        logits_want = want.logits[step].float().cpu()
        logits_got = got.logits[step].float().cpu()
        top2 = logits_want.topk(2, dim=-1).values
        before = [float((want.logits[s] - got.logits[s]).float().abs().max()) for s in range(step)]
        mismatch.update(
            {
                "first_step": step,
                "first_step_rows": rows,
                "eager_tokens": new_want[rows, step].tolist(),
                "variant_tokens": new_got[rows, step].tolist(),
                "eager_top2_gap": [round(float(top2[r, 0] - top2[r, 1]), 6) for r in rows],
                "max_abs_logit_diff_at_step": round(float((logits_want - logits_got).abs().max()), 6),
                "max_abs_logit_diff_before_step": round(max(before, default=0.0), 6),
            }
        )
    else:
        mismatch["first_step"] = None  # generated again with output_logits, the tokens matched
    judged = ties.judge(margins, case.dtype)
    verdict = judged.pop("verdict")
    mismatch.update(
        {"teacher_forced": {**judged, "eager_own_max_margin": round(float(own.max()), 6)}, "verdict": verdict}
    )


def profile_case(case: Case, inputs: dict[str, torch.Tensor], device: torch.device) -> dict[str, Any]:
    """One profiled (untimed) generate: how many Dynamo-compiled regions ran, and which compilations."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = case.model.generate(**inputs, **case.kwargs)
        _sync(device)
    check_tokens(case, out)
    regions: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("Torch-Compiled Region"):
            regions[event.name] = regions.get(event.name, 0) + 1
    return {"compiled_region_calls": sum(regions.values()), "regions": regions}


def running_backend(case: Case) -> Any:
    """The airgraph backend torch.compile really calls for this case's model, or None before its first compile.

    transformers' ``CompileConfig.to_dict()`` deep-copies its fields, the backend included, so torch.compile holds
    a copy of the backend passed in (whose reports stay empty): found by walking the compiled callable's closures
    and attributes (torch.compile's wrapper -> Dynamo's callback -> the backend wrapper -> the backend).
    """
    from airgraph.backend import AirgraphBackend

    compiled = getattr(case.model, "_compiled_call", None)
    found = _find_instances(compiled, AirgraphBackend) if compiled is not None else []
    return found[0] if len(found) == 1 else None


def _find_instances(root: Any, cls: type, depth: int = 10) -> list[Any]:
    seen, found, frontier = set(), [], [root]
    for _ in range(depth):
        following = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, cls):
                found.append(obj)
                continue
            if obj is None or isinstance(obj, (torch.nn.Module, torch.Tensor, type, str, bytes, int, float)):
                continue
            for cell in getattr(obj, "__closure__", None) or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    following.append(cell.cell_contents)
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                following.extend(attrs.values())
            if isinstance(obj, (list, tuple)):
                following.extend(obj)
        frontier = following
    return found


def airgraph_graphs(case: Case) -> list[dict[str, Any]] | None:
    if not case.variant.startswith("airgraph") or case.error is not None:
        return None
    if case.backend is None:
        return [{"error": "the backend torch.compile calls was not found (running_backend)"}]
    return [
        {
            "kind": r.kind,
            "device": r.device,
            "captured": r.captured,
            "capture_keys": r.capture_keys,
            "recaptures": r.recaptures,
            "uncaptured_reason": r.uncaptured_reason,
            "segments": len(r.segments),
            "backends": sorted({s.backend for s in r.segments}),
            "compile_seconds": round(r.compile_seconds, 3),
        }
        for r in case.backend.reports[slice(*case.reports)]
    ]


# -- main ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--new-tokens", type=int, default=None, help="max_new_tokens (default: the preset's)")
    parser.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default: the preset's)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"eager is always run (the reference); also {IN_GRAPH!r}",
    )
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default: the preset's)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: 1 on the CPU, torch's on CUDA)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--accept-ties",
        action="store_true",
        help="exit 0 when the only token mismatches are rounding ties (still reported; see diagnose())",
    )
    parser.add_argument("--output", default=None, help="default: benchmarks/results/hf_generate_<device>.json")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    preset = PRESETS[args.preset]
    new_tokens = args.new_tokens or preset["new_tokens"]
    prompt_len = args.prompt_len or preset["prompt_len"]
    rounds = args.rounds or preset["rounds"]
    batches = [int(b) for b in args.batches.split(",") if b]
    dtypes = [d for d in args.dtypes.split(",") if d]
    variants = ["eager", *(v for v in args.variants.split(",") if v and v != "eager")]
    if bad := [d for d in dtypes if d not in DTYPES] + [v for v in variants if v not in (*VARIANTS, IN_GRAPH)]:
        parser.error(f"unknown {bad}; dtypes: {list(DTYPES)}, variants: {[*VARIANTS, IN_GRAPH]}")
    if new_tokens < 2:
        parser.error("--new-tokens: at least 2 (the first token comes from the eager prefill)")
    # One thread on the CPU by default: on a shared machine, OpenMP threads that wait for a descheduled peer make
    # every matmul many times slower, in bursts (the zoo benchmark does the same).
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    output = args.output or f"benchmarks/results/hf_generate_{device.type}.json"

    import transformers

    transformers.logging.set_verbosity_error()
    # Every case stays compiled in this process, all on one code object (generate compiles the bound
    # model.__call__, i.e. nn.Module._wrapped_call_impl): 3 compiled variants x batches x dtypes cache entries,
    # past Dynamo's default limit of 8. Raise it, and fail rather than silently run eagerly past it.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True

    console = Console(width=150)
    console.print(
        f"airgraph from {os.path.dirname(airgraph.__file__)}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, {torch.get_num_threads()} threads"
    )
    settings = {
        "preset": args.preset,
        "model": {**preset["model"], "class": "LlamaForCausalLM", "weights": f"random, seed {args.seed}"},
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "batches": batches,
        "dtypes": dtypes,
        "variants": variants,
        "rounds": rounds,
        "warmup": args.warmup,
        "threads": torch.get_num_threads(),
        "airgraph_path": os.path.dirname(airgraph.__file__),
        "transformers": transformers.__version__,
        "generate": "greedy (do_sample=False), cache_implementation='static', no EOS (all tokens made)",
        "compile": "generate's own compiled forward (compile_config=CompileConfig(..., dynamic=False)); prefill eager",
        "ms_per_token": "whole generate call / new_tokens (includes the eager prefill and generate's host work)",
        "first_call": "cold Inductor caches (fresh folder, in-memory caches cleared); includes the eager prefill",
        "accept_ties": args.accept_ties,
        "tie_tolerance": TIE_TOLERANCE,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None,
        "load_average_start": os.getloadavg(),
    }

    cases: list[Case] = []
    groups: dict[tuple[str, int], list[Case]] = {}
    inputs: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    with tempfile.TemporaryDirectory(prefix="airgraph-hf-generate-") as cache_root:
        _warm_workers(cache_root, device)
        for dtype in dtypes:
            console.print(f"building the {dtype} model")
            base = build_model(preset, prompt_len + new_tokens, args.seed, device).to(dtype=DTYPES[dtype])
            models = {v: base if v == "eager" else copy.deepcopy(base) for v in variants}
            kwargs = {v: generate_kwargs(v, device, new_tokens) for v in variants}
            for batch in batches:
                inputs[(dtype, batch)] = prompt(base.config.vocab_size, batch, prompt_len, args.seed, device)
                group = groups[(dtype, batch)] = []
                for variant in variants:
                    case = Case(dtype, batch, variant, models[variant], kwargs[variant])
                    cases.append(case)
                    console.print(f"warming up {dtype} batch {batch} {variant}")
                    try:
                        if variant != "eager":
                            case.reference = group[0].reference if group and group[0].variant == "eager" else None
                            if case.reference is None:
                                raise RuntimeError("eager failed: no reference tokens")
                            warm_up(case, inputs[(dtype, batch)], device, args.warmup, cache_root)
                        else:
                            # eager's first call gives the reference tokens
                            case.first_call_s, first = timed_generate(case, inputs[(dtype, batch)], device)
                            case.reference = case.first_tokens = first.cpu()
                            case.calls_checked = 1
                            for _ in range(args.warmup):
                                check_tokens(case, timed_generate(case, inputs[(dtype, batch)], device)[1])
                    except Exception as exc:
                        case.error = failure(exc, "warm-up")
                        console.print(
                            f"[red]FAILED[/red] {dtype} batch {batch} {variant}: {case.error['type']}: "
                            f"{case.error['message'][:300]}"
                        )
                        continue
                    group.append(case)
                    console.print(f"  first call {case.first_call_s:.2f} s")
                    write_json(report(cases, settings, device, complete=False), output)  # partial: a timeout

        order = random.Random(args.seed)
        for i in range(rounds):
            console.print(f"round {i + 1}/{rounds}")
            for key, group in groups.items():
                for case in order.sample(group, len(group)):
                    before = counters()
                    try:
                        seconds, out = timed_generate(case, inputs[key], device)
                    except Exception as exc:  # recorded; the case leaves the rounds, the others go on
                        case.error = failure(exc, f"timed round {i + 1}")
                        group.remove(case)
                        console.print(f"[red]FAILED[/red] {key} {case.variant}: {case.error['type']}")
                        continue
                    after = counters()
                    case.samples_s.append(seconds)
                    check_tokens(case, out)
                    for k, v in counter_delta(before, after).items():
                        case.timed_counters[k] = case.timed_counters.get(k, 0) + v
            write_json(report(cases, settings, device, complete=False), output)
        for key, group in groups.items():
            for case in group:
                try:
                    case.profile = profile_case(case, inputs[key], device)
                except Exception as exc:
                    case.profile = {"error": failure(exc, "profiled call")}
                eager = next((c for c in group if c.variant == "eager"), None)
                if case.mismatch is not None and eager is not None:
                    diagnose(case, eager, inputs[key], prompt_len)
    settings["load_average_end"] = os.getloadavg()
    result = report(cases, settings, device, complete=True)
    console.print(table(result))
    for problem in result["problems"]:
        console.print(f"[red]PROBLEM[/red] {problem}")
    for accepted in result["accepted_rounding_ties"]:
        console.print(f"[yellow]accepted[/yellow] {accepted}")
    for note in result["capture_notes"]:
        console.print(f"note: {note}")
    write_json(result, output)
    console.print(f"wrote {output}")
    return 1 if result["problems"] else 0


# -- results -------------------------------------------------------------------------------------------------
def verify_profile(case: Case, group: list[Case], new_tokens: int) -> str | None:
    """None when the profiled call ran as it should: eager uncompiled, a compiled variant through its own
    compiled forward once per decode step."""
    profile = case.profile or {}
    if "error" in profile:
        return f"the profiled call failed: {profile['error']['type']}"
    calls = profile.get("compiled_region_calls", 0)
    if case.variant == "eager":
        return None if calls == 0 else f"eager ran {calls} compiled regions"
    if calls != new_tokens - 1:
        return f"{calls} compiled-region calls for {new_tokens - 1} decode steps"
    mine = set(profile.get("regions", {}))
    for other in group:
        if other is not case and other.variant != "eager" and mine & set((other.profile or {}).get("regions", {})):
            return f"shares compiled regions with {other.variant}: {sorted(mine)}"
    return None


def capture_notes(case: Case, row: dict[str, Any]) -> list[str]:
    """What ran uncaptured in a reduce-overhead variant (expected on the CPU, which has no CUDA graphs)."""
    name = f"{case.dtype} batch {case.batch} {case.variant}"
    notes = []
    if case.variant == "torch.compile reduce-overhead" and (
        skips := case.compile_counters.get("inductor.cudagraph_skips")
    ):
        notes.append(f"{name}: Inductor skipped CUDA graphs (inductor.cudagraph_skips={skips})")
    for graph in row.get("airgraph_graphs") or []:
        if "error" in graph:
            notes.append(f"{name}: {graph['error']}")
        elif not graph["captured"]:
            notes.append(f"{name}: the {graph['kind']} graph ran uncaptured: {graph['uncaptured_reason']}")
        elif graph["recaptures"]:
            notes.append(f"{name}: a graph was re-captured {graph['recaptures']} times (a static input moved)")
    return notes


def report(cases: list[Case], settings: dict[str, Any], device: torch.device, *, complete: bool) -> dict[str, Any]:
    new_tokens = settings["new_tokens"]
    rows, problems, accepted, notes = [], [], [], []
    for case in cases:
        group = [c for c in cases if (c.dtype, c.batch) == (case.dtype, case.batch)]
        reference = next((c for c in group if c.variant == REFERENCE and c.samples_s and not c.error), None)
        row: dict[str, Any] = {"dtype": case.dtype, "batch": case.batch, "variant": case.variant}
        if case.error is not None:
            row["error"] = case.error
            problems.append(
                f"{case.dtype} batch {case.batch} {case.variant}: failed ({case.error['phase']}): "
                f"{case.error['type']}: {case.error['message'][:200]}"
            )
        ms = [s / new_tokens * 1e3 for s in case.samples_s]
        if ms and case.error is None:
            median = statistics.median(ms)
            deciles = statistics.quantiles(ms, n=10) if len(ms) > 1 else [median] * 9
            row.update(
                {
                    "ms_per_token": round(median, 4),
                    "p10_ms_per_token": round(deciles[0], 4),
                    "p90_ms_per_token": round(deciles[-1], 4),
                    "tokens_per_s": round(case.batch * 1e3 / median, 1),
                    "samples_ms_per_token": [round(x, 4) for x in ms],
                }
            )
            if reference is not None:
                ref = [s / new_tokens * 1e3 for s in reference.samples_s]
                row["ratio_to_torch_compile_reduce_overhead"] = round(median / statistics.median(ref), 4)
                row["paired_ratio_to_torch_compile_reduce_overhead"] = round(
                    statistics.median(a / b for a, b in zip(case.samples_s, reference.samples_s, strict=True)), 4
                )
        row.update(
            {
                "first_call_s": None if case.first_call_s is None else round(case.first_call_s, 3),
                "second_call_s": None if case.second_call_s is None else round(case.second_call_s, 3),
                "calls_checked": case.calls_checked,
                "tokens_match_eager": case.mismatch is None if case.error is None else None,
                "token_mismatch": case.mismatch,
                "same_first_call_tokens_as": [
                    other.variant
                    for other in group
                    if other is not case
                    and other.first_tokens is not None
                    and case.first_tokens is not None
                    and torch.equal(other.first_tokens, case.first_tokens)
                ],
                "compile_counters": case.compile_counters,
                "timed_counters": case.timed_counters,
                "warnings": case.warnings,
                "profile": case.profile,
                "airgraph_graphs": airgraph_graphs(case),
            }
        )
        if case.mismatch is not None:
            verdict = case.mismatch.get("verdict")
            message = (
                f"{case.dtype} batch {case.batch} {case.variant}: TOKENS DIFFER FROM EAGER (first at call "
                f"{case.mismatch['call']}, step {case.mismatch.get('first_step')}; verdict: {verdict})"
            )
            if settings.get("accept_ties") and verdict == "rounding tie":
                accepted.append(message)
            else:
                problems.append(message)
        if complete and case.error is None:
            if (why := verify_profile(case, group, new_tokens)) is not None:
                problems.append(f"{case.dtype} batch {case.batch} {case.variant}: compiled forward check: {why}")
            row["compiled_forward_check"] = why or "ok"
            recompiled = {
                k: v for k, v in case.timed_counters.items() if k.startswith(("stats.unique_graphs", "recompiles"))
            }
            if recompiled:
                problems.append(f"{case.dtype} batch {case.batch} {case.variant}: recompiled while timed: {recompiled}")
        notes.extend(capture_notes(case, row))
        rows.append(row)
    return {
        **environment(device),
        "benchmark": "hf_generate",
        "complete": complete,
        "settings": settings,
        "tokens_match": all(c.mismatch is None for c in cases),
        "problems": problems,
        "accepted_rounding_ties": accepted,
        "capture_notes": notes,
        "results": rows,
    }


def table(result: dict[str, Any]) -> Table:
    variants = result["settings"]["variants"]
    out = Table(
        title=f"hf generate ({result['settings']['preset']}, {result['device']}): ms per new token (median), "
        "x paired ratio to torch.compile reduce-overhead, | first call s"
    )
    for column in ("dtype", "batch", *variants):
        out.add_column(column, justify="left" if column in ("dtype", "batch") else "right")
    keys = dict.fromkeys((r["dtype"], r["batch"]) for r in result["results"])
    for dtype, batch in keys:
        row = {r["variant"]: r for r in result["results"] if (r["dtype"], r["batch"]) == (dtype, batch)}
        cells = []
        for variant in variants:
            r = row.get(variant, {})
            if "error" in r:
                cells.append(f"FAILED ({r['error']['type'].rsplit('.', 1)[-1]})")
                continue
            if "ms_per_token" not in r:
                cells.append("-")
                continue
            ratio = r.get("paired_ratio_to_torch_compile_reduce_overhead")
            ratio = "" if ratio is None or variant == REFERENCE else f" x{ratio:.2f}"
            first = "" if variant == "eager" else f" | {r['first_call_s']:.1f}s"
            bad = "" if r["tokens_match_eager"] else " TOKENS DIFFER"
            cells.append(f"{r['ms_per_token']:.2f}{ratio}{first}{bad}")
        out.add_row(dtype, str(batch), *cells)
    return out


if __name__ == "__main__":
    sys.exit(main())
