"""Loading an AOTInductor package, and the probe that makes sure it does not kill the process that loads it.

Loading a package runs native code, and where that code and the environment disagree the loader can die with a
segmentation fault, which cannot be caught. So no user process is the first to load a package in an environment:

- **the environment** (:func:`environment`): torch build, Python, the machine as airgraph/machine.py reads it,
  the package format with the device type, and the C++ compiler that built the package; its digest keys the verdict;
- **the probe** (:meth:`LoadProbes.check`): before the first in-process load in an environment, a child process
  (``python -m airgraph.kernels.probe``, with a timeout) loads the very file about to be loaded through the same
  call (:func:`open_package`) and runs it once on example inputs of its shape key;
- **the verdict**, kept beside the library in ``load-probes.json`` (``write_json_atomic`` under its own lock):
  "ok" (exit 0): later processes load in-process without a probe; "crashed" (a signal, or past :data:`TIMEOUT`):
  later processes skip the library's packages with one warning and run dynamic kernels. A Python error leaves
  no verdict; that kernel is refused in this process.

Processes starting together probe once; a torn or foreign verdict file is treated as absent; an unwritable
library gets a probe per process. Why, and what was seen on the GPU machines: docs/design/static-kernel-loading.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from airgraph.log import warn_once
from airgraph.machine import fingerprint
from airgraph.store import StoreError, locked, read_json, write_json_atomic

__all__ = ["FILE", "FORMAT", "TIMEOUT", "LoadProbes", "Verdict", "environment", "open_package"]

FILE = "load-probes.json"
FORMAT = "airgraph-load-probes"
VERSION = 1
PACKAGE_FORMAT = "aoti-pt2"
TIMEOUT = 180.0  # seconds a probe may take (import torch, load, one run) before it counts as a crash (a hang)

_VERDICTS: dict[tuple[str, str], Verdict] = {}  # (verdict file, environment digest) -> verdict, per process


def open_package(path: Path, device: torch.device) -> Any:
    """The package loader of an AOTInductor package (kernels/build.py made it) for ``device``.

    Through the package loader itself (``torch._C._aoti.AOTIModelPackageLoader``, what
    ``torch._inductor.aoti_load_package`` wraps, with the same arguments in torch 2.11 to 2.13), because the wrapper
    first asks Inductor for this CPU's vector ISA only to log a mismatch, and Inductor finds that out by compiling
    test programs (seconds with an empty Inductor cache); airgraph has already refused a
    kernel built for another ISA (kernels/machine.py). ``run_single_threaded``: one caller thread, and a CUDA
    graph can capture the launches."""
    with zipfile.ZipFile(path) as archive:
        names = [n.split("/") for n in archive.namelist() if "/data/aotinductor/" in n]
    (model,) = {parts[parts.index("aotinductor") + 1] for parts in names}
    index = -1 if device.type != "cuda" else (device.index if device.index is not None else torch.cuda.current_device())
    return torch._C._aoti.AOTIModelPackageLoader(str(path), model, True, 1, index)


def environment(device: torch.device) -> dict[str, Any]:
    """What decides whether loading a package can crash here (module docstring); its digest keys the verdict. A
    view of airgraph/machine.py's fingerprint, in the fields and order earlier versions digested."""
    facts = fingerprint(device)
    env: dict[str, Any] = {
        "format": PACKAGE_FORMAT,
        "device_type": device.type,
        "torch": facts.torch,
        "cuda": facts.cuda,
        "git": facts.git,
        "python": facts.python,
        "cpu": facts.cpu,
    }
    if device.type == "cuda":
        env["gpu"] = facts.gpu
    return env


def _digest(env: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Verdict:
    status: str  # "ok", "crashed" (by a signal or a timeout) or "failed" (an error in the child: not recorded)
    cause: str  # "exit 0", "SIGSEGV", "timed out after 180 s", the child's last error line
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


def _command(kernel: Path, device: torch.device, shape_key: list) -> list[str]:
    """The child's command line: this module as a program, run by this Python."""
    return [sys.executable, "-m", "airgraph.kernels.probe", str(kernel.resolve()), str(device), json.dumps(shape_key)]


def _launch(command: list[str], timeout: float) -> tuple[int | None, str, str]:
    """Run the child; (returncode or None when it timed out and was killed, stdout, stderr)."""
    root = str(Path(__file__).resolve().parents[2])  # this airgraph, importable in the child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        # In the temporary folder, not the caller's: torch's import exits the child (code 2, "oneMKL FATAL ERROR:
        # Cannot load libtorch_cpu.so") when its working folder is gone, which would refuse a sound kernel.
        cwd = tempfile.gettempdir()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        out, err = (v.decode(errors="replace") if isinstance(v, bytes) else v or "" for v in (exc.stdout, exc.stderr))
        return None, out, err
    return done.returncode, done.stdout, done.stderr


class LoadProbes:
    """The load probes of one kernel library (module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = Path(root) / FILE
        self._envs: dict[str, tuple[str, dict[str, Any]]] = {}  # (device, compiler) -> (digest, environment)

    def __repr__(self) -> str:
        return f"LoadProbes({str(self.path)!r})"

    def check(
        self, kernel: Path, shape_key: list, device: torch.device, kid: str = "", built_with: dict | None = None
    ) -> Verdict:
        """Whether ``kernel`` (a package file of the library, with its entry's shape key; ``built_with``: the
        compiler its entry records) may be loaded in this process: the environment's verdict, probed in a child
        first when there is none. A "crashed" verdict warns, once per process."""
        digest, env = self._environment(device, built_with)
        verdict = _VERDICTS.get((str(self.path), digest)) or self._read(digest)
        if verdict is None:
            with contextlib.ExitStack() as stack:
                with contextlib.suppress(OSError, StoreError):  # a library this process cannot write: no lock
                    stack.enter_context(locked(self.path))
                verdict = self._read(digest)  # another process may have probed while this one waited
                if verdict is None:
                    verdict = self._probe(kernel, shape_key, device, kid, env)
                    if verdict.status != "failed":
                        with contextlib.suppress(OSError, StoreError):  # then kept in this process only
                            self._write(digest, verdict)
        if verdict.status != "failed":
            _VERDICTS[(str(self.path), digest)] = verdict
        if verdict.status == "crashed":
            compiled = ""
            if built_with:
                compiled = (
                    f"; the package was built with the C++ compiler {built_with.get('command')} "
                    f"({built_with.get('path')}, {built_with.get('version')}): packages built with another compiler "
                    "may load (set CXX, then rebuild the library)"
                )
            warn_once(
                ("load probe", str(self.path), digest),
                f"airgraph: loading an AOTInductor package crashed a child process ({verdict.cause}) with torch "
                f"{torch.__version__} on this machine (Python {sys.version.split()[0]}, {device.type}){compiled}; "
                f"static kernels are not used here; the segment runs its dynamic kernels; delete {self.path} to "
                "probe again",
                stacklevel=3,
            )
        return verdict

    def _environment(self, device: torch.device, built_with: dict | None = None) -> tuple[str, dict[str, Any]]:
        key = json.dumps([str(device), built_with], sort_keys=True)
        if key not in self._envs:
            env = environment(device)
            if built_with:  # absent for entries built before compilers were recorded: their verdicts stay valid
                env["compiler"] = built_with
            self._envs[key] = (_digest(env), env)
        return self._envs[key]

    def _document(self) -> dict[str, Any]:
        """The verdict file; an empty one when it is absent, torn or of another format or version."""
        try:
            document = read_json(self.path, format=FORMAT, version=VERSION)
        except (OSError, StoreError):
            return {"probes": {}}
        if not isinstance(document.get("probes"), dict):
            document["probes"] = {}
        return document

    def _read(self, digest: str) -> Verdict | None:
        record = self._document()["probes"].get(digest)
        if not isinstance(record, dict) or record.get("verdict") not in ("ok", "crashed"):
            return None
        return Verdict(record["verdict"], str(record.get("cause", "")), record)

    def _write(self, digest: str, verdict: Verdict) -> None:
        document = self._document()
        probes = {**document["probes"], digest: verdict.record}
        write_json_atomic(self.path, {"probes": probes}, format=FORMAT, version=VERSION)

    def _probe(self, kernel: Path, shape_key: list, device: torch.device, kid: str, env: dict) -> Verdict:
        start = time.perf_counter()
        returncode, out, err = _launch(_command(kernel, device, shape_key), TIMEOUT)
        seconds = time.perf_counter() - start
        if returncode is None:
            status, cause = "crashed", f"timed out after {TIMEOUT:.0f} s"
        elif returncode < 0:
            try:
                status, cause = "crashed", signal.Signals(-returncode).name
            except ValueError:
                status, cause = "crashed", f"signal {-returncode}"
        elif returncode == 0:
            status, cause = "ok", "exit 0"
        else:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            status, cause = "failed", f"exit {returncode}: {lines[-1] if lines else 'no message'}"
        try:
            child = json.loads(out.strip().splitlines()[-1]) if status == "ok" else None
        except (IndexError, json.JSONDecodeError):
            child = None
        record = {
            "verdict": status,
            "cause": cause,
            "returncode": returncode,
            "kernel": kid,
            "file": str(kernel),
            "child": child,
            "seconds": round(seconds, 3),
            "stderr": err[-2000:] if status != "ok" else "",
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "environment": {k: v for k, v in env.items() if k != "cpu"}
            | {"cpu": {k: v for k, v in env["cpu"].items() if k != "flags"}},
        }
        return Verdict(status, cause, record)


def _child(argv: list[str]) -> None:
    """The probe itself, in the child: load the package, run it once on its shape key's example inputs."""
    from airgraph.kernels.build import example_tensors

    path, device, shape_key = Path(argv[0]), torch.device(argv[1]), json.loads(argv[2])
    loader = open_package(path, device)
    specs = [
        {"dtype": k[0], "shape": k[1], "stride": k[2]}
        for k in shape_key
        if isinstance(k, list) and len(k) == 3 and isinstance(k[0], str)
    ]
    with torch.no_grad():
        outputs = loader.boxed_run(example_tensors(specs, device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    print(json.dumps({"loaded": path.name, "inputs": len(specs), "outputs": len(outputs)}), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
