"""What an earlier JobSet's Job and an earlier TrainJob's snapshot ConfigMap leave an admitted execution waiting
on, and what status says of them (issue 34: the two stalls of the two-hour campaign). Pure: views and texts."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch._trainer import TrainJobView
from dispatch._views import EventView

NAME = "llama-s1"
JOB = f"{NAME}-node-0"


def jobset(uid: str = "js-new", created: str = "2026-12-04T10:00:05Z", **meta: Any) -> d.JobSetView:
    return d.JobSetView.from_obj({"metadata": {"name": NAME, "uid": uid, "creationTimestamp": created, **meta},
                                  "spec": {"suspend": False, "replicatedJobs": [{"name": "node"}]}})


def job(owner: str | None = "js-old", created: str = "2026-12-04T10:00:00Z", *, suspend: bool = True,
        conditions: list[dict[str, str]] | None = None, kind: str = "JobSet") -> d.JobView:
    refs = [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": kind, "name": NAME, "uid": owner, "controller": True}]
    return d.JobView.from_obj({
        "metadata": {"name": JOB, "creationTimestamp": created,
                     "labels": {"jobset.sigs.k8s.io/jobset-name": NAME},
                     **({"ownerReferences": refs} if owner is not None else {})},
        "spec": {"suspend": suspend}, "status": {"conditions": conditions or []}})


def trainjob(uid: str = "tj-new") -> TrainJobView:
    return TrainJobView.from_obj({"metadata": {"name": NAME, "uid": uid, "labels": {
        LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}}, "spec": {"suspend": False}})


def test_the_views_read_owner_uid_and_creation_strictly() -> None:
    view = job()
    assert view.owner_uid == "js-old" and view.created is not None
    assert job(kind="TrainJob").owner_uid == ""   # only a JobSet controls a JobSet's Job
    assert jobset().uid == "js-new" and jobset().created is not None
    odd = d.JobView.from_obj({"metadata": {"name": JOB, "creationTimestamp": 5, "ownerReferences": "x"}})
    assert odd.owner_uid == "" and odd.created is None


def test_an_earlier_jobsets_job_is_named_with_its_delete_in_every_state() -> None:
    for view, state in ((job(), "is suspended"), (job(suspend=False), "is not suspended and could still start pods"),
                        (job(conditions=[{"type": "Complete", "status": "True"}]), "has finished")):
        text = d.orphaned_job_text(view, jobset())
        assert text is not None and text.startswith(
            f"job {JOB} {d.ORPHANED_JOB} of this name (uid js-old), deleted since, not to this one (uid js-new), "
            f"and {state}: JobSet cannot create"), text
        assert f"`kubectl delete job/{JOB}`" in text and "JobCreationFailed" in text


def test_a_job_with_no_owner_is_named_too() -> None:
    text = d.orphaned_job_text(job(owner=None), jobset())
    assert text is not None and f"job {JOB} has no owner: it {d.ORPHANED_JOB}" in text, text


@pytest.mark.parametrize("case", ["own", "later", "other-name", "deleting", "no-uid"])
def test_what_is_not_an_earlier_jobsets_job(case: str) -> None:
    view, current = job(), jobset()
    if case == "own":
        view = job(owner="js-new")
    elif case == "later":   # made after the JobSet read: a read that raced a re-creation
        view = job(created="2026-12-04T10:00:09Z")
    elif case == "other-name":
        view = d.JobView.from_obj({"metadata": {"name": "x-node-0", "labels": {
            "jobset.sigs.k8s.io/jobset-name": "x"}}})
    elif case == "deleting":
        current = jobset(deletionTimestamp="2026-12-04T10:00:06Z")
    else:
        current = jobset(uid="")
    assert d.orphaned_job_text(view, current) is None


def test_with_no_jobset_only_a_job_that_could_still_start_pods_is_named() -> None:
    """A MultiKueue worker's case: the copy deleted, its JobSet gone, its Job left unsuspended."""
    text = d.orphaned_job_text(job(suspend=False), None)
    assert text is not None and "that no longer exists" in text and "nothing will suspend it" in text, text
    assert d.orphaned_job_text(job(suspend=True), None) is None   # it starts nothing; no JobSet needs its name
    assert d.orphaned_job_text(job(owner=None, suspend=False), None) is None


def test_the_rule_names_an_unsuspended_earlier_job_as_its_blocker() -> None:
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[], nodes={}, jobset=jobset(),
                       jobs=[job(suspend=False)])
    assert not verdict.admissible
    assert [b for b in verdict.blockers if d.ORPHANED_JOB in b], verdict.blockers
    mine = d.decide(name=NAME, job_id="llama", submission="s1", pods=[], nodes={}, jobset=jobset(),
                    jobs=[job(owner="js-new", suspend=False)])
    assert f"job {JOB} is not suspended yet" in mine.blockers and not [b for b in mine.blockers
                                                                   if d.ORPHANED_JOB in b], mine.blockers


def event(reason: str, message: str, last: str = "2026-12-04T10:00:00Z", **extra: Any) -> EventView:
    return EventView.from_obj({"reason": reason, "message": message, "lastTimestamp": last, **extra})


def test_trainers_snapshot_refusal_names_the_configmap_and_its_delete() -> None:
    events = [event(d.BUILD_FAILED, "TrainJob resources reconciliation failed: runtime not found",
                    "2026-12-04T09:00:00Z"),
              event(d.BUILD_FAILED, "TrainJob resources reconciliation failed: unable to get runtime snapshot: "
                    f"invalid runtime snapshot: {d.SNAPSHOT_OWNED}", "2026-12-04T10:00:00Z")]
    text = d.unbuilt_text(trainjob(), events)
    assert text is not None and text.startswith(
        f"Trainer has built no JobSet for trainjob {NAME}: its runtime snapshot configmap {NAME}-runtime-snapshot "
        f"{d.ORPHANED} of this name, deleted since, not to this one (uid tj-new)"), text
    assert f"configmap/{NAME}-runtime-snapshot" in text


def test_another_build_failure_is_quoted_bounded_and_other_events_are_not() -> None:
    text = d.unbuilt_text(trainjob(), [event(d.BUILD_FAILED, "x" * 5000)])
    assert text is not None and text.endswith("x" * 400) and len(text) < 520, len(text or "")
    assert d.unbuilt_text(trainjob(), [event("Created", "made it")]) is None
    assert d.unbuilt_text(trainjob(), []) is None


def test_the_event_view_is_strict_and_bounded() -> None:
    view = EventView.from_obj({"reason": 7, "message": ["no"], "note": "x" * 3000,
                               "series": {"lastObservedTime": "2026-12-04T10:00:00.123456Z"}})
    assert view.reason == "" and view.message == "x" * EventView.MESSAGE_LIMIT and view.last is not None
    assert EventView.from_obj({}).last is None


def workload(*conditions: str, active: bool = True) -> Any:
    from dispatch._kueue import WorkloadView
    return WorkloadView.from_obj({"metadata": {"name": "trainjob-llama-s1-7c18d", "namespace": "ns"},
                                  "spec": {"active": active},
                                  "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}})


def queued(uid: str = "tj-new") -> TrainJobView:
    return TrainJobView.from_obj({"metadata": {"name": NAME, "uid": uid, "labels": {
        LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1", "kueue.x-k8s.io/queue-name": "lq"}}, "spec": {"suspend": True}})


def test_a_workload_kueue_finished_under_a_trainjob_that_never_ran_names_close_and_open() -> None:
    """The third campaign's stall (issue 34, seed 1081610348): a re-opened TrainJob's Workload declared Finished
    at its creation; the object stayed Queued ("waiting for Kueue to admit it") and release changed nothing."""
    note = d.workload_note(workload("Finished", "QuotaReserved"), queued())
    assert d.KUEUE_NEVER_ADMITS in note and f"`dispatch close {NAME}` and open it again" in note, note
    cause = d.explain(queued(), None, None, note)
    assert d.KUEUE_NEVER_ADMITS in str(cause), cause
    # a Workload that is not finished says what it said before
    assert d.workload_note(workload(), queued()).startswith("waiting for quota")
    assert d.workload_note(workload("QuotaReserved", active=False), queued()).startswith("workload deactivated")
