"""Typed errors of the NVML backend, with messages a person can act on."""

from __future__ import annotations

from typing import Any

import pynvml

SIM_HINT = "use --nvml=sim:<profile> (or GPUREADY_NVML=sim:<profile>)"


class NvmlError(Exception):
    """Base class of the backend's errors."""


class NvmlUnavailableError(NvmlError):
    """NVML could not be initialised or answer node-wide questions (library missing, driver not loaded)."""


class MigError(NvmlError):
    """A MIG device could not be created, found or destroyed; ``nvml_error`` is NVML's own error."""

    def __init__(self, message: str, nvml_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.nvml_error = nvml_error


_CODE_NAMES: dict[int, str] = {
    getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}


def describe_nvml_error(error: BaseException, function: str | None = None) -> str:
    """``"nvmlDeviceGetMemoryInfo: GPU is lost (NVML_ERROR_GPU_IS_LOST)"``: what, where, which code."""
    code: Any = getattr(error, "value", None)
    try:
        text = str(error)
    except Exception:  # pynvml's __str__ asks the library, which may be gone
        text = f"NVML error {code}"
    name = _CODE_NAMES.get(code, "") if isinstance(code, int) else ""
    where = f"{function}: " if function else ""
    return f"{where}{text} ({name})" if name else f"{where}{text}"
