"""Health configuration: XID overrides, recovery hold-down, poll and probe timing.

One frozen dataclass the kubelet plugin builds from its flags/Helm values and hands to the monitor.
Bad values are refused at construction with a message naming the field and the fix, so a typo in a
values file stops the plugin at start (one clear line) instead of producing a crash loop later.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubelet_plugin.config import PluginConfig


@dataclass(frozen=True)
class HealthPolicy:
    """How the monitor judges and recovers devices.

    Recovery: a device returns only when its cause has cleared and ``required_passes`` validations
    have passed over at least ``hold_down_s``. Each time a device fails again within
    ``flap_window_s`` of its last recovery (or while recovering), its hold-down doubles
    (``backoff_factor``), up to ``max_hold_down_s``.
    """

    extra_fatal_xids: frozenset[int] = frozenset()
    extra_ignored_xids: frozenset[int] = frozenset()
    required_passes: int = 3
    hold_down_s: float = 300.0  # a reset-class fault must stay quiet this long before the device returns
    max_hold_down_s: float = 3600.0
    backoff_factor: float = 2.0
    flap_window_s: float = 1800.0
    poll_interval_s: float = 10.0  # remapped rows, GPU lost, Unknown Error, recovery action, fabric
    # NVML event wait per call: a second, so an idle node's event thread wakes once a second (not
    # five times), and stop() still returns within a few.
    event_wait_ms: int = 1000
    probe_timeout_s: float = 30.0  # a CUDA probe running longer is killed and the GPU fails
    revalidate_interval_s: float = 0.0  # re-probe healthy GPUs this often; 0 = only at start/recovery

    def __post_init__(self) -> None:
        both = self.extra_fatal_xids & self.extra_ignored_xids
        if both:
            raise ValueError(
                f"extra_fatal_xids and extra_ignored_xids both list XID(s) {sorted(both)}; "
                f"remove each from one of the two lists"
            )
        if self.required_passes < 1:
            raise ValueError(f"required_passes must be at least 1 (got {self.required_passes})")
        for name in ("hold_down_s", "max_hold_down_s", "flap_window_s", "revalidate_interval_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative (got {getattr(self, name)})")
        if self.max_hold_down_s < self.hold_down_s:
            raise ValueError(
                f"max_hold_down_s ({self.max_hold_down_s}) is below hold_down_s ({self.hold_down_s}); "
                f"raise max_hold_down_s"
            )
        if self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be 1 or more (got {self.backoff_factor})")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive (got {self.poll_interval_s})")
        if not 1 <= self.event_wait_ms <= 5000:
            raise ValueError(f"event_wait_ms must be between 1 and 5000 (got {self.event_wait_ms})")
        if self.probe_timeout_s <= 0:
            raise ValueError(f"probe_timeout_s must be positive (got {self.probe_timeout_s})")

    @property
    def recheck_interval_s(self) -> float:
        """How often a device that is not healthy is re-validated: N passes spread over the hold-down."""
        return max(0.01, self.hold_down_s / self.required_passes) if self.hold_down_s else 0.01


def policy_from_config(config: PluginConfig) -> HealthPolicy:
    """The health monitor's policy from the plugin's settings (ValueError names the conflicting XIDs)."""
    return HealthPolicy(extra_fatal_xids=config.xid_fatal, extra_ignored_xids=config.xid_ignore,
                        required_passes=config.recovery_passes, hold_down_s=config.hold_down,
                        probe_timeout_s=config.probe_timeout, revalidate_interval_s=config.revalidate_interval,
                        poll_interval_s=config.health_poll_interval, event_wait_ms=config.health_event_wait_ms)
