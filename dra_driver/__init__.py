"""gpuready's shared core: only what both daemons use (device model, slices, quantities, the best-fit
order, opaque config, Kubernetes access and the one list/watch informer, logs, the metrics server, the
CLI registry)."""

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
"""NVIDIA's driver name, so documented DeviceClasses, CEL selectors and dcgm-exporter work unchanged."""

__version__ = "0.1.0"
