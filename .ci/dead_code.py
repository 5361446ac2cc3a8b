"""Dead code (vulture) in dra_driver, kubelet_plugin, controller, testbed and benchmarks.

Run from the repository root: ``python .ci/dead_code.py``. Prints vulture's usual lines and exits 3
(vulture's own code) when something is unused, 0 when nothing is.

What counts as used: a use anywhere in those packages or in tests/. Tests are read for their uses
only, never reported: the stand-ins under testbed/ exist for the tests (a fault injector only a test
calls is alive), and tests' own fixtures, hooks and helpers are pytest's business. So plain
``vulture <packages>`` cannot do this: without tests/ it reports every stand-in only tests use, with
tests/ it reports tests' definitions too. Production code that only tests call is therefore not
reported; whether such code is a test hook or dead is a judgement, not a gate.

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

PRODUCTION = ("dra_driver", "kubelet_plugin", "controller")
CHECKED = (*PRODUCTION, "testbed", "benchmarks")
USES_ONLY = ("tests",)
WHITELIST = Path(__file__).with_name("vulture_whitelist.py")
MIN_CONFIDENCE = 60
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


def unused_code() -> list[str]:
    """vulture's report lines for what is defined in CHECKED and used nowhere (USES_ONLY included)."""
    scan = Vulture()
    scan.scavenge([*CHECKED, *USES_ONLY, str(WHITELIST)])
    uses = "".join(f"_.{name}\n" for name in sorted(nvml_names_called_by_string(PRODUCTION)))
    scan.scan(uses, filename="<nvml names production calls by string>")
    root = Path.cwd().resolve()
    lines = []
    for item in scan.get_unused_code(min_confidence=MIN_CONFIDENCE):
        path = Path(item.filename).resolve()
        if path.is_relative_to(root) and path.relative_to(root).parts[0] in CHECKED:
            lines.append(item.get_report())
    return lines


def main() -> int:
    """Print every unused definition; 0 when there is none, 3 (as vulture) otherwise."""
    found = unused_code()
    for line in found:
        print(line)
    return 3 if found else 0


if __name__ == "__main__":
    sys.exit(main())
