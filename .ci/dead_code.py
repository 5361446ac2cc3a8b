"""Dead code (vulture) in dra_driver, kubelet_plugin, controller, testbed and benchmarks.

Run from the repository root: ``python .ci/dead_code.py``. Prints vulture's usual lines and exits 3
(vulture's own code) when something is unused, 0 when nothing is.

What counts as used: a use anywhere in those packages or in tests/. Tests are read for their uses
only, never reported: the stand-ins under testbed/ exist for the tests (a fault injector only a test
calls is alive), and tests' own fixtures, hooks and helpers are pytest's business. So plain
``vulture <packages>`` cannot do this: without tests/ it reports every stand-in only tests use, with
tests/ it reports tests' definitions too.

Production code that only tests use is reported too, by a second scan without tests/: a name in
dra_driver, kubelet_plugin or controller that the first scan finds used and the second does not is
used from tests/ alone. Such code is either dead (remove it, and test the behaviour through what
production calls) or a helper tests need (move it to testbed/). The few deliberate test seams, state
production keeps only so a test can observe what a user cannot, are listed in TEST_SEAMS, each with
its reason.

``--min-confidence 60``: vulture scores every unused function, class, method, property, attribute and
variable 60 %, unused imports 90 % (ruff's F401 already checks those), unreachable code and unused
arguments 100 %. Any higher threshold reports no unused function at all.

Names a framework calls (not our code) are in .ci/vulture_whitelist.py, each with its reason. One
rule is computed instead of listed: production calls NVML by name through wrappers that tolerate a
binding without the call (``optional(nvml, "nvmlDeviceGetBrand", h)``, ``_try(nv, ...)``), so each
``"nvml..."`` string in production code counts as a use of that name (the simulator implements them).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from vulture import Vulture
from vulture.core import Item

PRODUCTION = ("dra_driver", "kubelet_plugin", "controller")
CHECKED = (*PRODUCTION, "testbed", "benchmarks")
USES_ONLY = ("tests",)
WHITELIST = Path(__file__).with_name("vulture_whitelist.py")
MIN_CONFIDENCE = 60

# Production names only tests read, kept on purpose: "path:name" -> why. Keep this short; each entry
# but the last is a counter or report a test reads to prove work was (not) done, which no behaviour a
# user sees shows.
TEST_SEAMS = {
    "dra_driver/informer.py:watches": "watch streams opened: tests prove a resumed watch does not relist",
    "controller/informers.py:watches": "watch sessions opened: as dra_driver/informer.py",
    "controller/informers.py:builds": "inventory rebuilds: tests prove events and resyncs do not rebuild it each",
    "dra_driver/http_guard.py:open_connections": "connections served now: tests prove the cap holds under a flood "
                                                 "(a user sees the cap only as 503s and the refusal log line)",
    "kubelet_plugin/heartbeat.py:renewals": "successful renewals: tests prove the renewer writes on its own "
                                            "thread while prepares and publishes run (the controller sees it "
                                            "only as a node that is never tainted)",
    "kubelet_plugin/kubelet/claims.py:hits": "claims served from the read-ahead: tests prove a prepare skipped the GET",
    "kubelet_plugin/daemon.py:recovery": "the start-up recovery report (its events are logged as they happen): "
                                         "crash tests read what recovery rolled back",
    "kubelet_plugin/health/fixed_health.py:set_unhealthy": "with --health-mode off no monitor sets health: tests "
                                                           "set it here to check what the pool, the health stream "
                                                           "and prepare do with a withdrawn device",
    # Not a counter: a synchronisation point. Tests of a running plugin start from its validated pool,
    # and only the monitor knows when on_change has been given the first validated round (polling the
    # snapshot races the republish).
    "kubelet_plugin/health/monitor.py:wait_validated": "waits for the first validated round to reach on_change",
}
_NVML_NAME = re.compile(r"nvml[A-Z]\w*")


def nvml_names_called_by_string(roots: tuple[str, ...]) -> set[str]:
    """Every ``"nvml..."`` string literal in the Python files under ``roots``."""
    names: set[str] = set()
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NVML_NAME.fullmatch(node.value):
                    names.add(node.value)
    return names


def _scan(paths: list[str]) -> list[Item]:
    """vulture's unused items over ``paths`` (the whitelist and the NVML names production calls added)."""
    scan = Vulture()
    scan.scavenge([*paths, str(WHITELIST)])
    uses = "".join(f"_.{name}\n" for name in sorted(nvml_names_called_by_string(PRODUCTION)))
    scan.scan(uses, filename="<nvml names production calls by string>")
    return list(scan.get_unused_code(min_confidence=MIN_CONFIDENCE))


def _where(item: Item) -> tuple[str, ...] | None:
    """The item's path relative to the repository root, as parts; None outside it."""
    path = Path(item.filename).resolve()
    root = Path.cwd().resolve()
    return path.relative_to(root).parts if path.is_relative_to(root) else None


def unused_code(everywhere: list[Item]) -> list[str]:
    """vulture's report lines for what is defined in CHECKED and used nowhere (USES_ONLY included);
    ``everywhere``: the scan of CHECKED and USES_ONLY."""
    return [item.get_report() for item in everywhere if (parts := _where(item)) is not None and parts[0] in CHECKED]


def used_only_by_tests(everywhere: list[Item]) -> list[str]:
    """A line for each production definition that only tests/ use (TEST_SEAMS aside)."""
    unused_anywhere = {(i.filename, i.first_lineno, i.name) for i in everywhere}
    lines = []
    for item in _scan(list(CHECKED)):
        parts = _where(item)
        if parts is None or parts[0] not in PRODUCTION or (item.filename, item.first_lineno, item.name) in unused_anywhere:
            continue
        if f"{'/'.join(parts)}:{item.name}" not in TEST_SEAMS:
            lines.append(f"{'/'.join(parts)}:{item.first_lineno}: {item.typ} '{item.name}' is used only by tests/")
    return lines


def main() -> int:
    """Print every unused definition and every production one only tests use; 0 when there is none,
    3 (as vulture) otherwise."""
    everywhere = _scan([*CHECKED, *USES_ONLY])
    unused, test_only = unused_code(everywhere), used_only_by_tests(everywhere)
    for line in [*unused, *test_only]:
        print(line)
    if test_only:
        print("(used only by tests/: use it in production, or remove it and test the behaviour through what "
              "production calls, or move a helper tests need to testbed/; a deliberate seam goes in TEST_SEAMS, "
              "with why)")
    return 3 if unused or test_only else 0


if __name__ == "__main__":
    sys.exit(main())
