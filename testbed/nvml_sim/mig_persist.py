"""MIG instances that outlive the simulator's process, as they outlive the plugin's on a real GPU.

A GPU keeps its MIG instances when the process that created them dies; the simulated NVML lives in
the plugin's process, so without this a kill -9 would take the instances with it and a crash test
could never see one leak. With ``GPUREADY_SIM_MIG_STATE=<file>`` the simulator writes the instances
of every GPU to that file after each MIG change and recreates them (same UUIDs) when it starts, so a
restarted plugin finds what its predecessor left on the GPUs, and a test reads the file to count leaks.
"""

from __future__ import annotations

import json
import os
from typing import Any

from testbed.nvml_sim.sim_state import CI_PROFILE_SLICES, SimComputeInstance, SimGpu, create_gpu_instance

MIG_STATE_ENV = "GPUREADY_SIM_MIG_STATE"


def mig_state_path() -> str:
    """The file named by ``GPUREADY_SIM_MIG_STATE``, or "" when MIG instances live with the process."""
    return os.environ.get(MIG_STATE_ENV, "")


def layout(gpus: list[SimGpu]) -> dict[str, list[dict[str, Any]]]:
    """Every GPU's instances: GPU UUID -> [{profile, start, cis: [{profile, uuid}]}] (the file's content)."""
    return {gpu.uuid: [{"profile": gi.profile.id, "start": gi.start,
                        "cis": [{"profile": ci.profile, "uuid": ci.uuid} for ci in gi.cis.values()]}
                       for gi in sorted(gpu.gis.values(), key=lambda g: g.id)] for gpu in gpus if gpu.gis}


def save(path: str, gpus: list[SimGpu]) -> None:
    """Write the layout atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(layout(gpus), f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read(path: str) -> dict[str, list[dict[str, Any]]]:
    """The saved layout ({} when there is no file yet)."""
    try:
        with open(path) as f:
            data: dict[str, list[dict[str, Any]]] = json.load(f)
            return data
    except FileNotFoundError:
        return {}


def restore(path: str, gpus: list[SimGpu], serials: Any) -> None:
    """Replace each GPU's instances with the saved ones (``serials``: the simulator's serial counter)."""
    saved = read(path)
    for gpu in gpus:
        if gpu.uuid not in saved:
            continue
        gpu.gis.clear()
        for entry in saved[gpu.uuid]:
            gi = create_gpu_instance(gpu, entry["profile"], entry["start"], next(serials))
            for ci_id, ci in enumerate(entry["cis"]):
                slices = CI_PROFILE_SLICES[ci["profile"]]
                gi.cis[ci_id] = SimComputeInstance(id=ci_id, profile=ci["profile"], slices=slices,
                                                   start=ci_id * slices, uuid=ci["uuid"])
