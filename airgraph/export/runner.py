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
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from airgraph.export.check import (
    ExportInfo,
    RunError,
    check_inputs,
    check_outputs,
    describe,
    load_export,
    multi_rank_world,
    read_npz,
    reference,
    save_npz,
)

__all__ = ["RunError", "find_mpiexec", "main", "open_session", "run_export"]


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ModuleNotFoundError:
        raise RunError("running an export needs onnxruntime: pip install 'airgraph[export]'") from None
    return onnxruntime


def open_session(info: ExportInfo, providers: Sequence[str] | None = None) -> Any:
    """An onnxruntime InferenceSession of the export (CPU unless ``providers`` says otherwise)."""
    ort = _onnxruntime()

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
    ort = _onnxruntime()

    print(f"model: {info.model_path} (onnxruntime {ort.__version__}, {', '.join(session.get_providers()[:1])})")
    source = args.inputs or info.metadata["reference"]["inputs"]
    print(f"inputs ({source}): " + ", ".join(f"{name} {describe(a)}" for name, a in feeds.items()))
    outputs = _run(session, info, feeds)
    print("outputs:")
    for name, array in outputs.items():
        print(f"  {name}  {describe(array)}")
    if args.output:
        save_npz(outputs, args.output)
        print(f"wrote {args.output}")
    if not args.check:
        return 0
    return check_outputs(info, outputs, args.expected, rtol=args.rtol, atol=args.atol, say=print)


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
