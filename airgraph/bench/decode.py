"""Decode-step benchmark of the tiny LLaMA: eager vs torch.compile vs airgraph, one JSON result.

``run_bench`` builds one model and, for each mode, compiles it afresh (``torch._dynamo.reset()`` first),
resets the KV caches, runs an eager prefill of a fixed prompt, then calls the decode step (one token per
sequence) on fixed tokens at positions ``prompt_len, prompt_len + 1, ...``:

- call 0 is timed on its own: ``compile_s`` (Dynamo + AOTAutograd + lowering + the first run);
- ``warmup`` untimed calls follow, then ``steps`` calls timed one by one (device synchronized around each
  call on CUDA), giving median / p10 / p90 per-step latency, tokens/s = batch / median, and the speedup
  over eager's median;
- every call's logits are compared with eager's logits for the same call (max abs diff, and ``ok`` within
  the dtype's tolerance). All modes see exactly the same inputs and cache contents.

Positions wrap: when the next position would reach ``max_seq_len``, the caches are reset and the prompt is
prefilled again (untimed) and decoding restarts at ``prompt_len``. So any number of steps is valid, and the
schedule (hence the reference logits) is the same for every mode. ``settings.wraps`` says how often it
happened.

``compile_s`` is measured with Inductor's on-disk caches as they are: modes run in the order given (eager
first), and a later mode may reuse kernels an earlier one compiled (torch.compile and airgraph with the
Inductor kernel backend often generate the same C++/Triton code), so only the first Inductor mode of a
run with cold caches shows the full kernel compile time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from airgraph.backend import compile_model, get_backend
from airgraph.bench import CUDA_ONLY_MODES, DEFAULT_STEPS, DEFAULT_WARMUP, MODE_ALIASES, MODES
from airgraph.bench.results import environment
from airgraph.config import CompilerConfig
from airgraph.models import build_tiny_llama, prefill_inputs

__all__ = ["default_modes", "parse_modes", "print_results", "resolve_device", "results_table", "run_bench"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# (atol, rtol) for comparing a mode's logits with eager's.
TOLERANCES = {"float32": (1e-3, 1e-3), "bfloat16": (5e-2, 1e-2), "float16": (5e-2, 1e-2)}


def resolve_device(device: str) -> torch.device:
    """The device to run on: "auto" is CUDA when available, else the CPU; a CUDA device is checked to exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r}: {exc}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine (torch {torch.__version__})")
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: the benchmark runs on 'cpu' or 'cuda'")
    return resolved


def default_modes(device: torch.device | str) -> tuple[str, ...]:
    """The first four modes, plus torch.compile's own reduce-overhead on CUDA."""
    is_cuda = torch.device(device).type == "cuda"
    return tuple(m for m in MODES if is_cuda or m not in CUDA_ONLY_MODES)


def parse_modes(text: str | Sequence[str]) -> tuple[str, ...]:
    """A comma list (or a sequence) of mode names or aliases -> canonical names, in the order given."""
    items = text.split(",") if isinstance(text, str) else list(text)
    modes: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        mode = MODE_ALIASES.get(item, item)
        if mode not in MODES:
            known = ", ".join([*MODES, *MODE_ALIASES])
            raise ValueError(f"unknown benchmark mode {item!r}; known modes and aliases: {known}")
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise ValueError("no benchmark modes given")
    return tuple(modes)


def run_bench(
    *,
    preset: str = "tiny",
    batch: int = 1,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    modes: Sequence[str] | str | None = None,
    device: str = "auto",
    dtype: str = "float32",
    kernel_backend: str = "inductor",
    prompt_len: int = 8,
    seed: int = 0,
    progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure the decode step of the tiny LLaMA under each mode; see the module docstring."""
    dev = resolve_device(device)
    chosen = default_modes(dev) if modes is None else parse_modes(modes)
    if dev.type != "cuda" and (cuda_only := [m for m in chosen if m in CUDA_ONLY_MODES]):
        raise ValueError(f"mode {cuda_only[0]!r} needs a CUDA device (device is {dev})")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: allowed: {', '.join(DTYPES)}")
    for name, value, low in (("batch", batch, 1), ("steps", steps, 1), ("warmup", warmup, 0), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r}: must be an int >= {low}")
    base_config = CompilerConfig()
    base_config.kernel_backend = kernel_backend  # validates the name

    model = build_tiny_llama(preset, seed=seed, max_batch_size=batch, device=dev, dtype=DTYPES[dtype])
    max_seq_len = model.config.max_seq_len
    if not isinstance(prompt_len, int) or not 1 <= prompt_len < max_seq_len:
        raise ValueError(f"prompt_len={prompt_len!r}: must be in [1, max_seq_len - 1 = {max_seq_len - 1}]")
    prefill = prefill_inputs(model.config, batch, prompt_len, seed=seed, device=dev)
    calls, wraps = _schedule(model.config.vocab_size, batch, prompt_len, max_seq_len, 1 + warmup + steps, seed, dev)
    atol, rtol = TOLERANCES[dtype]

    results: list[dict[str, Any]] = []
    reference: list[torch.Tensor] | None = None
    order = sorted(chosen, key=lambda m: m != "eager")  # eager first: its logits are the reference
    if "eager" not in chosen:
        order = [None, *order]  # an untimed eager run, for the reference logits only
    with _progress(progress, console) as bar, torch.no_grad():
        for mode in order:
            tick = _ticker(bar, mode, len(calls), warmup)
            torch._dynamo.reset()
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            step, backend = _compile(model, mode or "eager", base_config)
            mark_step = mode == "torch.compile reduce-overhead"
            times, outputs = _drive(step, model, prefill, calls, dev, mark_step=mark_step, on_call=tick)
            if reference is None:
                reference = outputs
            if mode is not None:
                results.append(_record(mode, times, warmup, batch, outputs, reference, atol, rtol, backend, dev))
    torch._dynamo.reset()

    eager = next((r for r in results if r["mode"] == "eager"), None)
    for r in results:
        r["speedup_vs_eager"] = round(eager["median_ms"] / r["median_ms"], 3) if eager and r["median_ms"] else None
    settings = {
        "preset": preset,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "modes": list(chosen),
        "device": str(dev),
        "dtype": dtype,
        "kernel_backend": kernel_backend,
        "prompt_len": prompt_len,
        "seed": seed,
        "max_seq_len": max_seq_len,
        "wraps": wraps,
        "atol": atol,
        "rtol": rtol,
        "num_threads": torch.get_num_threads(),
        "positions": "wrap: caches reset and prompt prefilled again (untimed) before position max_seq_len",
        "compile_caches": "Inductor caches shared between modes: later modes may reuse earlier modes' kernels",
    }
    return {**environment(dev), "settings": settings, "results": results}


# -- one mode -----------------------------------------------------------------------------------------------
def _compile(model: torch.nn.Module, mode: str, base: CompilerConfig) -> tuple[Callable[..., Any], Any]:
    if mode == "eager":
        return model, None
    if mode == "torch.compile":
        return torch.compile(model), None
    if mode == "torch.compile reduce-overhead":
        return torch.compile(model, mode="reduce-overhead"), None
    config = CompilerConfig()
    config.update(base.as_dict())
    if mode == "airgraph fast-path":  # reduce-overhead, called past torch.compile once a call was seen
        config.mode = "reduce-overhead"
        fast = compile_model(model, config, fast_path=True)
        return fast, fast.backend
    config.mode = mode.removeprefix("airgraph ")
    backend = get_backend(config)
    return torch.compile(model, backend=backend), backend


def _schedule(
    vocab: int, batch: int, prompt_len: int, max_seq_len: int, n_calls: int, seed: int, device: torch.device
) -> tuple[list[tuple[torch.Tensor, torch.Tensor, bool]], int]:
    """Fixed (tokens, input_pos, re-prefill first?) for every call, positions wrapping at max_seq_len."""
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (n_calls, batch, 1), generator=generator).to(device)
    span = max_seq_len - prompt_len
    calls = []
    for i in range(n_calls):
        pos = torch.tensor([prompt_len + i % span], dtype=torch.long, device=device)
        calls.append((tokens[i], pos, i > 0 and i % span == 0))
    return calls, (n_calls - 1) // span


def _drive(
    step: Callable[..., Any],
    model: Any,
    prefill: tuple[torch.Tensor, torch.Tensor],
    calls: list[tuple[torch.Tensor, torch.Tensor, bool]],
    device: torch.device,
    *,
    mark_step: bool,
    on_call: Callable[[int], None],
) -> tuple[list[float], list[torch.Tensor]]:
    """Run every call from fresh caches; return each call's wall time (s) and a copy of its logits."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    model.reset_caches()
    model(*prefill)
    times, outputs = [], []
    for i, (tokens, pos, refill) in enumerate(calls):
        if refill:
            model.reset_caches()
            model(*prefill)
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        sync(device)
        start = time.perf_counter()
        out = step(tokens, pos)
        sync(device)
        times.append(time.perf_counter() - start)
        outputs.append(out.detach().clone())  # outside the timing: cudagraph trees reuse their output memory
        del out  # as a decode loop that took its token: airgraph's replay then copies no output
        on_call(i)
    return times, outputs


def _record(
    mode: str,
    times: list[float],
    warmup: int,
    batch: int,
    outputs: list[torch.Tensor],
    reference: list[torch.Tensor],
    atol: float,
    rtol: float,
    backend: Any,
    device: torch.device,
) -> dict[str, Any]:
    timed = np.array(times[1 + warmup :]) * 1e3
    p10, median, p90 = (float(x) for x in np.percentile(timed, [10, 50, 90]))
    max_diff, ok = 0.0, True
    for out, ref in zip(outputs, reference, strict=True):
        max_diff = max(max_diff, float((out.float() - ref.float()).abs().max()))
        ok = ok and torch.allclose(out.float(), ref.float(), atol=atol, rtol=rtol)
    reports = backend.reports if backend is not None else None
    return {
        "mode": mode,
        "median_ms": round(median, 4),
        "p10_ms": round(p10, 4),
        "p90_ms": round(p90, 4),
        "mean_ms": round(float(timed.mean()), 4),
        "tokens_per_s": round(batch / (median / 1e3), 1),
        "speedup_vs_eager": None,  # filled in once every mode ran
        "compile_s": None if mode == "eager" else round(times[0], 3),
        "first_call_s": round(times[0], 4),
        "graphs": None if reports is None else len(reports),
        "graphs_captured": None if reports is None else sum(r.captured for r in reports),
        "capture_keys": None if reports is None else sum(r.capture_keys for r in reports),
        "segments": None if reports is None else sum(len(r.segments) for r in reports),
        "uncaptured_reasons": None if reports is None else sorted({r.uncaptured_reason for r in reports} - {None}),
        "peak_memory_mb": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
        "max_abs_diff": max_diff,
        "ok": bool(ok),
        "samples_ms": [round(float(t), 4) for t in timed],
    }


def _ticker(bar: Progress | None, mode: str | None, total: int, warmup: int) -> Callable[[int], None]:
    """A progress callback for one mode: the bar shows compiling, warm-up, then measuring."""
    name = mode or "eager reference"
    if bar is None:
        return lambda i: None
    first = "first call" if mode in (None, "eager") else "compiling"
    task = bar.add_task(f"{name}: {first}", total=total)

    def tick(i: int) -> None:
        phase = "warm-up" if i + 1 < 1 + warmup else "measuring"
        bar.update(task, completed=i + 1, description=f"{name}: {phase}")

    return tick


def _progress(enabled: bool, console: Console | None) -> Any:
    console = console or Console(stderr=True)
    if not enabled or not console.is_terminal:
        return nullcontext(None)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        refresh_per_second=4,
    )


def results_table(result: dict[str, Any]) -> Table:
    """The result as a rich table: one row per mode (tokens/s, p10/p90 and raw samples are in the JSON)."""
    s = result["settings"]
    table = Table(
        title=f"tiny LLaMA {s['preset']!r} decode step · batch {s['batch']} · {s['dtype']} · {s['steps']} steps",
        caption=f"{result['device']} · torch {result['torch']} · kernel backend {s['kernel_backend']}\n"
        "ms/step: median wall time of one decode step (one token per sequence)",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
    )
    table.add_column("mode", min_width=15)
    for name in ("median\nms/step", "p10–p90\nms", "speedup\nvs eager", "compile\ns", "graphs\ncaptured", "segs"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("matches\neager", no_wrap=True)
    for r in result["results"]:
        captured = "—" if r["graphs"] is None else f"{r['graphs_captured']}/{r['graphs']}"
        speedup = "—" if r["speedup_vs_eager"] is None else f"{r['speedup_vs_eager']:.2f}x"
        match = "[green]✓[/]" if r["ok"] else "[red]✗[/]"
        table.add_row(
            r["mode"],
            f"{r['median_ms']:.3f}",
            f"{r['p10_ms']:.2f}–{r['p90_ms']:.2f}",
            speedup,
            "—" if r["compile_s"] is None else f"{r['compile_s']:.2f}",
            captured,
            "—" if r["segments"] is None else str(r["segments"]),
            f"{match} {r['max_abs_diff']:.0e}" if r["max_abs_diff"] else f"{match} 0",
        )
    return table


def print_results(result: dict[str, Any], console: Console | None = None) -> None:
    """Print the table, plus a note for modes that ran uncaptured."""
    console = console or Console()
    console.print(results_table(result))
    for r in result["results"]:
        for reason in r.get("uncaptured_reasons") or ():
            console.print(f"[dim]{r['mode']}: uncaptured: {reason}[/]")
    noisy = [r["mode"] for r in result["results"] if r["p90_ms"] > 3 * r["p10_ms"]]
    if noisy:
        console.print(
            f"[yellow]noisy timings[/] (p90 > 3 × p10) for {', '.join(noisy)}: something else competed for the "
            "device or CPU; rerun, or raise --steps"
        )
