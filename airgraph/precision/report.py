"""CompareReport: what ``airgraph.compare`` found, as data, a table (``str(report)``) and a dict (``to_dict``).

``ok`` is true when every graph output and gradient is within its tolerance. ``first`` is the first located
divergence in execution order (graphs in the order they ran, segments in order), or None; ``divergences`` holds
one per segment that left the tolerance.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from airgraph.config import CompilerConfig
from airgraph.precision.before import BeforeKernels
from airgraph.precision.locate import Divergence
from airgraph.precision.tolerance import TensorDiff

__all__ = ["CompareReport"]


@dataclass
class CompareReport:
    values: list[TensorDiff]  # graph outputs and gradients
    divergences: list[Divergence] = field(default_factory=list)
    graphs: list[dict[str, Any]] = field(default_factory=list)  # each compiled graph: kind, segments, captured
    notes: list[str] = field(default_factory=list)
    dump_dir: str | None = None
    # A divergence made before the kernels (a decomposition or a pass; precision/before.py), when no segment left
    # the tolerance; and the config compared (what fallback() starts from).
    before: BeforeKernels | None = None
    config: CompilerConfig | None = None

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.values)

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    @property
    def tolerances(self) -> list[str]:
        """The tolerances used, each once (``rtol=... atol=... (torch.testing (float32))``)."""
        return list(dict.fromkeys(str(d.tolerance) for d in self.values))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "first": _divergence_dict(self.first) if self.first else None,
            "divergences": [_divergence_dict(d) for d in self.divergences],
            "values": [_diff_dict(d) for d in self.values],
            "graphs": self.graphs,
            "tolerances": self.tolerances,
            "before_kernels": self.before.to_dict() if self.before else None,
            "notes": self.notes,
            "dump_dir": self.dump_dir,
        }

    def fallback(self) -> CompilerConfig:
        """The config compared, with every divergence found running as eager would (precision/fallback.py): a
        segment's node through the aten backend, a decomposition not applied, a pass switched off."""
        from airgraph.precision.fallback import fallback_config

        return fallback_config(self)

    def table(self) -> Any:
        """The compared values, then the divergences, as one rich table."""
        from rich import box
        from rich.table import Table

        title = "airgraph compare: " + ("ok" if self.ok else "DIVERGES")
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
        for header, justify in [
            ("value", "left"),
            ("op", "left"),
            ("where", "left"),
            ("shape", "left"),
            ("dtype", "left"),
            ("max abs", "right"),
            ("max rel", "right"),
            ("within", "left"),
        ]:
            table.add_column(header, justify=justify)  # type: ignore[arg-type]
        for d in self.values:
            table.add_row(d.name, "", "", _shape(d), d.dtype, _num(d.max_abs), _num(d.max_rel), _within(d))
        for div in self.divergences:
            d = div.diff
            where = f"{div.source or '?'} {div.module or ''}".strip()
            name = f"{div.graph} seg {div.segment}: {div.node}"
            table.add_row(name, div.op, where, _shape(d), d.dtype, _num(d.max_abs), _num(d.max_rel), _within(d))
        return table

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=160, record=True, file=_Null())
        console.print(self.table())
        lines = [console.export_text().rstrip()]
        lines.append("tolerance: " + "; ".join(self.tolerances))
        first = self.first
        if first is not None:
            chosen = f"chosen by {first.chosen_by}"
            if first.bank_source:
                chosen += f" {first.bank_source}"
            lines.append(
                f"first divergence: {first.node} ({first.op}) in {first.graph}, segment {first.segment} "
                f"({first.backend}, {chosen}) at {first.source or 'an unknown line'}"
                + (f" `{first.code}`" if first.code else "")
                + (f" in {first.module}" if first.module else "")
                + f": max abs {_num(first.max_abs)}, max rel {_num(first.max_rel)}, {first.tolerance}"
            )
        if self.before is not None:
            lines.append(str(self.before))
        lines += self.notes
        if self.dump_dir:
            lines.append(f"dumps: {self.dump_dir}")
        return "\n".join(lines)


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _shape(d: TensorDiff) -> str:
    return "x".join(map(str, d.shape)) or "()"


def _num(value: float) -> str:
    return f"{value:.3g}"


def _within(d: TensorDiff) -> str:
    return "yes" if d.ok else ("NO: " + d.note if d.note else "NO")


def _diff_dict(d: TensorDiff) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    out["tolerance"] = dataclasses.asdict(d.tolerance)
    return out


def _divergence_dict(div: Divergence) -> dict[str, Any]:
    fields = ("graph", "segment", "backend", "chosen_by", "bank_source", "node", "op", "module", "source", "code")
    out: dict[str, Any] = {name: getattr(div, name) for name in fields}
    out["bank_source"] = {k: str(v) for k, v in div.bank_source.items()}
    out["diff"] = _diff_dict(div.diff)
    return out
