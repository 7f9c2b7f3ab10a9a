"""Run the seed's multi-card ``dynamo_export`` example (seed 004, ``AllReduceSingeGroup``) many times, under
load, and count how each run ended (issue #20: it died at exit now and then).

Each run is what a user does: the seed's script (``SEED``: the seed's code with airgraph's imports, the port
from the environment) is written into a fresh folder, ``python example.py`` runs there (``mp()``: two ranks
through ``torch.multiprocessing.spawn``, gloo, ``dynamo_export`` with ``auto_atc_config_generated`` and
``enable_record_nn_module_stack``), and the folder is removed when the run is over, as a test's or a
script's temporary folder is. A run is clean when the script exits 0, its stderr holds none of the
signatures below and it wrote every file of the seed's export. Besides the exit, each run records the
processes of the run still alive once the script exited (anything whose working directory is the run's
folder) and output written after the exit: a run that looks clean with either is counted apart.

Load: ``--burners K`` processes spinning on the CPU beside the runs.

    python scripts/stress_export_exit.py --runs 50 --burners 1 --output benchmarks/results/export_exit_cpu.json

``--python PY`` runs the script with another interpreter (a plain venv's); ``--disturb`` varies a condition
during the runs, on the torch that interpreter imports (use a throwaway venv for the last two):

- ``evict``: before each run, drop torch's files from the page cache (``posix_fadvise(DONTNEED)``), so every
  process of the run reads torch cold;
- ``replace``: all along, put a new copy of ``torch/lib/libtorch_cpu.so`` in place every half second
  (``rename`` over it, another inode each time, as an installer does);
- ``reinstall``: all along, ``pip install --force-reinstall --no-deps`` of that venv's torch wheel.

Besides each run's exit, a watcher samples ``/proc/<pid>/cwd`` of the run's processes every 20 ms and records
any whose working folder is gone (`` (deleted)``): the one condition under which torch's import prints the
MKL message (below).

Prints one line per run, then the counts by kind; ``--output`` writes them as JSON (after every run, with
``complete`` false until the last) with the machine, the versions and the commit. ``--keep-failed DIR`` keeps
the stderr of each run that was not clean.

Issue #20's death, "Intel oneMKL FATAL ERROR: Cannot load .../torch/lib/libtorch_cpu.so" and exit code 2, is
not made at exit: the MKL loader linked into libtorch_cpu.so calls getcwd() in a constructor that runs when
torch is imported and exits so when it fails, that is when the process's working folder was removed
(tests/export/test_export_exit.py). A rank of the seed's script imports torch in the run's folder right after
``torch.multiprocessing.spawn`` started it, and arms its parent-death signal only afterwards; a harness that
removes a run's folder before every process of the run is gone (``subprocess.run(timeout=...)`` in a
``TemporaryDirectory`` kills the script alone and leaves its ranks) can have a rank die so. This script runs
each run as a session of its own, kills the whole session on a timeout and removes the folder only once no
process works in it. Two ways to see the death on purpose:

- ``--remove-at-rank-start 1``: remove the folder one second after the first rank started (fault injection);
- ``--on-timeout parent --timeout T``: the naive harness above; it leaves the ranks running in a removed
  folder, which die so only when T lands in their import (with T = 17 s and 25 s on 2 busy cores, 8 runs:
  the ranks were past it, in the TCPStore rendezvous).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# The seed's example2.py (004_d5cec901f1b8323a.txt): TorchAir's imports replaced by airgraph's, the comma
# missing after export_name restored, the port taken from the environment (runs do not share one).
SEED = """\
import torch, os
from airgraph.compat import torchair
from airgraph.compat.torchair import CompilerConfig

class AllReduceSingeGroup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p1 = torch.nn.Parameter(torch.tensor([[1.1, 1.1], [1.1, 1.1]]))
        self.p2 = torch.nn.Parameter(torch.tensor([[2.2, 2.2], [3.3, 3.3]]))

    def forward(self, x, y):
        x = x + y + self.p1 + self.p2
        torch.distributed.all_reduce(x)
        return x

def example(rank, world_size):
       torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
       x = torch.ones([2, 2], dtype=torch.int32)
       y = torch.ones([2, 2], dtype=torch.int32)
       mod = AllReduceSingeGroup()
       config = CompilerConfig()
       config.export.experimental.auto_atc_config_generated = True
       config.export.experimental.enable_record_nn_module_stack = True
       torchair.dynamo_export(x, y, model=mod, dynamic=True, export_path="./mp", export_name="mp_rank", config=config)
       if os.environ.get("STRESS_DESTROY") == "1":
           torch.distributed.destroy_process_group()

def mp():
    world_size = 2
    torch.multiprocessing.spawn(example, args=(world_size, ), nprocs=world_size, join=True)

if __name__ == '__main__':
     os.environ["MASTER_ADDR"] = "localhost"
     os.environ["MASTER_PORT"] = os.environ["STRESS_PORT"]
     mp()
"""
SEED_FILES = ["mp/mp_rank0.onnx", "mp/mp_rank1.onnx", "mp/model_relation_config.json", "mp/numa_config.json"]

# stderr signature -> kind (first match wins)
SIGNATURES = [
    ("mkl_cannot_load", re.compile(r"Intel oneMKL FATAL ERROR: Cannot load")),
    ("mkl_fatal", re.compile(r"oneMKL FATAL ERROR")),
    ("terminate_called", re.compile(r"terminate called")),
    ("rank_signal", re.compile(r"process \d+ terminated with signal")),
    ("rank_exit_code", re.compile(r"process \d+ terminated with exit code")),
    ("segfault", re.compile(r"Segmentation fault|SIGSEGV")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
]


RUNNING: list[int] = []  # the session of the run in progress, killed with the harness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_burners(count: int) -> list[subprocess.Popen]:
    # spins until its harness is gone, whatever ended the harness
    code = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(10**6): pass"
    return [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL) for _ in range(count)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def processes_in(folder: Path) -> list[dict[str, Any]]:
    """Processes whose working directory is ``folder`` or below it (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            if cwd == str(folder) or cwd.startswith(f"{folder}/"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append({"pid": int(entry.name), "cmdline": cmd[:300]})
        except OSError:
            continue
    return found


def wait_for_processes(folder: Path, grace: float) -> list[dict[str, Any]]:
    """Wait up to ``grace`` seconds for the processes working in ``folder`` to end; those still there."""
    deadline = time.monotonic() + grace
    while (left := processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def remove_at_rank_start(folder: Path, proc: subprocess.Popen, delay: float) -> None:
    """Fault injection (``--remove-at-rank-start``): once a rank of the run has started (a process of
    ``multiprocessing.spawn`` working in the folder), wait ``delay`` seconds, then remove the run's folder,
    as a harness or a cleaner that removes the folder of a run still in progress does."""
    while proc.poll() is None:
        if any("spawn_main" in p["cmdline"] for p in processes_in(folder)):
            time.sleep(delay)
            shutil.rmtree(folder, ignore_errors=True)
            return
        time.sleep(0.05)


def watch_cwds(proc: subprocess.Popen, gone: list[dict[str, Any]], start: float) -> None:
    """Until the run's script exits, record each process of its session whose working folder was removed
    (``/proc/<pid>/cwd`` reads ``<path> (deleted)``)."""
    seen: set[int] = set()
    while proc.poll() is None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in seen:
                continue
            try:
                if os.getsid(int(entry.name)) != proc.pid:
                    continue
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.endswith(" (deleted)"):
                seen.add(int(entry.name))
                gone.append({"pid": int(entry.name), "cwd": cwd, "at_s": round(time.perf_counter() - start, 2)})
        time.sleep(0.02)


def torch_dir(python: str) -> Path:
    """The torch package folder ``python`` imports (found without importing it)."""
    code = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    return Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def evict(folder: Path) -> int:
    """Drop the files under ``folder`` from the page cache; the bytes advised."""
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    total += os.fstat(fd).st_size
                finally:
                    os.close(fd)
    return total


class Disturber:
    """``--disturb replace|reinstall``: a thread that changes the runs' torch on disk until stopped."""

    def __init__(self, kind: str, python: str, wheel: str | None) -> None:
        self.kind, self.python, self.wheel = kind, python, wheel
        self.lib = torch_dir(python) / "lib" / "libtorch_cpu.so"
        self.count = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Disturber:
        if self.kind == "replace":  # two copies of the library, put in place in turn (no copying in the loop)
            for name in ("a", "b"):
                shutil.copy2(self.lib, self.lib.with_name(f".stress-{name}.so"))
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.kind == "replace":
                    source = self.lib.with_name(f".stress-{'ab'[self.count % 2]}.so")
                    staged = self.lib.with_name(".stress-staged.so")
                    os.link(source, staged)
                    os.replace(staged, self.lib)
                    self._stop.wait(0.5)
                else:
                    command = [self.python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", self.wheel]
                    done = subprocess.run(command, capture_output=True, text=True)
                    if done.returncode != 0:
                        self.errors.append(done.stderr[-500:])
                self.count += 1
            except OSError as exc:
                self.errors.append(str(exc))
                self._stop.wait(1.0)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        if self.kind == "replace":
            with contextlib.suppress(OSError):
                os.replace(self.lib.with_name(".stress-a.so"), self.lib)
            with contextlib.suppress(OSError):
                os.remove(self.lib.with_name(".stress-b.so"))
        return {"kind": self.kind, "target": str(self.lib), "times": self.count, "errors": self.errors[:5]}


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def classify(rc: int, stderr: str, missing: list[str], stragglers: list, late_output: bool) -> str:
    kinds = [name for name, pattern in SIGNATURES if pattern.search(stderr)]
    if rc == 0 and not kinds and not missing and not stragglers and not late_output:
        return "clean"
    parts = [f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"]
    parts += kinds[:1]
    if missing:
        parts.append("files missing")
    if stragglers:
        parts.append("processes left")
    if late_output:
        parts.append("output after exit")
    return ", ".join(parts)


def one_run(index: int, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the seed's script in a fresh folder, removed afterwards (see the module docstring).

    ``--on-timeout group`` (default): the run is a session of its own; a run past ``--timeout`` loses every
    process of its session, and the folder is removed once no process works in it any more (``--grace``).
    ``--on-timeout parent``: what ``subprocess.run(timeout=...)`` in a ``TemporaryDirectory`` does: only the
    script is killed and the folder is removed at once, whatever of the run still runs in it; the ranks it
    leaves are killed after ``--linger`` seconds, once their output is in.
    """
    folder = Path(tempfile.mkdtemp(prefix=f"run{index:04d}-", dir=base / "runs"))
    (folder / "example.py").write_text(SEED)
    env = dict(os.environ, STRESS_PORT=str(free_port()), STRESS_DESTROY="1" if args.destroy else "0")
    env.update(dict(kv.split("=", 1) for kv in args.env))
    out, err = base / "logs" / f"run{index:04d}.stdout", base / "logs" / f"run{index:04d}.stderr"
    start = time.perf_counter()
    timed_out = False
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(
            [args.python, "example.py"], cwd=folder, env=env, stdout=fo, stderr=fe, start_new_session=True
        )
        RUNNING[:] = [proc.pid]
        gone: list[dict[str, Any]] = []
        watcher = threading.Thread(target=watch_cwds, args=(proc, gone, start), daemon=True)
        watcher.start()
        if args.remove_at_rank_start is not None:
            threading.Thread(target=remove_at_rank_start, args=(folder, proc, args.remove_at_rank_start)).start()
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            if args.on_timeout == "group":
                kill_group(proc.pid)
            else:
                proc.kill()
            rc = proc.wait()
    watcher.join()
    wall = time.perf_counter() - start
    size = err.stat().st_size
    if args.on_timeout == "group":
        stragglers = wait_for_processes(folder, args.grace)
    else:
        stragglers = processes_in(folder)
    files = {f: (folder / f).is_file() for f in SEED_FILES}
    shutil.rmtree(folder, ignore_errors=True)  # as a temporary folder goes when the run is over
    if args.linger:
        time.sleep(args.linger)
    kill_group(proc.pid)  # what the run left (its session), after the output it wrote
    late_output = err.stat().st_size != size
    stderr = err.read_text(errors="replace")
    missing = [f for f, there in files.items() if not there]
    kind = classify(rc, stderr, missing, stragglers, late_output)
    if timed_out:
        kind = f"timeout ({kind})"
    record = {"run": index, "kind": kind, "rc": rc, "wall_s": round(wall, 2), "cwd_gone": gone}
    if kind != "clean":
        record.update(stderr_tail=stderr[-3000:], missing=missing, stragglers=stragglers, late_output=late_output)
        if args.keep_failed:
            dest = Path(args.keep_failed)
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(err, dest / err.name)
            record["kept"] = str(dest / err.name)
    return record


def environment(python: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            models = (line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
            info["cpu_model"] = next(models, None)
    except OSError:
        pass
    code = "import sys, torch; print(torch.__version__, torch.__file__, sys.prefix, sys.base_prefix)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    info["runs_python"] = python
    if len(out) == 4:
        info["torch"], info["torch_file"], info["prefix"], info["base_prefix"] = out
    info["mkl_env"] = {k: v for k, v in os.environ.items() if k.startswith(("MKL_", "LD_", "OMP_", "KMP_"))}
    git = ["git", "-C", str(REPO)]
    info["commit"] = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    info["dirty"] = bool(dirty.stdout.strip())
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside the runs")
    parser.add_argument("--destroy", action="store_true", help="call destroy_process_group after the export")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed")
    parser.add_argument("--on-timeout", choices=["group", "parent"], default="group", help="see one_run")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds for a run's processes to end")
    parser.add_argument("--linger", type=float, default=2.0, help="seconds to watch for output after the run")
    parser.add_argument(
        "--remove-at-rank-start",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fault injection: remove a run's folder this long after its first rank started",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the script")
    parser.add_argument("--disturb", choices=["none", "evict", "replace", "reinstall"], default="none")
    parser.add_argument("--wheel", default=None, help="the torch wheel --disturb reinstall installs")
    parser.add_argument("--note", default=None, help="what else was going on (recorded)")
    parser.add_argument("--base", default=None, help="folder for the runs' folders (default: the temp dir)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="for the runs")
    parser.add_argument("--keep-failed", default=None, metavar="DIR")
    parser.add_argument("--output", default=None, help="JSON file for the result")
    parser.add_argument("--stop-after-failures", type=int, default=0, help="stop after this many (0: never)")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="stress-export-exit-", dir=args.base))
    (base / "runs").mkdir()
    (base / "logs").mkdir()

    def terminated(*_: Any) -> None:  # a killed harness stops its burners and its run in progress too
        for pgid in RUNNING:
            kill_group(pgid)
        sys.exit(143)

    signal.signal(signal.SIGTERM, terminated)
    burners = start_burners(args.burners)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    env_info = environment(args.python)
    disturber = (
        Disturber(args.disturb, args.python, args.wheel).start() if args.disturb in ("replace", "reinstall") else None
    )
    disturbed: dict[str, Any] = {"kind": args.disturb}

    def result(complete: bool) -> dict[str, Any]:
        counts = Counter(r["kind"] for r in records)
        walls = sorted(r["wall_s"] for r in records)
        loads = [r["loadavg_1min"] for r in records]
        return {
            "benchmark": "stress_export_exit",
            "what": "the seed's multi-card dynamo_export example (two spawned ranks, gloo), one process per run",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "complete": complete,
            "runs": len(records),
            "load": {
                "cpu_burners": args.burners,
                "env": args.env,
                "loadavg_1min_at_runs": {"min": min(loads), "max": max(loads)} if loads else None,
            },
            "harness": {
                "timeout_s": args.timeout,
                "on_timeout": args.on_timeout,
                "grace_s": args.grace,
                "remove_at_rank_start_s": args.remove_at_rank_start,
            },
            "destroy_process_group": args.destroy,
            "disturb": disturbed,
            "note": args.note,
            "counts": dict(counts),
            "clean": counts.get("clean", 0),
            "wall_s": {"min": walls[0], "median": walls[len(walls) // 2], "max": walls[-1]} if walls else None,
            "total_s": round(time.perf_counter() - start, 1),
            "environment": env_info,
            "failures": [r for r in records if r["kind"] != "clean"],
        }

    def save(complete: bool) -> None:
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(result(complete), indent=2) + "\n")

    try:
        for index in range(args.runs):
            if args.disturb == "evict":
                disturbed["evicted_bytes"] = evict(torch_dir(args.python))
                disturbed["times"] = index + 1
            load = os.getloadavg()[0]
            record = one_run(index, base, args)
            record["loadavg_1min"] = round(load, 2)
            records.append(record)
            print(f"run {index}: {record['kind']} ({record['wall_s']} s, load {load:.1f})", flush=True)
            if record["kind"] != "clean":
                print(record.get("stderr_tail", "")[-1500:], flush=True)
            save(complete=False)  # a harness stopped early leaves the runs done so far
            failures = sum(r["kind"] != "clean" for r in records)
            if args.stop_after_failures and failures >= args.stop_after_failures:
                break
    finally:
        if disturber is not None:
            disturbed.update(disturber.stop())
        stop(burners)
        shutil.rmtree(base, ignore_errors=True)
    save(complete=True)
    counts = Counter(r["kind"] for r in records)
    print(f"{len(records)} runs, {args.burners} burners: {dict(counts)}")
    return 0 if counts.get("clean", 0) == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
