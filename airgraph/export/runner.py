"""Run an airgraph export with onnxruntime, without PyTorch: ``python -m airgraph.export.runner EXPORT_DIR``.

Also ``airgraph run EXPORT_DIR`` (the CLI dispatches here before anything imports torch). This module
imports only the standard library, numpy, onnxruntime and the torch-free ``airgraph.export.layout`` /
``airgraph.export.errors``; ``--assert-no-torch`` proves it by failing if ``torch`` got imported anyway.

- Inputs: ``--inputs FILE.npz`` (one array per ONNX input name), else the reference inputs saved at export.
  Names, dtypes, ranks and static dims are checked against ``export.json``, and a dynamic dim must have
  one size across the inputs (a size above the range torch.export validated is warned about).
- Output: each output's name, dtype and shape; ``--output FILE.npz`` saves them (one array per name).
- ``--check``: compares the outputs with the reference outputs saved at export (or ``--expected
  FILE.npz``, required with ``--inputs``) with ``numpy.allclose`` at :data:`TOLERANCES` for the dtype
  (``--rtol`` / ``--atol`` override; integers and bools must be equal), checks every file's size and
  sha256 against ``export.json``, prints the result and exits 1 on a mismatch.

Multi-rank exports (``<export_name><r>.onnx`` + ``rank_<r>/export.json`` per rank): the runner starts
``mpiexec -n WORLD python -m airgraph.export.runner EXPORT_DIR ... --mpi-worker`` (the ``mpiexec`` beside the
Python executable, from the ``mpich`` wheel, else the one on PATH, or ``--mpiexec PATH``); every process runs
its rank's model and serves the collective nodes with MPI (``mpi_runner.py``). Per rank: ``--inputs`` and
``--expected`` may hold ``{rank}`` (one file per rank; without it every rank reads the same file), ``--output
out.npz`` writes ``out.rank<r>.npz``; output lines start with ``[rank r]``; ``--check`` checks each rank
against its own reference outputs. The exit code is the highest of the ranks'.

Exit codes: 0 success; 1 ``--check`` found a difference; 2 an unusable export, bad inputs or options.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airgraph.export.layout import FORMAT, FORMAT_VERSION, METADATA_FILE, rank_metadata_files
from airgraph.store import file_digest

__all__ = [
    "TOLERANCES",
    "ExportInfo",
    "RunError",
    "compare",
    "file_digest",
    "load_export",
    "main",
    "multi_rank_world",
    "open_session",
    "reference",
    "run_export",
    "save_npz",
]

# (rtol, atol) per output dtype for --check; integer and bool outputs must match exactly.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


class RunError(Exception):
    """An export that cannot be run as asked (missing files, wrong inputs, bad options): exit code 2."""


@dataclass(frozen=True)
class ExportInfo:
    """A loaded export: its folder and its ``export.json``."""

    root: Path
    metadata: dict[str, Any]

    @property
    def model_path(self) -> Path:
        return self.root / self.metadata["model_file"]

    def path(self, rel: str) -> Path:
        return self.root / rel


def multi_rank_world(export_dir: str | os.PathLike[str]) -> int | None:
    """The world size of a multi-rank export in ``export_dir`` (None: a single-process export or none).

    Raises :class:`RunError` if a rank's ``rank_<r>/export.json`` is missing (an incomplete export).
    """
    root = Path(export_dir)
    if (root / METADATA_FILE).is_file():
        return None
    metas = rank_metadata_files(root)
    if not metas:
        return None
    try:
        first = json.loads(next(iter(metas.values())).read_text(encoding="utf-8"))
        world = int(first["distributed"]["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunError(
            f"{root}: a rank's {METADATA_FILE} is unreadable or has no distributed.world_size: {exc}"
        ) from None
    missing = [r for r in range(world) if r not in metas]
    if missing:
        raise RunError(f"{root}: incomplete multi-rank export: no rank_<r>/{METADATA_FILE} for ranks {missing}")
    return world


def load_export(export_dir: str | os.PathLike[str], rank: int | None = None) -> ExportInfo:
    """Read ``EXPORT_DIR/export.json`` (``rank_<rank>/export.json`` with a rank) and check the files it lists."""
    root = Path(export_dir)
    meta_path = root / METADATA_FILE if rank is None else root / f"rank_{rank}" / METADATA_FILE
    if not meta_path.is_file():
        if rank is None and rank_metadata_files(root):
            raise RunError(f"{root} holds a multi-rank export; run it with `airgraph run` (one process per rank)")
        raise RunError(f"{meta_path}: missing: not an airgraph export, or an incomplete one")
    try:
        metadata = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"{meta_path}: unreadable: {exc}") from None
    if metadata.get("format") != FORMAT or not isinstance(metadata.get("format_version"), int):
        raise RunError(f"{meta_path}: not an airgraph export (format {metadata.get('format')!r})")
    if metadata["format_version"] > FORMAT_VERSION:
        raise RunError(f"{meta_path}: format version {metadata['format_version']} is newer than this runner's")
    info = ExportInfo(root, metadata)
    for rel, entry in metadata.get("files", {}).items():
        path = info.path(rel)
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            raise RunError(f"{path}: missing or not the size export.json records ({entry['bytes']} bytes)")
    return info


def read_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: cannot read as .npz: {exc}") from None


def check_inputs(info: ExportInfo, feeds: dict[str, np.ndarray]) -> list[str]:
    """Raise :class:`RunError` if ``feeds`` do not fit the model's inputs; return warnings."""
    specs = info.metadata["inputs"]
    names = [s["name"] for s in specs]
    missing, extra = [n for n in names if n not in feeds], [n for n in feeds if n not in names]
    if missing or extra:
        raise RunError(f"inputs: missing {missing}, unexpected {extra}; the model takes {names}")
    sizes: dict[str, tuple[int, str]] = {}
    warnings = []
    for spec in specs:
        array, name = feeds[spec["name"]], spec["name"]
        if array.dtype.name != spec["dtype"]:
            raise RunError(f"input {name!r}: dtype {array.dtype.name}, the model takes {spec['dtype']}")
        if array.ndim != len(spec["shape"]):
            raise RunError(f"input {name!r}: shape {list(array.shape)}, the model takes {spec['shape']}")
        for axis, (size, dim) in enumerate(zip(array.shape, spec["shape"], strict=True)):
            where = f"{name}[{axis}]"
            if isinstance(dim, int) and size != dim:
                raise RunError(f"input {name!r}: shape {list(array.shape)}, the model takes {spec['shape']}")
            if isinstance(dim, str):
                if dim in sizes and sizes[dim][0] != size:
                    raise RunError(f"dynamic dim {dim!r}: {where} is {size} but {sizes[dim][1]} is {sizes[dim][0]}")
                sizes[dim] = (size, where)
    for dim, (size, where) in sizes.items():
        high = info.metadata.get("dynamic_dims", {}).get(dim, {}).get("max")
        if high is not None and size > high:
            warnings.append(
                f"dynamic dim {dim!r} = {size} ({where}) is above the range torch.export validated (max {high})"
            )
    return warnings


def open_session(info: ExportInfo, providers: Sequence[str] | None = None) -> Any:
    """An onnxruntime InferenceSession of the export (CPU unless ``providers`` says otherwise)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(
            str(info.model_path), sess_options=options, providers=list(providers or ["CPUExecutionProvider"])
        )
    except Exception as exc:  # onnxruntime raises its own exception types
        raise RunError(f"{info.model_path}: onnxruntime cannot load it: {exc}") from None


def run_export(
    export_dir: str | os.PathLike[str],
    inputs: dict[str, np.ndarray] | None = None,
    *,
    providers: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run the export on ``inputs`` (default: its reference inputs); returns ``{output name: array}``."""
    info = load_export(export_dir)
    feeds = inputs if inputs is not None else reference(info, "inputs")
    check_inputs(info, feeds)
    return _run(open_session(info, providers), info, feeds)


def _run(session: Any, info: ExportInfo, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o["name"] for o in info.metadata["outputs"]]
    try:
        results = session.run(names, feeds)
    except Exception as exc:
        raise RunError(f"onnxruntime failed to run the model: {exc}") from None
    return dict(zip(names, results, strict=True))


def reference(info: ExportInfo, which: str) -> dict[str, np.ndarray]:
    """The reference ``"inputs"`` or ``"outputs"`` saved at export."""
    rel = (info.metadata.get("reference") or {}).get(which)
    if rel is None:
        reason = (info.metadata.get("reference") or {}).get("skipped", "none was saved")
        raise RunError(f"no reference {which} in this export ({reason})")
    return read_npz(info.path(rel))


def compare(
    outputs: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[dict[str, Any]]:
    """One record per expected output: name, ok, max_abs_diff, rtol, atol, and a reason when not ok."""
    records = []
    for name, want in expected.items():
        got = outputs.get(name)
        default = TOLERANCES.get(want.dtype.name, (0.0, 0.0))
        r, a = default[0] if rtol is None else rtol, default[1] if atol is None else atol
        record: dict[str, Any] = {"name": name, "ok": False, "max_abs_diff": None, "rtol": r, "atol": a}
        if got is None:
            record["reason"] = "no such output"
        elif got.shape != want.shape or got.dtype != want.dtype:
            record["reason"] = f"got {got.dtype.name}{list(got.shape)}, expected {want.dtype.name}{list(want.shape)}"
        else:
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            record["max_abs_diff"] = float(diff.max()) if diff.size else 0.0
            record["ok"] = bool(np.allclose(got, want, rtol=r, atol=a, equal_nan=True))
            if not record["ok"]:
                record["reason"] = f"max abs diff {record['max_abs_diff']:.3g} beyond rtol={r:g}, atol={a:g}"
        records.append(record)
    return records


def save_npz(arrays: dict[str, np.ndarray], path: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fmt(array: np.ndarray) -> str:
    return f"{array.dtype.name}[{', '.join(str(d) for d in array.shape)}]"


def build_parser(prog: str = "python -m airgraph.export.runner") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run an airgraph export (dynamo_export / `airgraph export`) with onnxruntime, without PyTorch.",
    )
    parser.add_argument("export_dir", metavar="EXPORT_DIR", help="the export folder (holds export.json)")
    parser.add_argument("--inputs", metavar="FILE.npz", help="one array per input name (default: reference inputs)")
    parser.add_argument("--check", action="store_true", help="compare with the reference outputs; exit 1 if any differ")
    parser.add_argument("--expected", metavar="FILE.npz", help="outputs to compare with (default: reference outputs)")
    parser.add_argument("--output", metavar="FILE.npz", help="save the outputs, one array per output name")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance of --check (default per dtype)")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance of --check (default per dtype)")
    parser.add_argument("--provider", action="append", help="onnxruntime execution provider (repeatable; default CPU)")
    parser.add_argument("--assert-no-torch", action="store_true", help="exit 2 if torch got imported (for tests)")
    parser.add_argument(
        "--mpiexec", metavar="PATH", help="mpiexec for a multi-rank export (default: the mpich wheel's)"
    )
    parser.add_argument(
        "--mpi-worker", action="store_true", help="run as one rank under mpiexec (what `airgraph run` starts)"
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m airgraph.export.runner") -> int:
    """Entry point; returns the exit code (0 ok, 1 check failed, 2 usage or export error)."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        code = _main(args)
    except RunError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        code = 2
    if args.assert_no_torch and "torch" in sys.modules:
        print(f"{prog}: error: torch was imported", file=sys.stderr)
        return 2
    return code


def _main(args: argparse.Namespace) -> int:
    if args.check and args.inputs and not args.expected:
        raise RunError(
            "--check with --inputs needs --expected FILE.npz (the reference outputs fit the reference inputs)"
        )
    if args.mpi_worker:
        from airgraph.export.mpi_runner import worker_main

        return worker_main(args, "airgraph run")
    world = multi_rank_world(args.export_dir)
    if world is not None:
        return _launch_ranks(args, world)
    info = load_export(args.export_dir)
    feeds = read_npz(args.inputs) if args.inputs else reference(info, "inputs")
    for warning in check_inputs(info, feeds):
        print(f"warning: {warning}", file=sys.stderr)
    session = open_session(info, args.provider)
    import onnxruntime as ort

    print(f"model: {info.model_path} (onnxruntime {ort.__version__}, {', '.join(session.get_providers()[:1])})")
    source = args.inputs or info.metadata["reference"]["inputs"]
    print(f"inputs ({source}): " + ", ".join(f"{name} {_fmt(a)}" for name, a in feeds.items()))
    outputs = _run(session, info, feeds)
    print("outputs:")
    for name, array in outputs.items():
        print(f"  {name}  {_fmt(array)}")
    if args.output:
        save_npz(outputs, args.output)
        print(f"wrote {args.output}")
    if not args.check:
        return 0
    return check_outputs(info, outputs, args.expected, rtol=args.rtol, atol=args.atol, say=print)


def check_outputs(
    info: Any,
    outputs: dict[str, np.ndarray],
    expected_path: str | None,
    *,
    rtol: float | None,
    atol: float | None,
    say: Callable[[str], Any],
) -> int:
    """``--check``: the export's files still hash as written, and ``outputs`` match the expected outputs
    (``expected_path``, else the reference saved at export). Says one line per failure, or one ok line;
    returns the exit code (0 or 1). Shared by the single-process and the MPI runner."""
    for rel, entry in info.metadata.get("files", {}).items():
        if file_digest(info.path(rel)) != entry["sha256"]:
            say(f"check: FAILED: {rel} differs from the file written at export (sha256)")
            return 1
    expected = read_npz(expected_path) if expected_path else reference(info, "outputs")
    records = compare(outputs, expected, rtol=rtol, atol=atol)
    bad = [r for r in records if not r["ok"]]
    for r in bad:
        say(f"check: FAILED: output {r['name']!r}: {r['reason']}")
    if bad:
        return 1
    worst = max((r["max_abs_diff"] or 0.0 for r in records), default=0.0)
    tol = ", ".join(sorted({f"rtol={r['rtol']:g}, atol={r['atol']:g}" for r in records}))
    say(f"check: ok: {len(records)} output(s) match the reference ({tol}; max abs diff {worst:.3g})")
    return 0


def find_mpiexec(explicit: str | None = None) -> str:
    """``explicit``, else the ``mpiexec`` beside the Python executable (mpich wheel), else the one on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RunError("a multi-rank export needs mpiexec: pip install mpi4py mpich (or give --mpiexec PATH)")
    return found


def _launch_ranks(args: argparse.Namespace, world: int) -> int:
    """``mpiexec -n WORLD python -m airgraph.export.runner ... --mpi-worker``; returns its exit code."""
    argv = [args.export_dir]
    for flag in ("inputs", "expected", "output", "rtol", "atol"):
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag}", str(value)]
    for provider in args.provider or ():
        argv += ["--provider", provider]
    argv += ["--check"] * args.check + ["--assert-no-torch"] * args.assert_no_torch + ["--mpi-worker"]
    command = [find_mpiexec(args.mpiexec), "-n", str(world), sys.executable, "-m", "airgraph.export.runner", *argv]
    print(f"multi-rank export: {world} ranks, {' '.join(command[:3])} ...", flush=True)
    try:
        return subprocess.call(command)
    except OSError as exc:
        raise RunError(f"cannot start {command[0]}: {exc}") from None


if __name__ == "__main__":
    raise SystemExit(main())
