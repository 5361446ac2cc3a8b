"""Claims followed through device failures: when a device a claim holds turns unhealthy, the claim's
``status.devices`` condition and an Event say so (:mod:`.device_conditions` decides, pure;
:mod:`.reconciler` watches and writes), and a configurable policy can evict the pod."""
