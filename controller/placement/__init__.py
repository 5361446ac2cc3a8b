"""Placement mode (opt-in per pod by a scheduling gate): the controller plans all of a pod's claims on
one node (:mod:`.pod_plan`, pure), writes their allocations and lifts the gate
(:mod:`.placement_mode`); the kube-scheduler then honours those allocations."""
