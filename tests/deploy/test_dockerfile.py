"""The image recipe stays in step with the package and the chart (no container runtime in CI to build it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def _copied() -> set[str]:
    out: set[str] = set()
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            out.update(p.removeprefix("./") for p in line.split()[1:-1])
    return out


def test_the_image_copies_every_production_package_and_leaves_the_testbed_out() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    production = packages - {"testbed"}
    copied = _copied()
    assert production <= copied, f"deploy/Dockerfile does not COPY {sorted(production - copied)}"
    # The stand-ins (simulated NVML, local API server, demo) never ship in the node and cluster image.
    assert "testbed" in packages and "testbed" not in copied
    assert {"pyproject.toml", "README.md"} <= copied  # pip install . reads both
    assert all((ROOT / p).exists() for p in copied), "the Dockerfile copies a path that does not exist"
    assert re.search(r"^RUN pip install --no-cache-dir \. ", DOCKERFILE, re.M)


def test_the_image_runs_what_the_chart_expects() -> None:
    templates = ROOT / "deploy" / "helm" / "gpuready" / "templates"
    assert 'ENTRYPOINT ["gpuready"]' in DOCKERFILE
    for name in ("kubelet-plugin-daemonset.yaml", "controller-deployment.yaml"):
        assert 'command: ["gpuready"]' in (templates / name).read_text(), name
    # The controller runs as the image's unprivileged user.
    uid = re.search(r"useradd --uid (\d+)", DOCKERFILE)
    controller = (templates / "controller-deployment.yaml").read_text()
    assert uid and f"runAsUser: {uid.group(1)}" in controller
    # MPS needs unshare/mount in the image.
    assert "util-linux" in DOCKERFILE
    # The Python the image uses is one the project supports.
    python = re.search(r"^FROM python:(\d+)\.(\d+)", DOCKERFILE, re.M)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    minimum = tuple(int(x) for x in config["project"]["requires-python"].removeprefix(">=").split("."))
    assert python and (int(python.group(1)), int(python.group(2))) >= minimum


def test_the_chart_default_image_is_the_one_the_docs_build() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuready" / "values.yaml").read_text())
    install = (ROOT / "docs" / "install.md").read_text()
    assert "deploy/Dockerfile" in install and "image.repository" in install
    assert values["image"]["repository"]
