"""The docs a newcomer reads promise only commands and flags that exist: every ``gpuready <command>``
in a code span or block of the README and the user docs names a real subcommand, and every flag
written after it is one that subcommand accepts (as ``gpuready <command> --help`` would show)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from dra_driver.cli import all_commands, build_parser

SUBCOMMANDS = all_commands()  # production subcommands and the testbed's (demo, local-apiserver)

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *(ROOT / "docs" / n for n in ("user-guide.md", "troubleshooting.md", "index.md"))]
# Flags of other tools that the docs mention on their own (kubectl, helm, the kubelet, the API server).
OTHER_TOOLS = {"--root-dir", "--feature-gates", "--field-selector", "--create-namespace", "--namespace"}


def _code(text: str) -> list[str]:
    """Code blocks (line by line) and inline code spans."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return [line for b in blocks for line in b.splitlines()] + re.findall(r"`([^`\n]+)`", rest)


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's full parser (the CLI loads only the chosen one's flags)."""
    out = {}
    for name in SUBCOMMANDS:
        parser = build_parser([name])
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        out[name] = action.choices[name]
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_documented_gpuready_commands_and_flags_exist(doc: Path) -> None:
    subs = _subparsers()
    all_flags = set().union(*(_flags(p) for p in subs.values()))
    used = 0
    for snippet in _code(doc.read_text()):
        for match in re.finditer(r"(?<![-/\w])gpuready ([a-z][a-z-]*)(?=\s|$)([^|;#]*)", snippet):
            command, tail = match.group(1), match.group(2)
            assert command in SUBCOMMANDS, f"{doc.name}: `gpuready {command}` is not a subcommand"
            for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", tail):
                assert flag in _flags(subs[command]), f"{doc.name}: gpuready {command} has no flag {flag}"
            used += 1
        if "gpuready" not in snippet and re.fullmatch(r"--[a-z][a-z-]*( [^ ]+)?", snippet.strip()):
            flag = snippet.split()[0]
            assert flag in all_flags | OTHER_TOOLS, f"{doc.name}: no gpuready command has flag {flag}"
    assert used or doc.name == "index.md", f"{doc.name} shows no gpuready command"
