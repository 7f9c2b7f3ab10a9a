"""airgraph's logger, and the one way to say a thing once per process.

``warn_once(key, message)`` gives ``message`` the first time ``key`` is seen, as a ``UserWarning`` (or as a
warning on airgraph's logger, for runtime events a user does not act on in code), and never again for that key
in this process. Keys name what is warned about: a path and a line, a graph id, a reason. Tests start with no key
given (tests/conftest.py calls :func:`forget_warnings`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Hashable

log = logging.getLogger("airgraph")

_given: set[Hashable] = set()


def warn_once(key: Hashable, message: str, *args: object, to_log: bool = False, stacklevel: int = 2) -> bool:
    """Warn with ``message`` (``%``-formatted with ``args``) unless ``key`` was warned of; True if it warned now."""
    if key in _given:
        return False
    _given.add(key)
    if to_log:
        log.warning(message, *args)
    else:
        warnings.warn(message % args if args else message, stacklevel=stacklevel + 1)
    return True


def forget_warnings() -> None:
    """Every key may warn again (tests)."""
    _given.clear()
