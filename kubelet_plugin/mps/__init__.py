"""CUDA MPS for claims shared with ``sharing.strategy: MPS``: :mod:`.mps_plan` decides what the
claim's daemon should be (pure), :mod:`.control_daemon` starts and stops it, :mod:`.mps_dirs` names
and owns its per-claim directories. Tying a daemon to a claim's prepare, unprepare and checkpoint
record is the preparer's (:mod:`kubelet_plugin.prepare.mps_claims`)."""
