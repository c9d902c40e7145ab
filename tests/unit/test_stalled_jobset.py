"""The JobSet Trainer can no longer update once the runtime changed after open (issue 25, item 3, as the real
Trainer and JobSet showed), and a runtime deleted after open: status names the action that ends each."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch._records import State
from dispatch._trainer import TrainJobView

NAME = "llama-s1"
WAY_OUT = f"`dispatch close {NAME}` deletes the TrainJob and its JobSet"


def tj(*, suspend: bool, targets: tuple[str, ...] = ("node",), admission: int = 2) -> TrainJobView:
    view = TrainJobView.from_obj({"metadata": {"name": NAME, "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"},
                                               "annotations": {ANNOTATION_ADMISSION: str(admission)}},
                                  "spec": {"suspend": suspend}})
    return replace(view, patch_targets=targets, runtime_kind="TrainingRuntime", runtime_name="torch")


def js(*, suspend: bool, jobs: tuple[str, ...] = ("node",), **extra: Any) -> d.JobSetView:
    return d.JobSetView.from_obj({"metadata": {"name": NAME, **extra.get("meta", {})}, "spec": {
        "suspend": suspend, "replicatedJobs": [{"name": j} for j in jobs]}, "status": extra.get("status", {})})


def test_the_jobset_view_reads_its_replicated_jobs() -> None:
    assert js(suspend=True, jobs=("node", "launcher")).replicated_jobs == ("node", "launcher")


def test_a_hold_that_never_reaches_a_jobset_built_before_the_runtime_gained_a_job_names_close() -> None:
    """Trainer v2.2 (and the fake with JobSet's webhook): the JobSet runs on, built with ``node`` only."""
    text = d.stalled_jobset_text(tj(suspend=True), js(suspend=False), ["node", "launcher"])
    assert text is not None
    assert text.startswith(f"jobset {NAME} was built with replicatedJobs node and TrainingRuntime torch now has "
                           "node, launcher: JobSet refuses any change")
    assert "the hold never reaches its pods" in text and WAY_OUT in text
    cause = d.explain(tj(suspend=True), d.Verdict((), (f"jobset {NAME} is not suspended yet",)), stalled=text)
    assert cause.reason == "PodsRemain" and cause.detail.endswith(text)
    assert f"jobset {NAME} is not suspended yet" in cause.detail


def test_a_release_whose_entry_targets_a_job_the_jobset_lacks_names_close() -> None:
    """Trainer v2.3 builds from its snapshot: the entry re-targeted at ``launcher`` makes the JobSet invalid,
    so the TrainJob runs (unsuspended) while its JobSet stays suspended."""
    running = tj(suspend=False, targets=("node", "launcher"))
    text = d.stalled_jobset_text(running, js(suspend=True), ["node", "launcher"])
    assert text is not None and "execution 2 never starts" in text and WAY_OUT in text
    assert text.startswith(f"jobset {NAME} stays suspended: dispatch's runtime patch entry targets replicatedJob "
                           "launcher, which the JobSet (replicatedJobs node, built before TrainingRuntime torch "
                           "changed) does not have")
    cause = d.explain(running, None, stalled=text)
    assert (cause.reason, cause.detail) == ("Admitted", f"execution 2 admitted; {text}")
    # held, its job renamed: every release re-targets the entry at the runtime as it is now and is refused
    held = d.stalled_jobset_text(tj(suspend=True, targets=("trainer",)), js(suspend=True), ["trainer"])
    assert held is not None and "no release can start it" in held and WAY_OUT in held


@pytest.mark.parametrize(("trainjob", "jobset", "runtime"), [
    (tj(suspend=True), js(suspend=True), ["node", "launcher"]),          # held, suspended: Trainer v2.3's hold
    (tj(suspend=True), js(suspend=False), ["node"]),                     # the hold not yet acted on
    (tj(suspend=True), js(suspend=False), None),                         # runtime unreadable: nothing claimed
    (tj(suspend=False), js(suspend=False), ["node", "launcher"]),        # running, the warning covers it
    (tj(suspend=False, targets=("node", "launcher")), js(suspend=False, jobs=("node", "launcher")), ["node"]),
    (tj(suspend=True), js(suspend=False, meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}), ["launcher"]),
    (tj(suspend=True), js(suspend=False, status={"conditions": [{"type": "Completed", "status": "True"}]}),
     ["launcher"]),
    (tj(suspend=True), None, ["launcher"]),
])
def test_no_stall_claimed_where_trainer_can_still_act(trainjob: TrainJobView, jobset: d.JobSetView | None,
                                                      runtime: list[str] | None) -> None:
    assert d.stalled_jobset_text(trainjob, jobset, runtime) is None


def test_a_runtime_gone_is_warned_with_the_actions_that_work() -> None:
    running = tj(suspend=False)
    assert running.state is State.RUNNING
    text = d.runtime_missing_warning(running, True)
    assert text == (f"trainjob {NAME}: TrainingRuntime torch is not found: Trainer's webhook refuses every change "
                    "to the TrainJob while it is gone, so its JobSet goes on running, and `dispatch hold` "
                    "and `dispatch release` fail; re-create TrainingRuntime torch, or `dispatch close llama-s1` (a "
                    "delete is not refused)")
    assert "goes on running" not in (d.runtime_missing_warning(tj(suspend=True), True) or "")
    assert d.runtime_missing_warning(running, False) is None
    assert d.runtime_missing_warning(replace(running, patch_targets=()), True) is None
