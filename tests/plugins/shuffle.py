"""``--shuffle=SEED``: run the collected tests in an order shuffled by SEED, to find tests that leak state into
later ones (a patched torch setting, a filled cache) and tests that pass only after another.

The order is a function of the seed and the collected items alone (``random.Random(seed)``, no hash of a
string): every pytest-xdist worker collects the same order, as xdist requires. Modules are shuffled, then the tests
within each module, as pytest-randomly does: a module's tests stay together, so module-scoped fixtures are set up
no more often than in file order. The seed is printed at the end of the run; rerun an order with the same seed
(``make test SHUFFLE=SEED``). Without the option nothing changes.
"""

from __future__ import annotations

import random

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("shuffle").addoption(
        "--shuffle",
        metavar="SEED",
        type=int,
        default=None,
        help="run the tests in an order shuffled by SEED (an integer; the same seed gives the same order)",
    )


@pytest.hookimpl(trylast=True)  # after every other plugin has selected and marked the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("shuffle")
    if seed is not None:
        items[:] = shuffled(items, seed)


def shuffled(items: list[pytest.Item], seed: int) -> list[pytest.Item]:
    """``items`` with their modules in an order drawn from ``seed``, and each module's items too."""
    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    return [item for group in groups for item in group]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    seed = config.getoption("shuffle")
    if seed is not None:
        terminalreporter.write_line(f"tests ran in the order of --shuffle={seed} (make test SHUFFLE={seed})")
