"""A deleted pod whose end is proven, held by another controller's finalizer (issue 34, a campaign's two stalls):
status names the finalizer and the patch that removes it. Pure: the view and the text."""

from __future__ import annotations

from typing import Any

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch._views import POD_FINALIZER, PodView

JOB_TRACKING = "batch.kubernetes.io/job-tracking"


def pod(*, node: str | None = None, deleting: bool = True, finalizers: tuple[str, ...] = (JOB_TRACKING,),
        phase: str = "Failed") -> PodView:
    meta: dict[str, Any] = {"name": "k1-s1-b-node-0-0-x", "uid": "u1", "finalizers": list(finalizers),
                            "creationTimestamp": "2026-12-04T14:20:00Z",
                            "labels": {LABEL_JOB_ID: "k1", LABEL_SUBMISSION: "s1",
                                       "jobset.sigs.k8s.io/jobset-name": "k1-s1-b"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T14:22:15Z"
    spec: dict[str, Any] = {"containers": [{"name": "node"}]}
    if node:
        spec["nodeName"] = node
    return PodView.from_obj({"metadata": meta, "spec": spec, "status": {"phase": phase}})


def test_a_never_scheduled_deleted_pod_held_by_the_job_controllers_finalizer_names_the_patch() -> None:
    [left] = d.remaining([pod()], {})
    assert left.proven and d.FOREIGN_FINALIZER in left.why, left.why
    assert left.why.startswith(f"its end is proven (not-scheduled), but finalizer {JOB_TRACKING}")
    assert "kubectl patch pod k1-s1-b-node-0-0-x --type=json" in left.why
    assert f"pod {left.name}: {left.why}" in d.why_text([left])


def test_dispatchs_own_finalizer_and_unproven_or_undeleted_pods_are_not_called_foreign() -> None:
    [ours] = d.remaining([pod(finalizers=(POD_FINALIZER, JOB_TRACKING))], {})
    assert d.FOREIGN_FINALIZER not in ours.why and "dispatch admin release-pod" in ours.why
    [waiting] = d.remaining([pod(deleting=False)], {})
    assert not waiting.proven and d.FOREIGN_FINALIZER not in waiting.why
    [bound] = d.remaining([pod(node="node-3")], {})       # its node unreadable here: its end unproven
    assert not bound.proven and d.FOREIGN_FINALIZER not in bound.why
    assert d.remaining([pod(finalizers=())], {})[0].why == ""   # nothing holds it: it goes by itself


def test_many_or_long_finalizers_are_bounded_in_the_text() -> None:
    [left] = d.remaining([pod(finalizers=tuple(f"example.com/f{i}-" + "x" * 300 for i in range(20)))], {})
    assert len(left.why) < 1200 and left.why.count("example.com/f") == 4


def test_the_admission_checks_message_names_the_finalizer_and_the_patch_too() -> None:
    """Kueue mode: the check's message is what the Workload (and dispatch's Event) shows; it said only "on no node"
    in the campaign's Kueue-mode stall."""
    left = d.remaining([pod()], {})
    message = d.waiting_text(d.Verdict(remaining=left, blockers=()))
    assert message.startswith("waiting for pods of the previous execution to go: k1-s1-b-node-0-0-x on no node; ")
    assert d.FOREIGN_FINALIZER in message and "kubectl patch pod k1-s1-b-node-0-0-x --type=json" in message
    waiting = d.waiting_text(d.Verdict(remaining=d.remaining([pod(deleting=False)], {}), blockers=()))
    assert waiting == "waiting for pods of the previous execution to go: k1-s1-b-node-0-0-x on no node"
