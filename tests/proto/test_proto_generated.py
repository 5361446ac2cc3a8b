"""The committed generated modules in proto/ are exactly what the .proto files produce.

A fresh clone (or installed wheel) imports them with no build step, so a .proto edit that was not
regenerated would silently ship stale wire definitions. Fix a failure with `python proto/generate.py`.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from proto import generate

GRPC_VERSION_LINE = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.M)


def _committed_generator_version() -> str:
    text = (generate.PROTO_DIR / "dra_v1_pb2_grpc.py").read_text()
    match = GRPC_VERSION_LINE.search(text)
    assert match, "committed dra_v1_pb2_grpc.py has no GRPC_GENERATED_VERSION line"
    return match.group(1)


def test_committed_modules_match_regenerated(tmp_path: Path) -> None:
    from grpc_tools import grpc_version

    produced = generate.generate_into(tmp_path)
    # The compiled schema embedded in every *_pb2.py must match whatever grpcio-tools is installed.
    for stem in generate.PROTO_FILES:
        fresh = _serialized_descriptor(produced / f"{stem}_pb2.py")
        committed = _serialized_descriptor(generate.PROTO_DIR / f"{stem}_pb2.py")
        assert fresh == committed, f"{stem}.proto changed but {stem}_pb2.py was not regenerated"
    # Byte-for-byte only with the generator that wrote the committed files: another grpcio-tools
    # version writes different boilerplate (its version checks) around the same schema.
    if _committed_generator_version() == grpc_version.VERSION:
        diff = generate.diff_against(produced)
        assert not diff, "generated modules are stale; run `python proto/generate.py`:\n" + "".join(diff[:60])


def _serialized_descriptor(module_path: Path) -> bytes:
    """The FileDescriptorProto bytes a generated module hands to the descriptor pool."""
    text = module_path.read_text()
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    assert match, f"no serialized descriptor in {module_path}"
    value = ast.literal_eval(match.group(1))  # a bytes literal written by protoc
    assert isinstance(value, bytes)
    return value


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    # The --check CLI is what a developer or CI runs; it must pass on the committed tree.
    result = subprocess.run(
        [sys.executable, str(generate.PROTO_DIR / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    from grpc_tools import grpc_version

    if _committed_generator_version() == grpc_version.VERSION:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "up to date" in result.stdout
    # And it notices a stale file: compare a regenerated tree against a doctored copy.
    produced = generate.generate_into(tmp_path / "gen")
    doctored = tmp_path / "doctored"
    doctored.mkdir()
    for name in generate.generated_names():
        (doctored / name).write_text((produced / name).read_text())
    assert generate.diff_against(produced, doctored) == []
    stale = doctored / "dra_v1_pb2.py"
    stale.write_text(stale.read_text().replace("share_id", "shareid"))
    diff = generate.diff_against(produced, doctored)
    assert any(line.startswith("+++ regenerated/dra_v1_pb2.py") for line in diff)


def test_generated_modules_import_as_package_members() -> None:
    # Works from an installed package: the gRPC stubs import `from proto import x_pb2`, never a
    # top-level `import x_pb2` that only resolves with proto/ on sys.path.
    for stem in generate.PROTO_FILES:
        grpc_src = (generate.PROTO_DIR / f"{stem}_pb2_grpc.py").read_text()
        assert f"from proto import {stem}_pb2 as" in grpc_src
        assert not re.search(rf"^import {stem}_pb2", grpc_src, re.M)
        module = importlib.import_module(f"proto.{stem}_pb2_grpc")
        assert module.__name__ == f"proto.{stem}_pb2_grpc"
