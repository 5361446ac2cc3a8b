"""The writes of NodePrepareResources and NodeUnprepareResources, in the order they happen, each named.

A plugin can die before or after any of them (kill -9, OOM, a node admin's restart). Start-up
recovery (:mod:`kubelet_plugin.prepare.recovery`) and the kubelet's retry must converge from every
one, leaking nothing. Each step is one method that does exactly that write and is called only when
the write is due (a plain claim never enters ``create_mig`` or ``start_mps``), so that a crash test
can stop the plugin just before or just after it by wrapping the method from outside: production
code carries no test hook. A new write gets a step here; a test reaches every step named, so the
list cannot drift from the code.

Pure data: no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Step:
    """One write of a prepare or unprepare; ``target`` is ``module:Class.method``, the method doing it."""

    name: str
    call: Literal["prepare", "unprepare"]
    target: str
    what: str


_PREPARER = "kubelet_plugin.prepare.preparer:Preparer"
_UNPREPARER = "kubelet_plugin.prepare.unpreparer:Unpreparer"

PREPARE_STEPS: tuple[Step, ...] = (
    Step("record_intent", "prepare", f"{_PREPARER}.record_intent",
         "checkpoint phase 1: the claim's record in PrepareStarted, naming what is about to be created"),
    Step("create_mig", "prepare", "kubelet_plugin.prepare.mig_instances:MigInstances.create",
         "dynamic MIG: the claim's GPU and compute instances"),
    Step("start_mps", "prepare", f"{_PREPARER}.start_mps",
         "sharing.strategy MPS: the claim's control daemon, recorded before and after it starts"),
    Step("write_cdi_spec", "prepare", f"{_PREPARER}.write_spec", "the claim's CDI spec file"),
    Step("record_completion", "prepare", f"{_PREPARER}.record_completion",
         "checkpoint phase 2: PrepareCompleted with the answer and the spec"),
)

UNPREPARE_STEPS: tuple[Step, ...] = (
    Step("remove_cdi_spec", "unprepare", f"{_UNPREPARER}.remove_spec", "the claim's CDI spec file removed"),
    Step("stop_mps", "unprepare", f"{_UNPREPARER}.stop_mps", "the claim's MPS control daemon stopped"),
    Step("destroy_mig", "unprepare", f"{_UNPREPARER}.destroy_mig", "one dynamic MIG instance destroyed"),
    Step("drop_record", "unprepare", f"{_UNPREPARER}.drop_record", "the claim's checkpoint record dropped"),
)

STEPS: tuple[Step, ...] = PREPARE_STEPS + UNPREPARE_STEPS


def step_named(name: str) -> Step:
    """The step called ``name``; a ValueError listing the known names otherwise."""
    for step in STEPS:
        if step.name == name:
            return step
    raise ValueError(f"unknown prepare/unprepare step {name!r}; known: {', '.join(s.name for s in STEPS)}")
