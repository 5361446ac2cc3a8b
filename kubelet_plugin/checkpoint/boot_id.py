"""This boot's ID, which the checkpoint's records carry: a record of an earlier boot is stale (its
CDI files in ``/var/run/cdi`` and its MIG instances are gone). Its own module so that the daemon can
read it at start-up without loading the checkpoint's codec and store before the first ResourceSlice.
"""

from __future__ import annotations

import os

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's ID; ``GPUREADY_BOOT_ID`` overrides it (tests simulate a reboot with it)."""
    override = os.environ.get("GPUREADY_BOOT_ID")
    if override:
        return override
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"
