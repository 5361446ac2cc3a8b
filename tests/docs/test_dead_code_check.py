"""CI's dead-code check (.ci/dead_code.py) fails on production code that only tests use, on a small
tree of its own (the real repository takes two vulture scans of ~10 s each: CI runs those)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

CHECK = Path(__file__).resolve().parents[2] / ".ci" / "dead_code.py"


def _load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dead_code_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> None:
    for package in ("dra_driver", "kubelet_plugin", "controller", "testbed", "benchmarks", "tests"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)


def test_production_code_only_tests_use_fails_and_a_listed_seam_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    check = _load_check()
    _tree(tmp_path, {
        "dra_driver/shapes.py": (
            "def area(w, h):\n    return w * h\n\n\n"
            "def perimeter(w, h):\n    return 2 * (w + h)\n\n\n"
            "def unused(w):\n    return w\n\n\n"
            "class Counter:\n    def __init__(self):\n        self.seen = 0\n"),
        "controller/main.py": "from dra_driver.shapes import area\n\nprint(area(2, 3))\n",
        "testbed/helpers.py": "def only_for_tests():\n    return 1\n",
        "tests/test_shapes.py": (
            "from dra_driver.shapes import Counter, perimeter\nfrom testbed.helpers import only_for_tests\n\n\n"
            "def test_it():\n    assert perimeter(1, 2) == 6 and only_for_tests() == 1 and Counter().seen == 0\n"),
    })
    monkeypatch.chdir(tmp_path)
    assert check.main() == 3
    out = capsys.readouterr().out
    assert "dra_driver/shapes.py:9: unused function 'unused'" in out  # used nowhere: as before
    assert "dra_driver/shapes.py:5: function 'perimeter' is used only by tests/" in out
    assert "dra_driver/shapes.py:15: attribute 'seen' is used only by tests/" in out
    assert "area" not in out  # production calls it
    assert "only_for_tests" not in out  # a stand-in's helper only tests call is what testbed/ is for

    monkeypatch.setitem(check.TEST_SEAMS, "dra_driver/shapes.py:seen", "a counter the test reads")
    assert check.main() == 3
    out = capsys.readouterr().out
    assert "'seen'" not in out and "'perimeter' is used only by tests/" in out
