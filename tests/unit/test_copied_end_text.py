"""A Complete or Failed that Trainer copied from an earlier TrainJob's JobSet, told from the TrainJob's own end
(issue 34; the real Trainer and Kueue in tests/contract/test_trainer_status.py). Pure: the view and the text."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, PATCH_MANAGER, State
from dispatch import _decision as d
from dispatch._trainer import TrainJobView, labels_entry

NAME = "llama-s1"
CREATED = "2026-12-04T10:00:00Z"


def trainjob(*conds: tuple[str, str, Any], uid: str = "tj-new", created: Any = CREATED, admission: int = 0,
             labelled: bool = True, opened: bool = True) -> TrainJobView:
    """``conds``: (type, status, lastTransitionTime); ``admission``: the A it carries (0: never admitted);
    ``opened``: dispatch's runtime patch entry is there (dispatch opened it)."""
    return TrainJobView.from_obj({
        "metadata": {"name": NAME, "uid": uid, "creationTimestamp": created,
                     "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"} if labelled else {},
                     "annotations": {ANNOTATION_ADMISSION: str(admission)} if admission else {}},
        "spec": {"suspend": True,
                 "runtimePatches": [labels_entry(PATCH_MANAGER, {"node": {}})] if opened else []},
        "status": {"conditions": [{"type": t, "status": s, "lastTransitionTime": when} for t, s, when in conds]}})


def jobset(owner: str | None, *, deleting: bool = False) -> d.JobSetView:
    meta: dict[str, Any] = {"name": NAME, "uid": "js-1"}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
                                    "uid": owner, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T10:00:09Z"
    return d.JobSetView.from_obj({"metadata": meta, "spec": {"suspend": True, "replicatedJobs": [{"name": "node"}]},
                                  "status": {"conditions": [{"type": "Completed", "status": "True"}]}})


BEFORE, AFTER = "2026-12-04T09:50:00Z", "2026-12-04T10:05:00Z"


@pytest.mark.parametrize("ctype,state", [("Complete", State.SUCCEEDED), ("Failed", State.FAILED)])
def test_an_earlier_trainjobs_jobset_is_named_with_its_delete_and_the_close(ctype: str, state: State) -> None:
    for admitted in (0, 3):   # whatever A it carries: the JobSet it reads is another TrainJob's
        tj = trainjob((ctype, "True", AFTER), admission=admitted)
        assert tj.state is state
        text = d.copied_end_text(tj, jobset("tj-old"))
        assert text is not None and text.startswith(
            f"trainjob {NAME} reports {ctype}, but the condition {d.COPIED_END}: Trainer v2.3 copied it from jobset "
            f"{NAME}, which {d.ORPHANED}"), text
        assert "(uid tj-old)" in text and "(uid tj-new)" in text and "has not run" in text
        assert f"kubectl delete jobset/{NAME} configmap/{NAME}-runtime-snapshot" in text
        assert text.endswith("a new TrainJob runs, and the submission's A goes on)")
        assert f"`dispatch close {NAME}` and open it again" in text
        assert d.finished_text(tj, jobset("tj-old")) == text


def test_an_end_of_a_trainjob_never_admitted_is_called_copied_once_the_jobset_is_gone() -> None:
    """No clock: an end on a TrainJob that carries no A cannot be its own (nothing starts without one). The
    condition's date (another controller's clock) is only shown, whatever it says."""
    for when in (BEFORE, AFTER):
        tj = trainjob(("Complete", "True", when))
        for js in (None, jobset("tj-new"), jobset(None), jobset("tj-old", deleting=True)):
            text = d.copied_end_text(tj, js)
            assert text is not None and text.startswith(
                f"trainjob {NAME} reports Complete (dated {tj.ended_at.isoformat() if tj.ended_at else ''}), though "
                f"no execution of it was ever admitted (it carries no A): the condition {d.COPIED_END}"), text
            assert d.ORPHANED not in text and f"`dispatch close {NAME}`" in text
    undated = d.copied_end_text(trainjob(("Failed", "True", None)), None)
    assert undated is not None and undated.startswith(f"trainjob {NAME} reports Failed, though no execution")


def test_its_own_end_and_every_not_finished_state_are_not_called_copied() -> None:
    for when in (BEFORE, AFTER, CREATED):    # its own end, whatever the other controller's clock says
        own = trainjob(("Complete", "True", when), admission=1)
        for js in (None, jobset("tj-new"), jobset(None), jobset("tj-old", deleting=True)):
            assert d.copied_end_text(own, js) is None
            assert d.finished_text(own, js) == f"trainjob {NAME} is succeeded; open a new submission to run again"
    for held in (trainjob(), trainjob(("Complete", "False", BEFORE)), trainjob(("Suspended", "True", BEFORE))):
        assert held.state is State.HELD
        assert d.copied_end_text(held, jobset("tj-old")) is None
    # not dispatch's (no identity labels): never called anything of dispatch's
    assert d.copied_end_text(trainjob(("Complete", "True", AFTER), labelled=False), jobset("tj-old")) is None
    # labelled but not opened by dispatch (no runtime patch entry): Kueue may run it with no A, so no A proves
    # nothing there; an earlier TrainJob's JobSet still does
    hand = trainjob(("Complete", "True", BEFORE), opened=False)
    assert hand.labelled and not hand.dispatch_object
    assert d.copied_end_text(hand, None) is None
    assert d.copied_end_text(hand, jobset("tj-old")) is not None


@pytest.mark.parametrize("when,created", [(None, CREATED), (5, CREATED), ("yesterday", CREATED), (BEFORE, None),
                                          (BEFORE, "x" * 5000), ("9" * 5000, CREATED)])
def test_times_that_do_not_parse_change_nothing(when: Any, created: Any) -> None:
    tj = trainjob(("Complete", "True", when), created=created, admission=2)
    assert tj.state is State.SUCCEEDED
    assert d.copied_end_text(tj, None) is None
    never = trainjob(("Complete", "True", when), created=created)
    text = d.copied_end_text(never, None)
    assert text is not None and d.COPIED_END in text
    assert ("(dated" in text) == (never.ended_at is not None) == (when == BEFORE)


def test_the_complete_condition_dates_the_end_when_both_are_there() -> None:
    tj = trainjob(("Failed", "True", AFTER), ("Complete", "True", BEFORE))
    assert tj.ended_at is not None and tj.ended_at.isoformat() == "2026-12-04T09:50:00+00:00"
    assert trainjob(("Failed", "True", BEFORE)).ended_at is not None
    assert trainjob().ended_at is None
