"""The user's line behind a failure: the frames of an exception and the innermost one that is the user's code.

A failure inside PyTorch names PyTorch's frames; what the user needs is the line of theirs that caused it. The
frames come from Dynamo's ``real_stack`` (the user's frames where tracing failed), else from the frames FX quotes
in its message (``File "...", line N``), else from the traceback. The user's frame is the innermost one outside
PyTorch and outside the part of airgraph that asks (``skip``). Used by the export (export/trace.py) and by
planning (report/explain.py), so it lives below both.
"""

from __future__ import annotations

import linecache
import os
import re
from collections.abc import Sequence

import torch

__all__ = ["Frame", "exception_chain", "frames_of_exception", "frames_of_text", "user_source"]

Frame = tuple[str, int, str]  # file, line, code

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)[^\n]*(?:\n[ \t]*([^\n]*))?')


def _is_user_file(filename: str, skip: Sequence[str]) -> bool:
    if filename.startswith(("<frozen", "<eval_with_key")):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(tuple(os.path.abspath(d) + os.sep for d in (_TORCH_DIR, *skip)))


def user_source(frames: Sequence[Frame], *, skip: Sequence[str] = ()) -> tuple[str | None, str]:
    """``("file:line", code)`` of the innermost frame outside torch and the folders ``skip``, or ``(None, "")``."""
    for filename, line, code in reversed(list(frames)):
        if _is_user_file(filename, skip):
            return f"{filename}:{line}", code.strip()
    return None, ""


def frames_of_text(text: str) -> list[Frame]:
    """The frames a message quotes as a traceback does (``File "...", line N`` and the code on the next line)."""
    return [(m.group(1), int(m.group(2)), m.group(3) or "") for m in _FRAME.finditer(text or "")]


def frames_of_exception(exc: BaseException) -> list[Frame]:
    """The frames of ``exc``, outermost first (see the module docstring)."""
    stack = getattr(exc, "real_stack", None)  # Dynamo: the user's frames at the failure
    if stack:
        return [(f.filename, f.lineno or 0, f.line or "") for f in stack]
    frames = frames_of_text(str(exc))
    if frames:
        return frames
    tb, out = exc.__traceback__, []
    while tb is not None:
        filename, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
        out.append((filename, line, linecache.getline(filename, line)))
        tb = tb.tb_next
    return out


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes and contexts, outermost first (what failed inside PyTorch is wrapped, often twice)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
