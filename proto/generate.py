"""Regenerate (or check) the committed Python modules for the kubelet gRPC protos.

The generated ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` files are committed so that a fresh
clone or an installed wheel needs no build step. Run after editing a ``.proto`` file::

    python proto/generate.py            # rewrite the generated modules in place
    python proto/generate.py --check    # exit 1 if the committed modules are out of date

protoc is run with the repository root as the include path and ``proto/<name>.proto`` as the file
name. That has two effects we want: the descriptor-pool file names are ``proto/<name>.proto``
(unique, so the APIs never clash with each other or with another library's ``api.proto``),
and the gRPC stubs import their messages as ``from proto import <name>_pb2`` (a package-relative
import that works from an installed package) instead of grpc's default top-level ``import <name>_pb2``.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
PACKAGE = PROTO_DIR.name  # "proto": the import prefix protoc derives from the include path

# The .proto sources, in dependency order (none imports another today).
PROTO_FILES = ("pluginregistration", "dra_v1", "dra_v1beta1", "health_v1alpha1", "health_v1", "podresources_v1")

# Every file declares a service, so each yields messages, a type stub and gRPC stubs.
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names() -> list[str]:
    """Return the file names (inside proto/) of every generated module, sorted."""
    return sorted(f"{stem}{suffix}" for stem in PROTO_FILES for suffix in SUFFIXES)


def generate_into(out_dir: Path) -> Path:
    """Run protoc over every .proto file, writing into ``out_dir``; return the directory holding them.

    Raises RuntimeError with protoc's message when compilation fails, and ImportError when
    grpcio-tools is not installed (it is in the ``test`` extra).
    """
    import grpc_tools  # type: ignore[import-untyped]  # imported here: only developers need it (the `test` extra), not the runtime

    out_dir.mkdir(parents=True, exist_ok=True)
    wkt_include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    sources = [f"{PACKAGE}/{stem}.proto" for stem in PROTO_FILES]
    args = [
        f"-I{REPO_ROOT}",
        f"-I{wkt_include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    # protoc.main reports errors on stderr and returns non-zero; run it in a child process so
    # its output is captured and a failure cannot leave half-written state in this interpreter.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom grpc_tools import protoc\nsys.exit(protoc.main(sys.argv))",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"protoc failed (exit {result.returncode}): {result.stderr.strip()}")
    produced = out_dir / PACKAGE
    missing = [name for name in generated_names() if not (produced / name).is_file()]
    if missing:
        raise RuntimeError(f"protoc did not produce {missing} in {produced}")
    return produced


def diff_against(produced: Path, target: Path = PROTO_DIR) -> list[str]:
    """Return a unified diff (as lines) between freshly generated modules and the committed ones."""
    lines: list[str] = []
    for name in generated_names():
        fresh = (produced / name).read_text()
        committed_path = target / name
        committed = committed_path.read_text() if committed_path.is_file() else ""
        if fresh != committed:
            lines.extend(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    fresh.splitlines(keepends=True),
                    fromfile=f"committed/{name}",
                    tofile=f"regenerated/{name}",
                )
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: regenerate in place, or with --check report drift and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the committed modules differ"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        produced = generate_into(Path(tmp))
        if args.check:
            diff = diff_against(produced)
            if diff:
                sys.stdout.writelines(diff)
                print("\ngenerated modules are out of date: run `python proto/generate.py`", file=sys.stderr)
                return 1
            print(f"{len(generated_names())} generated modules are up to date")
            return 0
        for name in generated_names():
            shutil.copyfile(produced / name, PROTO_DIR / name)
        print(f"wrote {len(generated_names())} modules to {PROTO_DIR}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
