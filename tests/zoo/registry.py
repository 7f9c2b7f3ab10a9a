"""The zoo's models, and what each case cannot do yet (strict xfails flip when a fix lands)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tests.zoo.hf_models import HF_SPECS
from tests.zoo.plain_models import PLAIN_SPECS
from tests.zoo.spec import MODES, Refused, Spec, Xfail

__all__ = ["EXPECTED", "SPECS", "cases", "expected"]

SPECS: list[Spec] = [*HF_SPECS, *PLAIN_SPECS]

# (model, mode) -> what happens instead of a pass.
EXPECTED: dict[tuple[str, str], Xfail | Refused] = {
    ("graph_break", "export"): Refused("data-dependent control flow", r"data-dependent control flow"),
}


def expected(name: str, mode: str) -> Xfail | Refused | None:
    return EXPECTED.get((name, mode))


def cases(modes: Iterable[str]) -> list:
    """pytest params (spec, mode) for these modes (one param per spec when one mode is given), marked."""
    modes = tuple(modes)
    assert set(modes) <= set(MODES), modes
    params = []
    for spec in SPECS:
        for mode in modes:
            outcome = expected(spec.name, mode)
            marks = [pytest.mark.xfail(strict=True, reason=outcome.reason)] if isinstance(outcome, Xfail) else []
            values = (spec, mode) if len(modes) > 1 else (spec,)
            params.append(pytest.param(*values, marks=marks, id=f"{spec.name}-{mode}"))
    return params
