"""Every file, folder and module a docstring names exists in this repository.

A docstring that points a newcomer at a design document or a module that is not here sends them
nowhere. Checked on the source: repository paths (``docs/metrics.md``,
``kubelet_plugin/prepare/``), Markdown file names, and Sphinx roles (``:mod:``, ``:func:``,
``:class:``, ``:meth:``, ``:data:``) that name gpuready's own modules and their attributes.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dra_driver", "kubelet_plugin", "controller", "testbed", "proto", "benchmarks")
TOP_DIRS = (*PACKAGES, "deploy", "docs", "tests")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP_DIRS) + r")/[\w./*<>-]*)")
MARKDOWN = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")
ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc):`~?([\w.]+)`")


def _sources() -> list[Path]:
    files = [p for d in (*PACKAGES, "tests") for p in (ROOT / d).rglob("*.py")]
    return sorted(p for p in files if "_pb2" not in p.name)


def _docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].lineno, body[0].value.value))
    return found


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path_exists(text: str) -> bool:
    text = re.sub(r"<[^>]*>", "*", text.rstrip(".,;:)"))  # "bench_<area>.py" names a family of files
    if "*" in text:
        return any(ROOT.glob(text))
    return (ROOT / text).exists() or (ROOT / text.rstrip("/")).exists()


def _markdown_exists(name: str) -> bool:
    return any(p.name == name for p in ROOT.glob("**/*.md") if ".venv" not in p.parts)


def _resolve(target: str, module: str) -> str | None:
    """None when ``target`` resolves to a module attribute; else what is missing."""
    if target.startswith("."):
        package = module if (ROOT / module.replace(".", "/") / "__init__.py").exists() else module.rpartition(".")[0]
        target = f"{package}.{target.lstrip('.')}"
    if not target.startswith(tuple(p + "." for p in PACKAGES) + PACKAGES):
        return None  # another project's name (grpc.Server, pynvml...): not ours to check
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{name} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attr)
        return None
    return f"no module {target}"


CASES = [(p, line, doc) for p in _sources() for line, doc in _docstrings(p)]


def test_there_are_docstrings_to_check() -> None:
    assert len(CASES) > 500


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docstrings_name_only_what_exists(path: Path) -> None:
    module = _module_of(path)
    problems = []
    for line, doc in _docstrings(path):
        for text in PATH.findall(doc):
            if not _path_exists(text):
                problems.append(f"line {line}: path {text!r} does not exist")
        for name in MARKDOWN.findall(doc):
            if not _markdown_exists(name):
                problems.append(f"line {line}: {name} is not in this repository")
        for target in ROLE.findall(doc):
            missing = _resolve(target, module)
            if missing:
                problems.append(f"line {line}: {target!r}: {missing}")
    assert not problems, "\n".join(problems)
