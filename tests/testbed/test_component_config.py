"""The e2e cluster's kube-scheduler file suits the scheduler it is for: 1.34's scheduler decodes the
file strictly and refused to start with ``bindingTimeout`` (a 1.35 field), which made every e2e
test error on 1.34.4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.realcluster import component_config


def _binary(tmp_path: Path, version: str) -> str:
    """A stand-in kube-scheduler that answers ``--version`` as the real one does."""
    path = tmp_path / f"kube-scheduler-{version}"
    path.write_text(f"#!/bin/sh\necho 'Kubernetes {version}'\n")
    os.chmod(path, 0o755)
    return str(path)


def _args(config: dict) -> dict:  # type: ignore[type-arg]
    [profile] = config["profiles"]
    [plugin] = profile["pluginConfig"]
    assert plugin["name"] == "DynamicResources"
    return dict(plugin["args"])


@pytest.mark.parametrize(("version", "has_timeout"), [("v1.34.4", False), ("v1.35.4", True), ("v1.37.2", True)])
def test_binding_timeout_only_for_a_scheduler_that_knows_it(tmp_path: Path, version: str, has_timeout: bool) -> None:
    config = component_config.scheduler(kubeconfig="k", binding_timeout_s=15, binary=_binary(tmp_path, version))
    args = _args(config)
    assert args["kind"] == "DynamicResourcesArgs"
    assert ("bindingTimeout" in args) is has_timeout
    if has_timeout:
        assert args["bindingTimeout"] == "15s"


def test_a_binary_that_names_no_version_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "kube-scheduler"
    path.write_text("#!/bin/sh\necho hello\n")
    os.chmod(path, 0o755)
    with pytest.raises(ValueError, match=r"no v1\.N"):
        component_config.minor_version(str(path))
