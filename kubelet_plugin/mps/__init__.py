"""CUDA MPS for claims shared with ``sharing.strategy: MPS``: :mod:`.mps_plan` decides what the
claim's daemon should be (pure), :mod:`.control_daemon` starts and stops it,
:mod:`.claim_daemons` ties it to prepare, unprepare and the checkpoint, :mod:`.mps_dirs` names and
owns its per-claim directories."""
