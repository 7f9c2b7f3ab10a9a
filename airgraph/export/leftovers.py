"""What an export must not leave behind in the process: references to the process group, and threads.

``dynamo_export`` runs inside the user's process, which goes on (or exits) afterwards, so what the capture
and the conversion created has to go when the export returns. Issue #14 (the seed's multi-card example
sometimes died at exit) came from a process group kept alive that way: ``destroy_process_group()`` then
drops torch's references but the group lives on, with its gloo threads (``gloo_tcp_loop``,
``pt_gloo_runloop``), its sockets and, on rank 0, the TCPStore server thread (``pt_tcpstore_uv``), until the
garbage collector destroys it during interpreter finalization. A gloo worker thread that drops its last
reference to a Python-owned tensor at that point needs the GIL, CPython makes it exit (``pthread_exit`` from
``take_gil``), the forced unwind meets the ``noexcept`` destructor of the collective's Work and the process
aborts: ``terminate called without an active exception`` (stack: ``ProcessGroupGloo::runLoop`` ->
``~AsyncAllgatherWork`` -> ``TensorImpl::decref_pyobject`` -> ``gil_scoped_acquire`` -> ``take_gil`` ->
``PyThread_exit_thread``). Upstream: pytorch/pytorch#190489 (this abort for process groups alive at
interpreter exit) and pytorch/pytorch#38228 (C++ threads taking the GIL during finalization). Three things
of an export do not go by themselves (torch 2.11 to 2.13); :func:`no_leftovers` removes them:

- **Dynamo's globals.** ``torch.export.export(strict=True)`` traces ``ModuleToTrace.forward`` of
  ``torch._dynamo.functional_export`` with ``fullgraph_capture``, and Dynamo installs what the traced
  bytecode needs (``__compiled_fn_<n>_<uuid>``: the captured GraphModule, ``__import_*`` modules,
  ``__builtins_dict___<n>``, ``___unnamed_scope_*``) as globals of the traced frame, that is, of
  ``functional_export``. Their cleanup hooks only run when a compiled code object they are registered with
  dies, and the export path registers them with none, so every strict export adds a GraphModule to that
  module for the life of the process, with its node metadata: fake tensors and, for a model with a
  collective, a ``FakeScriptObject`` whose ``real_obj`` is the real ``ProcessGroup``. The globals a capture
  added are removed. What is left of the program is reference cycles (graph and nodes, Dynamo's variable
  trackers); for a model with collectives ``export_model`` collects them at once, not whenever the collector
  runs next.
- **Default arguments.** The first capture imports Dynamo's variable trackers, which import
  ``torch.distributed.fsdp`` and through ``torch.distributed._shard`` ``torch.distributed.nn.functional``,
  whose functions are declared ``def all_reduce(tensor, op=ReduceOp.SUM, group=group.WORLD)``: imported
  after ``init_process_group`` (the seed's script exports after initializing), their default arguments hold
  the live default process group for the life of the process. Such defaults are set back to ``None``, which
  those functions, like every c10d function, read as "the default group", and which they hold when the
  module is imported before ``init_process_group``.
- **tqdm's monitor thread.** ``torch.fx.Interpreter.run`` opens a (disabled) tqdm bar, and tqdm starts its
  ``tqdm_monitor`` daemon thread with the first bar of the process. It holds nothing of the export, but it
  is a thread the export started; it is stopped when the export started it (tqdm starts a new one with the
  next bar).

The export's own collective, the exchange after which rank 0 writes the ATC config files, was the one whose
Work the aborting gloo thread held; the ranks now exchange through the store (``multirank.py``).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["dynamo_capture_scope", "forget_default_groups", "no_leftovers"]

_CAPTURE_MODULE = "torch._dynamo.functional_export"  # ModuleToTrace.forward: the frame export traces
_GROUP_DEFAULTS_MODULE = "torch.distributed.nn.functional"  # def all_reduce(..., group=group.WORLD)


def dynamo_capture_scope() -> dict[str, Any] | None:
    """The globals Dynamo installs its captured program into for ``torch.export.export(strict=True)``."""
    try:
        return vars(importlib.import_module(_CAPTURE_MODULE))
    except ImportError:  # another torch layout: export traces the user's frame, whose globals Dynamo cleans
        return None


def forget_default_groups() -> int:
    """Set default arguments of ``torch.distributed.nn.functional`` that hold a process group back to None;
    returns how many there were."""
    module = sys.modules.get(_GROUP_DEFAULTS_MODULE)
    if module is None:
        return 0
    from torch.distributed import ProcessGroup

    count = 0
    for fn in vars(module).values():
        defaults = getattr(fn, "__defaults__", None)
        if isinstance(fn, types.FunctionType) and defaults and any(isinstance(d, ProcessGroup) for d in defaults):
            count += sum(isinstance(d, ProcessGroup) for d in defaults)
            fn.__defaults__ = tuple(None if isinstance(d, ProcessGroup) else d for d in defaults)
    return count


def _tqdm_class() -> Any:
    hub = sys.modules.get("torch.hub")
    cls = getattr(hub, "tqdm", None)  # tqdm.tqdm when tqdm is installed, else torch's stand-in
    return cls if hasattr(cls, "monitor") else None


@contextmanager
def no_leftovers() -> Iterator[None]:
    """Run an export; afterwards remove the globals Dynamo added, forget the process groups held by default
    arguments and stop a tqdm monitor the export started."""
    scope = dynamo_capture_scope()
    names = set(scope) if scope is not None else set()
    tqdm_cls = _tqdm_class()
    monitor = getattr(tqdm_cls, "monitor", None)
    try:
        yield
    finally:
        if scope is not None:
            for name in set(scope) - names:
                del scope[name]
        forget_default_groups()
        tqdm_cls = _tqdm_class()
        started = getattr(tqdm_cls, "monitor", None)
        if started is not None and started is not monitor:
            started.exit()  # sets its event and joins it
            tqdm_cls.monitor = None
