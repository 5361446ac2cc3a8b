"""The layout a newcomer navigates by: folders say which daemon, file names say what they hold.

- No two modules a daemon runs share a name (the daemon's package plus the shared core): a name
  such as ``inventory.py`` meaning two things in one process sends a reader to the wrong file.
- Every package says in its docstring what it is for.
- A module past about 500 lines is usually two concerns; the few that are longer are named here
  with the reason, so a new one is a decision, not an accident.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("kubelet_plugin", "controller")
PACKAGES = ("dra_driver", *DAEMONS, "testbed")


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("daemon", DAEMONS)
def test_no_two_modules_of_one_daemon_share_a_name(daemon: str) -> None:
    names = Counter(p.name for pkg in ("dra_driver", daemon) for p in _modules(pkg))
    twice = {n: [str(p.relative_to(ROOT)) for pkg in ("dra_driver", daemon) for p in _modules(pkg) if p.name == n]
             for n, c in names.items() if c > 1}
    assert not twice, twice


def test_no_two_testbed_modules_share_a_name() -> None:
    names = Counter(p.name for p in _modules("testbed"))
    assert not [n for n, c in names.items() if c > 1]


@pytest.mark.parametrize("init", sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_says_what_it_is_for(init: Path) -> None:
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc) > 40, f"{init.relative_to(ROOT)} has no docstring saying what the package holds"


def test_modules_stay_small_enough_to_hold_one_concern() -> None:
    long = {str(p.relative_to(ROOT)): n for pkg in PACKAGES for p in _modules(pkg)
            if (n := len(p.read_text().splitlines())) > 550}
    assert not long, f"split these into one concern each: {long}"


def test_test_file_names_are_unique() -> None:
    # The test folders are not packages: two test files with one name break collection
    # ("import file mismatch"), as tests/e2e/test_placement_mode.py did beside the controller's.
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
