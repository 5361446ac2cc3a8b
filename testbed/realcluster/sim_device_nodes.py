"""The host device nodes a simulated GPU node's CDI specs name, so containerd can create containers.

A simulated node's CDI specs mount ``/dev/nvidia<minor>``, the control nodes and, for a MIG device,
its ``/dev/nvidia-caps/nvidia-cap<N>`` nodes; containerd stats each one when it creates a
container. The testbed makes them (:class:`testbed.realcluster.cleanup.DeviceNodes`) from this list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sim_device_nodes(nvml: str) -> list[tuple[str, int, int]]:
    """(path, major, minor) of every device node the node ``nvml`` (``sim:<profile>@<node>``) names.

    Read from the driver's own discovery (``python -m dra_driver devices``), so the list follows the
    profile. The majors of the dynamic nodes (nvidia-uvm..., nvidia-caps) are made up: nothing opens
    them, containerd only stats them.
    """
    out = subprocess.run([sys.executable, "-m", "dra_driver", "devices", "--nvml", nvml, "-o", "json"],
                         capture_output=True, check=True, cwd=REPO)
    data = json.loads(out.stdout)
    nodes = [(f"/dev/nvidia{g['minor']}", 195, int(g["minor"])) for g in data["gpus"]]
    # A MIG device's CDI edits name its nvidia-caps nodes (/dev/nvidia-caps/nvidia-cap<N>): minor N.
    nodes += [(path, 508, int(path.rsplit("nvidia-cap", 1)[1]))
              for g in data["gpus"] for m in g.get("mig_devices", []) for path in m.get("device_nodes", [])]
    for i, path in enumerate(data["control_device_nodes"]):
        nodes.append((path, 195, 255) if path == "/dev/nvidiactl" else (path, 511, i))
    return nodes
