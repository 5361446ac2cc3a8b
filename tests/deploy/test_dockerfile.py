"""The image recipe stays in step with the package, the chart and the testbed's build of the same
image (no container runtime in CI to run the Dockerfile; tests/e2e/test_image.py builds the image
from the same scripts and runs it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from testbed.realcluster import gpuready_image

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
RECIPE = ROOT / "deploy" / "image"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _copied() -> set[str]:
    out: set[str] = set()
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            out.update(p.removeprefix("./") for p in line.split()[1:-1])
    return out


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (RECIPE / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{name}: {line} is not an exact pin"
            pins[req.name.lower().replace("_", "-")] = spec.version
    return pins


def test_the_wheel_is_built_from_every_production_package_and_leaves_the_testbed_out() -> None:
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    production = packages - {"testbed"}
    copied = _copied()
    assert production <= copied, f"deploy/Dockerfile does not COPY {sorted(production - copied)}"
    # The stand-ins (simulated NVML, local API server, demo) never ship in the node and cluster image.
    assert "testbed" in packages and "testbed" not in copied
    assert {"pyproject.toml", "README.md"} <= copied  # the wheel build reads both
    assert all((ROOT / p).exists() for p in copied), "the Dockerfile copies a path that does not exist"
    # The testbed's build copies the same sources (and no more) into its wheel.
    assert set(gpuready_image._WHEEL_SOURCES) == copied - {
        f"deploy/image/{n}" for n in ("requirements.txt", "build-requirements.txt", "dpkg-excludes")}
    assert re.search(r"^RUN pip wheel --no-deps --no-index --find-links /wheels ", DOCKERFILE, re.M)


def test_both_recipes_run_the_same_scripts_on_the_same_debian_python() -> None:
    # The Dockerfile and build-image.sh differ by the base alone: the same deploy/image scripts run
    # on Debian's python3 packages in both.
    for script in ("base.sh", "install.sh /wheels", "add-testbed.sh /src"):
        assert f"sh /recipe/{script}" in DOCKERFILE, script
    source = (ROOT / "testbed" / "realcluster" / "gpuready_image.py").read_text()
    for script in ("base.sh", "install.sh", "add-testbed.sh"):
        assert f'f"{{recipe}}/{script}"' in source, script
    debian_python = re.search(r"apt-get install -y --no-install-recommends (python3-minimal [^\\\n]*)", DOCKERFILE)
    assert debian_python, "the base stage installs Debian's python3"
    assert set(debian_python.group(1).split()) <= set(gpuready_image.BASE_PACKAGES)
    assert DOCKERFILE.count(f"FROM debian:{gpuready_image.SUITE}-slim") == 2  # wheels and base: one Debian
    assert "COPY deploy/image/dpkg-excludes /etc/dpkg/dpkg.cfg.d/gpuready-excludes" in DOCKERFILE
    assert "gpuready-excludes" in source
    # The Python the image uses (bookworm's libpython3.11) is one the project supports.
    python = re.search(r"libpython(\d+)\.(\d+)-stdlib", DOCKERFILE)
    minimum = tuple(int(x) for x in PYPROJECT["project"]["requires-python"].removeprefix(">=").split("."))
    assert python and (int(python.group(1)), int(python.group(2))) >= minimum
    # The production image is the default target; the testbed's is opt-in and labelled test-only.
    stages = re.findall(r"^FROM \S+ AS (\S+)", DOCKERFILE, re.M)
    assert stages[-1] == "production" and "testbed" in stages
    assert 'LABEL org.opencontainers.image.description="TEST ONLY' in DOCKERFILE


def test_every_dependency_is_pinned_within_its_range_or_left_out_on_purpose() -> None:
    pins = _pins("requirements.txt")
    left_out = {"cryptography"}  # requirements.txt says why; install.sh's pip check allows exactly it
    install = (RECIPE / "install.sh").read_text()
    for line in PYPROJECT["project"]["dependencies"]:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        if name in left_out:
            assert f"requires {req.name}" in install, name
            continue
        assert name in pins, f"{name} is a dependency but not pinned in deploy/image/requirements.txt"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside pyproject's {req.specifier}"
    build = _pins("build-requirements.txt")
    assert {"pip", "setuptools", "wheel"} <= set(build)
    backend = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert all(r.specifier.contains(build[r.name]) for r in backend), "the pinned build backend fits pyproject's"


def test_the_image_runs_what_the_chart_expects() -> None:
    templates = ROOT / "deploy" / "helm" / "gpuready" / "templates"
    assert 'ENTRYPOINT ["gpuready"]' in DOCKERFILE
    for name in ("kubelet-plugin-daemonset.yaml", "controller-deployment.yaml"):
        assert 'command: ["gpuready"]' in (templates / name).read_text(), name
    # The controller runs as the image's unprivileged user.
    uid = re.search(r"'gpuready:x:(\d+):(\d+):", (RECIPE / "base.sh").read_text())
    controller = (templates / "controller-deployment.yaml").read_text()
    assert uid and f"runAsUser: {uid.group(1)}" in controller and f"runAsGroup: {uid.group(2)}" in controller
    # MPS needs unshare and mount: util-linux and mount on the slim base, busybox on the testbed's.
    assert "busybox" in gpuready_image.BASE_PACKAGES


def test_the_chart_default_image_is_the_one_the_docs_build() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuready" / "values.yaml").read_text())
    install = (ROOT / "docs" / "install.md").read_text()
    assert "deploy/Dockerfile" in install and "image.repository" in install
    assert values["image"]["repository"]
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuready" / "Chart.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["project"]["version"] == gpuready_image.gpuready_version()


def test_the_testbed_tag_carries_every_module_the_simulated_nvml_imports(tmp_path: Path) -> None:
    """The image build stages a hand-picked part of testbed/ and add-testbed.sh copies a hand-picked
    part of that into the test-only image. Stage, run the script's copy lines into an empty site folder and open a simulated node from there alone: a module the
    simulated NVML newly imports but the script leaves out fails here, not in the image build."""
    script = (RECIPE / "add-testbed.sh").read_text()
    copies = [line for line in script.splitlines() if line.startswith(("mkdir ", "cp "))]
    assert copies, "add-testbed.sh no longer copies with plain cp lines; update this test"
    # The source tree the image build hands the script holds only what the build stages.
    src, site = tmp_path / "src", tmp_path / "site"
    gpuready_image._stage(gpuready_image._TESTBED_SOURCES, str(src))
    site.mkdir()
    subprocess.run(["sh", "-euc", "\n".join(copies)], check=True,
                   env={**os.environ, "src": str(src), "site": str(site)})
    # The copied testbed comes first on the path and the editable install's finder (which maps
    # `testbed.*` to this checkout) is dropped, so `testbed.*` resolves only inside the copy.
    probe = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
             "sys.path[:0] = sys.argv[1:]; import testbed; "
             "assert testbed.__file__.startswith(sys.argv[1]), testbed.__file__; "
             "from testbed.nvml_sim import open_simulated; "
             "import testbed.simulated_node; "  # the chart's simulated.enabled runs it in the plugin pod
             "sim = open_simulated('4xh200'); sim.nvmlInit(); print(sim.nvmlDeviceGetCount())")
    out = subprocess.run([sys.executable, "-c", probe, str(site), str(ROOT)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "GPUREADY_SIM_CONTROL_DIR"})
    assert out.returncode == 0, f"the test-only image's testbed cannot open a simulated node:\n{out.stderr}"
    assert out.stdout.split() == ["4"]
