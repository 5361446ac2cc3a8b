"""Device kinds: what this node can prepare, each kind behind one interface.

A device the plugin prepares is one of four kinds, each a module saying how it is enumerated from a
GPU, what it occupies (two claims conflict when their devices' occupancies meet), which MIG instance
preparing it creates, and which device nodes its container gets:

- :mod:`~kubelet_plugin.kinds.whole_gpu`: a GPU whose MIG mode is off (shared GPUs too: sharing is
  how the slice publishes it and what the claim's config asks, not another kind of device);
- :mod:`~kubelet_plugin.kinds.static_mig`: a MIG device the admin created (``--mig-mode static``);
- :mod:`~kubelet_plugin.kinds.mig_placement`: a MIG profile at a placement, created at prepare and
  destroyed at unprepare (``--mig-mode dynamic``);
- :mod:`~kubelet_plugin.kinds.full_instance`: a whole MIG-enabled GPU under dynamic MIG, which runs
  CUDA only through its full-size instance (shared by the claims of that GPU).

:func:`~kubelet_plugin.kinds.registry.index_devices` asks each kind for a GPU's devices; the facts prepare reads on every claim
(config kind, memory, occupancy, the instance to create: :class:`~kubelet_plugin.kinds.device_kind.NodeDevice`) are computed once, when the node is
indexed, so a prepare reads fields and enters no kind module unless it creates an instance. A new
kind is one module and one line in :data:`~kubelet_plugin.kinds.registry.KINDS`. How each kind is published is
:mod:`dra_driver.slices` (shared with the testbed's checks), and how it is validated is the health
topology (:mod:`kubelet_plugin.health.topology`): both read the GPU's MIG mode, not these kinds.
"""
