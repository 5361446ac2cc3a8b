"""GPU Ready: validation, monitoring, XID policy and the health state machine.

Public interface (used by the kubelet plugin)::

    from kubelet_plugin.health import HealthMonitor, HealthPolicy, HealthSnapshot
    monitor = HealthMonitor(nvml, devices, HealthPolicy(), prober=None, on_change=callback)
    monitor.start()                      # events registered on every GPU before this returns
    monitor.snapshot().unhealthy()       # {device name: reason} -> build_pool(..., unhealthy=...)

The CUDA probe child (``cuda_probe.py``) is run as a file and never imports this package.
"""

from kubelet_plugin.health.monitor import HealthMonitor
from kubelet_plugin.health.policy import HealthPolicy
from kubelet_plugin.health.state import DeviceHealth, HealthSnapshot, HealthState

__all__ = ["DeviceHealth", "HealthMonitor", "HealthPolicy", "HealthSnapshot", "HealthState"]
