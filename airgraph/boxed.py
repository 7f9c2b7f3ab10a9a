"""AOTAutograd's boxed calling convention: a callable that takes its inputs as one list, which it may clear.

AOTAutograd calls a compiled function that has ``_boxed_call = True`` with the list itself, so the callee can
free each input as soon as it is used. :func:`boxed` marks a function or an instance. On an instance the mark
must be an attribute of the instance, not of its class: AOTAutograd wraps a backward's callable
(``torch._dynamo.disable``, ``functools.wraps``), which copies the instance's ``__dict__`` only.
"""

from __future__ import annotations

from typing import Any, TypeVar

F = TypeVar("F")


def boxed(fn: F) -> F:
    """Mark ``fn`` (a function, or an instance from its ``__init__``) as taking one list of inputs."""
    fn._boxed_call = True  # type: ignore[attr-defined]
    return fn


def is_boxed(fn: Any) -> bool:
    return getattr(fn, "_boxed_call", False) is True
