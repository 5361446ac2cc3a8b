"""Load on a real GPU for the ``gpu``-marked tests: a CUDA process holding VRAM."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Allocates 1 GiB on the one GPU it sees (torch, else cupy), says "ready", then sleeps.
_HOLD_VRAM = """
import time
try:
    import torch
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
except ImportError:
    import cupy
    x = cupy.empty(1 << 30, dtype=cupy.uint8)
print("ready", flush=True)
time.sleep(120)
"""


@contextmanager
def process_holding_vram(gpu_uuid: str) -> Iterator[subprocess.Popen[str]]:
    """A child process holding 1 GiB of VRAM on GPU ``gpu_uuid`` (``CUDA_VISIBLE_DEVICES``), from the
    moment its allocation is done until the block ends (then killed)."""
    child = subprocess.Popen([sys.executable, "-c", _HOLD_VRAM], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_uuid))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        yield child
    finally:
        child.kill()
        child.wait()
