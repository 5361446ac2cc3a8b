"""gpuready's shared core: device model, NVML access, health, slices, planning, Kubernetes access."""

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
"""NVIDIA's driver name, so documented DeviceClasses, CEL selectors and dcgm-exporter work unchanged."""

__version__ = "0.1.0"
