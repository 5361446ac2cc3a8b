"""The CDI loader stand-in rejects what a runtime's CDI loader rejects, naming the field, so the tests
that run it on prepare's specs can fail."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.devices import NVIDIA_CONTROL_DEVICE_NODES
from kubelet_plugin.cdi.cdi_spec import CdiDevice, claim_spec, driver_mounts
from kubelet_plugin.cdi.driver_files import DriverFile
from testbed.cdi_loader import loader_problems


def _spec() -> dict[str, Any]:
    devices = [CdiDevice("gpu-0", "gpu", "GPU-aaa", ("/dev/nvidia0",)),
               CdiDevice("gpu-1", "gpu", "GPU-bbb", ("/dev/nvidia1",))]
    return claim_spec("gpu.nvidia.com", "001e71af-c5fc-47a6-b4f5-477b213e4080", devices, NVIDIA_CONTROL_DEVICE_NODES,
                      driver_mounts("/run/nvidia/driver", [DriverFile("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")]))


def test_what_a_loader_rejects_is_named_by_field() -> None:
    good = _spec()
    cases = {
        "cdiVersion": lambda s: s.update(cdiVersion="0.4.0"),
        "kind": lambda s: s.update(kind="noslash"),
        "devices": lambda s: s.update(devices=[]),
        "devices[1].name": lambda s: s["devices"][1].update(name=s["devices"][0]["name"]),
        "devices[0].name": lambda s: s["devices"][0].update(name="-bad"),
        "devices[0].containerEdits.deviceNodes[0].permissions":
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(permissions="rwx"),
        "containerEdits.mounts[0].containerPath": lambda s: s["containerEdits"]["mounts"][0].pop("containerPath"),
        "devices[0].containerEdits.bogus": lambda s: s["devices"][0]["containerEdits"].update(bogus=1),
        "devices[0].containerEdits.env[0]": lambda s: s["devices"][0]["containerEdits"]["env"].__setitem__(0, "NOEQ"),
    }
    for field, mutate in cases.items():
        spec = copy.deepcopy(good)
        mutate(spec)
        errors = loader_problems(spec)
        assert any(e.startswith(field) for e in errors), (field, errors)


def test_a_spec_prepare_builds_passes() -> None:
    assert loader_problems(_spec()) == []
    assert loader_problems([]) == ["spec: must be an object"]
