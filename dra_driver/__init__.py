"""gpuready's shared core: only what both daemons use (device model, slices, quantities, the best-fit
order, opaque config, Kubernetes access and the one list/watch informer, logs, the metrics server, the
CLI registry)."""

__version__ = "0.1.0"
