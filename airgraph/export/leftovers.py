"""What an export must not leave behind in the process: references to the process group, and threads.

``dynamo_export`` runs inside the user's process, so what the capture and the conversion created has to go when
the export returns: a process group kept alive past ``destroy_process_group()`` can abort the process at
interpreter exit (issue #14; the mechanism and upstream issues: docs/design/export-internals.md).
:func:`no_leftovers` removes the three things of an export that do not go by themselves (torch 2.11 to 2.13):

- the globals Dynamo installs in ``torch._dynamo.functional_export`` for a strict capture (the captured
  GraphModule, whose metadata can hold the real ``ProcessGroup``), and the reference cycles left of it;
- default arguments of ``torch.distributed.nn.functional`` bound to the live default group when it is imported
  after ``init_process_group``: set back to ``None`` ("the default group");
- tqdm's monitor thread, when the export started it.
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
