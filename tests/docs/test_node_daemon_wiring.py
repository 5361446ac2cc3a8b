"""The node daemon's main module wires, and does nothing at run time (issue 39).

A behaviour that lives in ``kubelet_plugin/daemon.py`` is reached by a callback climbing back up from
the part it belongs to, the circle the node inventory ended; a newcomer then cannot find where a
change is handled. So the module only constructs, starts and stops: its public methods are
``start``, ``stop`` and the ``checkpoint`` accessor, its private ones run only from ``start``, and no
part's state is set behind its back with ``partial(setattr, ...)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[2] / "kubelet_plugin" / "daemon.py"
MAX_LINES = 350


def _methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(DAEMON.read_text())
    plugin = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeletPlugin")
    return {n.name: n for n in plugin.body if isinstance(n, ast.FunctionDef)}


def test_the_daemon_module_is_wiring_only() -> None:
    text = DAEMON.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"daemon.py has {len(text.splitlines())} lines (at most {MAX_LINES})"
    assert "partial(setattr" not in text.replace(" ", "")
    methods = _methods()
    public = sorted(name for name in methods if not name.startswith("_"))
    assert public == ["checkpoint", "start", "stop"], public
    # Every private method is a start-up step: called from start (or from another step), never handed
    # out as a callback for another part to call at run time.
    start_calls = {n.func.attr for n in ast.walk(methods["start"])
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    steps = {name for name in methods if name.startswith("_") and not name.startswith("__")}
    assert steps <= start_calls, f"not start-up steps: {sorted(steps - start_calls)}"
    tree = ast.parse(text)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    handed_out = {n.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                  and n.attr in steps and id(n) not in called}
    assert not handed_out, f"methods handed out as callbacks: {sorted(handed_out)}"
