"""Host placement benchmark (issue #4, GE's small-shape host placement): GPU only.

1. **fragment**: GE's Shape -> Gather -> Concat -> Reshape fragment as PyTorch code writes it (the shape as a
   tensor, gathered, concatenated with the remaining size, read back with ``.tolist()`` for a reshape). All on
   the device (host placement off) it is two blocking copies, kernels and two device-to-host syncs; placed, host
   arithmetic. Measured per call: "idle" (GPU idle, call + synchronize) and "busy" (a matmul queued just
   before, as inside a model step; the host time of the call, which a sync makes wait for the queue: the
   GE example's 3 ms -> 10 us). Target: all-on-device / placed >= 10x (busy).
2. **decode**: an HF-style decode step with dynamic shapes (the per-step bookkeeping of HF transformers'
   LlamaModel with a static cache: cache_position from the past length, position_ids, rotary cos/sin from
   position_ids, the 4D causal + padding mask, the next position read back as an int). Host placement off
   vs on: device kernel launches per step (torch.profiler: runtime launch calls), step latency, and
   device-to-host syncs per step. Targets: launches -30%, latency -5%.

Every timing runs before the profiler first runs (the counts come last, from steps compiled again): it leaves CUPTI
loaded (``TEARDOWN_CUPTI=0`` on the GPU checklist, which live CUDA graphs need), and CUDA calls cost the host more
from then on. (Until 2026-11-26 the placed variants were timed after the all-on-device ones were profiled.)

    python benchmarks/host_placement.py [--kernel-backend aten] [--steps 200] [--output PATH]

Writes JSON (device, torch version, commit) to benchmarks/results/host_placement_cuda.json. Without a GPU,
``--plan`` plans both steps for CUDA on fake tensors (``airgraph.plan``: nothing runs) with host placement off
and on, and counts per step what the GPU run would issue with the aten kernel backend (one launch per
op whose value is a CUDA tensor and not a view): device kernels, ``_to_copy`` ops with a CUDA result
(copies to the device, and dtype casts), and reads of a scalar into Python (``_local_scalar_dense``) not
placed on the host (a device-to-host sync each).
It writes benchmarks/results/host_placement_plan.json.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import airgraph
from airgraph.bench.results import environment, write_json

# Runtime calls, matched by prefix (cudaLaunchKernelExC, cuLaunchKernelEx; CUDA 13 builds launch through
# __cudaLaunchKernel, which torch's own profiler utilities count as a launch too).
LAUNCHES = (
    "cudaLaunchKernel",
    "__cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch",
)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
TARGETS = {
    "fragment busy: all-on-device / placed": ">= 10",
    "decode: kernel launches per step, placed / all-on-device": "<= 0.70",
    "decode: step latency, placed / all-on-device": "<= 0.95",
}


def fragment(x: torch.Tensor) -> torch.Tensor:
    shape = torch.tensor(x.shape, device=x.device)  # Shape
    first = torch.gather(shape, 0, torch.tensor([0], device=x.device))  # Gather
    new_shape = torch.cat([first, x.numel() // first])  # Concat
    return x.reshape(new_shape.tolist())  # Reshape


class HFStyleDecoder(nn.Module):
    """A small LLaMA-like decoder whose forward does, per decode step, what HF transformers' LlamaModel does
    around its layers with a static cache. ``attention_mask`` [B, past + S] grows by one every step."""

    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, max_len: int, batch: int, seed: int = 0):
        super().__init__()
        self.n_heads, self.head_dim, self.max_len = n_heads, dim // n_heads, max_len
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim, bias=False) for _ in range(n_layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(n_layers))
        self.gate_up = nn.ModuleList(nn.Linear(dim, 6 * dim, bias=False) for _ in range(n_layers))
        self.down = nn.ModuleList(nn.Linear(3 * dim, dim, bias=False) for _ in range(n_layers))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        hd = self.head_dim
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)), persistent=False)
        cache = (n_layers, batch, n_heads, max_len, hd)
        self.register_buffer("k_cache", torch.zeros(cache), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache), persistent=False)

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
        bsz, seq_len = tokens.shape
        past = attention_mask.shape[1] - seq_len
        cache_position = torch.arange(past, past + seq_len, device=tokens.device)
        position_ids = cache_position.unsqueeze(0).expand(bsz, -1)
        h = self.embed(tokens)
        inv_freq = self.inv_freq[None, :, None].float().expand(bsz, -1, 1)  # LlamaRotaryEmbedding
        freqs = (inv_freq @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        min_value = torch.finfo(h.dtype).min  # _prepare_4d_causal_attention_mask_with_cache_position
        mask = torch.full((seq_len, self.max_len), min_value, dtype=h.dtype, device=h.device)
        mask = mask * (torch.arange(self.max_len, device=h.device) > cache_position.reshape(-1, 1))
        mask = mask[None, None].expand(bsz, 1, -1, -1).clone()
        length = attention_mask.shape[-1]
        padding = (mask[..., :length] + attention_mask[:, None, None, :].to(h.dtype)) == 0
        mask[..., :length] = mask[..., :length].masked_fill(padding, min_value)
        for i in range(len(self.qkv)):
            q, k, v = self.qkv[i](self._norm(h)).view(bsz, seq_len, 3, self.n_heads, self.head_dim).unbind(2)
            q, k = self._rotate(q.transpose(1, 2), cos, sin), self._rotate(k.transpose(1, 2), cos, sin)
            self.k_cache[i].index_copy_(2, cache_position, k)
            self.v_cache[i].index_copy_(2, cache_position, v.transpose(1, 2))
            a = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask)
            h = h + self.proj[i](a.transpose(1, 2).reshape(bsz, seq_len, -1))
            gate, up = self.gate_up[i](self._norm(h)).chunk(2, dim=-1)
            h = h + self.down[i](F.silu(gate) * up)
        return self.lm_head(self._norm(h)), int(cache_position[-1]) + 1  # generate() reads the position back


def compile_step(fn: Any, *, placed: bool, args: argparse.Namespace, dynamic: bool | None) -> Callable[..., Any]:
    config = airgraph.CompilerConfig()
    config.mode = args.mode
    config.kernel_backend = args.kernel_backend
    config.passes.host_placement = placed
    config.host_placement.max_elements = args.max_elements
    torch._dynamo.reset()
    return torch.compile(fn, backend=airgraph.get_backend(config), dynamic=dynamic, fullgraph=True)


def runtime_counts(run: Callable[[int], Any], steps: int) -> dict[str, float]:
    """Per step, from torch.profiler: kernel launches (runtime calls), syncs, and copies each way (GPU side)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            run(i)
    names = [e.name for e in prof.events()]
    per_step = {
        "kernel_launches": sum(name.startswith(LAUNCHES) for name in names),
        "syncs": sum(name.startswith(SYNCS) for name in names),
        "copies_device_to_host": sum(n.startswith("Memcpy DtoH") for n in names),
        "copies_host_to_device": sum(n.startswith("Memcpy HtoD") for n in names),
    }
    return {k: v / steps for k, v in per_step.items()}


VARIANTS = ((False, "all_on_device"), (True, "placed"))  # host placement off, on


def fragment_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The fragment's host times, host placement off and on (no profiler has run yet: see :func:`main`)."""
    x = torch.randn(64, 256, device="cuda")
    busy = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    result: dict[str, Any] = {}
    for placed, name in VARIANTS:
        step = _fragment_step(x, placed, args)
        idle, queued = [], []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step(x)
            torch.cuda.synchronize()
            idle.append((time.perf_counter() - start) * 1e6)
            for _ in range(4):
                busy @ busy  # about a millisecond of queued device work, as inside a model step
            start = time.perf_counter()
            step(x)
            queued.append((time.perf_counter() - start) * 1e6)  # host time: a sync waits for the queue
            torch.cuda.synchronize()
        result[name] = {"idle_us": statistics.median(idle), "busy_us": statistics.median(queued)}
    result["busy_ratio"] = result["all_on_device"]["busy_us"] / result["placed"]["busy_us"]
    result["idle_ratio"] = result["all_on_device"]["idle_us"] / result["placed"]["idle_us"]
    return result


def fragment_counts(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per variant, the fragment's runtime calls per step (torch.profiler), compiled and warmed up again."""
    x = torch.randn(64, 256, device="cuda")
    counts = {}
    for placed, name in VARIANTS:
        step = _fragment_step(x, placed, args)
        counts[name] = runtime_counts(lambda i, step=step: step(x), 20)
    return counts


def _fragment_step(x: torch.Tensor, placed: bool, args: argparse.Namespace) -> Callable[..., Any]:
    step = compile_step(fragment, placed=placed, args=args, dynamic=False)
    for _ in range(20):
        torch.testing.assert_close(step(x), fragment(x))
    return step


def _decoder(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, list[torch.Tensor]]:
    """The decode benchmark's model (seeded), its tokens and its masks: the same ones on every call."""
    base = HFStyleDecoder(512, args.dim, args.layers, 4, max_len=args.steps + 64, batch=1).cuda().eval()
    tokens = torch.randint(0, 512, (args.steps + 32, 1, 1), generator=torch.Generator().manual_seed(0)).cuda()
    masks = [torch.ones(1, past + 1, device="cuda") for past in range(args.steps + 32)]
    return base, tokens, masks


def _decode_step(base: nn.Module, placed: bool, args: argparse.Namespace) -> Callable[..., Any]:
    """``base``'s decode step compiled on a copy of it (each variant its own caches)."""
    return compile_step(copy.deepcopy(base), placed=placed, args=args, dynamic=True)


def decode_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The decode step's latency, host placement off and on, and its outputs against eager (no profiler has run
    yet: see :func:`main`)."""
    base, tokens, masks = _decoder(args)
    reference = copy.deepcopy(base)
    result: dict[str, Any] = {}
    outputs: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        outputs["eager"] = [reference(tokens[i], masks[i])[0] for i in range(16)]
        for placed, name in VARIANTS:
            step = _decode_step(base, placed, args)
            outputs[name] = [step(tokens[i], masks[i])[0] for i in range(16)]
            for i in range(16, 32):  # warm-up (and the capture, in reduce-overhead)
                step(tokens[i], masks[i])
            samples = []
            for i in range(32, 32 + args.steps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                step(tokens[i], masks[i])
                torch.cuda.synchronize()
                samples.append((time.perf_counter() - start) * 1e3)
            result[name] = {"median_ms": statistics.median(samples)}
    for name in ("all_on_device", "placed"):
        for got, want in zip(outputs[name], outputs["eager"], strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    result["latency_ratio"] = result["placed"]["median_ms"] / result["all_on_device"]["median_ms"]
    return result


def decode_counts(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per variant, the decode step's runtime calls per step (torch.profiler), compiled and warmed up again, at the
    positions the timed steps started from."""
    base, tokens, masks = _decoder(args)
    counts = {}
    with torch.no_grad():
        for placed, name in VARIANTS:
            step = _decode_step(base, placed, args)
            for i in range(32):  # warm-up (and the capture, in reduce-overhead)
                step(tokens[i], masks[i])
            counts[name] = runtime_counts(lambda i, step=step: step(tokens[32 + i], masks[32 + i]), min(20, args.steps))
    if not counts["all_on_device"]["kernel_launches"]:
        raise RuntimeError(f"the profiler showed no kernel launch by name {LAUNCHES}: the counts would mean nothing")
    return counts


def _is_view(target: str) -> bool:
    """Whether the ATen op named ``target`` ("aten.view.default") only returns views of its inputs."""
    namespace, name, overload = [*target.split("."), "", ""][:3]
    op = getattr(getattr(getattr(torch.ops, namespace, None), name, None), overload, None)
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.returns:
        return target == "getitem"
    return all(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def planned_counts(report: Any) -> dict[str, Any]:
    """Per compiled graph of a planned step: what its device part would issue (see the module docstring)."""
    counts = {"device_kernels": 0, "device_copies": 0, "device_to_host_reads": 0, "host_ops": 0}
    for graph in report.graphs:
        for node in graph.nodes:
            if node.target in ("placeholder", "output"):
                continue
            on_device = (node.device or "").startswith("cuda")
            if node.placement == "host":
                counts["host_ops"] += 1
            elif node.target == "aten._local_scalar_dense.default":
                counts["device_to_host_reads"] += 1
            elif on_device and node.target == "aten._to_copy.default":
                counts["device_copies"] += 1
            elif on_device and not _is_view(node.target):
                counts["device_kernels"] += 1
    counts["moved"] = [name for graph in report.graphs for name in graph.host_placement.get("moved", [])]
    return counts


def plan_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Both benchmarks planned for CUDA on this machine (no GPU needed), placement off and on."""
    from airgraph.report.explain import plan

    result: dict[str, Any] = {}
    decoder = HFStyleDecoder(512, args.dim, args.layers, 4, max_len=args.steps + 64, batch=1).eval()
    steps = {
        "fragment": (fragment, (torch.randn(64, 256),), False),
        "decode": (decoder, (torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 40)), True),
    }
    for name, (fn, inputs, dynamic) in steps.items():
        row: dict[str, Any] = {}
        for placed in (False, True):
            config = airgraph.CompilerConfig()
            config.kernel_backend = "aten"
            config.passes.host_placement = placed
            config.host_placement.max_elements = args.max_elements
            torch._dynamo.reset()
            with torch.no_grad():
                report = plan(fn, *inputs, device="cuda", config=config, dynamic=dynamic)
            row["placed" if placed else "all_on_device"] = planned_counts(report)
        off, on = row["all_on_device"], row["placed"]
        row["kernel_ratio"] = on["device_kernels"] / max(off["device_kernels"], 1)
        result[name] = row
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="max-autotune", choices=["max-autotune", "reduce-overhead"])
    parser.add_argument("--kernel-backend", default="aten", choices=["aten", "inductor"])
    parser.add_argument("--max-elements", type=int, default=8, help="host_placement.max_elements")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--output", default=None)
    parser.add_argument("--plan", action="store_true", help="plan for CUDA on this machine and count (no GPU)")
    args = parser.parse_args(argv)
    torch._dynamo.config.capture_scalar_outputs = True  # .tolist() / int(tensor) stay in the graph
    if args.plan:
        planned = plan_bench(args)
        for name, row in planned.items():
            off, on = row["all_on_device"], row["placed"]
            print(
                f"{name} (planned): device kernels {off['device_kernels']} -> {on['device_kernels']} "
                f"({row['kernel_ratio']:.2f}), device-to-host reads {off['device_to_host_reads']} -> "
                f"{on['device_to_host_reads']}, device copies/casts {off['device_copies']} -> {on['device_copies']}, "
                f"moved: {', '.join(on['moved']) or 'nothing'}"
            )
        report = {
            **environment(torch.device("cpu")),
            "benchmark": "host_placement_plan",
            "settings": {k: v for k, v in vars(args).items() if k not in ("output", "plan")},
            "planned_for": "cuda (fake tensors, airgraph.plan; aten kernel backend: one launch per computing op)",
            **planned,
        }
        output = args.output or "benchmarks/results/host_placement_plan.json"
        write_json(report, output)
        print(f"wrote {output}")
        return 0
    if not torch.cuda.is_available():
        parser.error(
            "needs a CUDA GPU (run it on the GPU machine); on this machine, "
            "--plan counts what the GPU run would issue, from airgraph.plan(fn, *args, device='cuda')"
        )
    # Every timing first, then the profiler's counts: the profiler leaves CUPTI loaded (TEARDOWN_CUPTI=0 on the GPU
    # checklist, which live CUDA graphs need), and CUDA calls cost the host more from then on
    frag = fragment_bench(args)
    print(
        f"fragment: all-on-device {frag['all_on_device']['busy_us']:.1f} us, placed {frag['placed']['busy_us']:.1f} us "
        f"(busy GPU) -> {frag['busy_ratio']:.1f}x; idle {frag['idle_ratio']:.2f}x"
    )
    decode = decode_bench(args)
    for bench, counts in ((frag, fragment_counts(args)), (decode, decode_counts(args))):
        for name, row in counts.items():
            bench[name].update(row)
    decode["launch_ratio"] = decode["placed"]["kernel_launches"] / decode["all_on_device"]["kernel_launches"]
    off, on = decode["all_on_device"], decode["placed"]
    print(
        f"decode: launches/step {off['kernel_launches']:.1f} -> {on['kernel_launches']:.1f} "
        f"({decode['launch_ratio']:.2f}), latency {off['median_ms']:.3f} -> {on['median_ms']:.3f} ms "
        f"({decode['latency_ratio']:.3f}), syncs/step {off['syncs']:.1f} -> {on['syncs']:.1f}"
    )
    report = {
        **environment(torch.device("cuda")),
        "benchmark": "host_placement",
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "fragment": frag,
        "decode": decode,
        "targets": TARGETS,
        "met": {
            "fragment": frag["busy_ratio"] >= 10,
            "decode launches": decode["launch_ratio"] <= 0.70,
            "decode latency": decode["latency_ratio"] <= 0.95,
        },
    }
    output = args.output or "benchmarks/results/host_placement_cuda.json"
    write_json(report, output)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
