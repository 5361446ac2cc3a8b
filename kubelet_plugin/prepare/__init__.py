"""NodePrepareResources and NodeUnprepareResources.

:mod:`.claim_plan` checks a fetched claim and resolves its configuration (pure);
:mod:`.preparer` runs prepare in two checkpointed phases (reserve, side effects, complete);
:mod:`.unpreparer` undoes it; :mod:`.mig_instances`, :mod:`.mig_ops` and
:mod:`.whole_gpu_instance` create and destroy dynamic MIG instances; :mod:`.prepare_errors` turns
failures into the kubelet's per-claim errors.
"""
