"""The GPU driver behind the kubelet side: what NodePrepareResources and NodeUnprepareResources do.

:mod:`.claim_plan` checks a fetched claim and resolves its configuration (pure);
:mod:`.preparer` runs prepare in two checkpointed phases (reserve, side effects, complete) and is
the :class:`~kubelet_plugin.kubelet.driver.DraDriver` the kubelet side calls; :mod:`.unpreparer`
undoes it (both under the per-claim lock, preparer.ClaimLocks);
:mod:`.mig_instances` and :mod:`.whole_gpu_instance` create and destroy dynamic MIG instances;
:mod:`.mps_claims` ties a claim's MPS daemon to its record; :mod:`.recovery` and
:mod:`.spec_recovery` reconcile the checkpoint with the node at start-up.
"""
