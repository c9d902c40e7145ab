"""The guard's decision (the admission webhook), branch by branch: what starts, what is armed, what is kept."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch._identity import RecordView, new_record
from dispatch._kueue import WorkloadView
from dispatch._names import ANNOTATION_ADMISSION, ANNOTATION_STARTED, ANNOTATION_TOKEN, PATCH_MANAGER
from dispatch._records import RemainingPod
from dispatch._trainer import TrainJobView

NAME, UID, WL_UID = "llama-s1", "tj-uid", "wl-uid"
LABELS = {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}


def tj(*, suspend: bool = True, a: int | None = 2, patch_a: int | None = None, started: int | None = None,
       token: str | None = None, generation: int = 5, labels: dict[str, str] | None = None,
       entry: bool = True, extra: dict[str, str] | None = None) -> TrainJobView:
    ann: dict[str, str] = {}
    if a is not None:
        ann[ANNOTATION_ADMISSION] = str(a)
    if started is not None:
        ann[ANNOTATION_STARTED] = str(started)
    if token is not None:
        ann[ANNOTATION_TOKEN] = token
    ann.update(extra or {})
    spec: dict[str, Any] = {"suspend": suspend}
    if entry:
        pod_labels = dict(LABELS)
        pod_labels[LABEL_ADMISSION] = str(a if patch_a is None else patch_a)
        spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": {"labels": pod_labels}}}}}]}}}}]
    return TrainJobView.from_obj({"metadata": {
        "name": NAME, "namespace": "ns", "uid": UID, "generation": generation, "resourceVersion": "9",
        "labels": LABELS if labels is None else labels, "annotations": ann}, "spec": spec})


def record(a: int = 3, *, uid: str = UID, holder: str = NAME) -> RecordView:
    obj = new_record("llama", "s1", holder, admission=a)
    obj["metadata"]["resourceVersion"] = "4"
    obj["spec"]["trainJob"]["uid"] = uid
    return RecordView.from_obj(obj)


def workload(*, admitted: bool = True, evicted: bool = False, checked: bool = True,
             labels: dict[str, str] | None = None) -> WorkloadView:
    conds = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": str(admitted)},
             {"type": "Evicted", "status": str(evicted)}]
    checks = [{"name": "dispatch", "state": "Ready", "message": "A=3",
               "lastTransitionTime": "2026-01-01T00:00:00Z"}] if checked else []
    return WorkloadView.from_obj({"metadata": {"name": "trainjob-llama-s1-abc", "namespace": "ns", "uid": WL_UID,
                                               "labels": labels or {}},
                                  "spec": {"active": True},
                                  "status": {"conditions": conds, "admissionChecks": checks}})


CLEAR = d.Verdict((), ())
POD = RemainingPod("llama-s1-node-0-0-x", "node-1", "Ready", "Running", True, 2, "2026-01-01T00:00:00Z")
PODS = d.Verdict((POD,), ())
LAYER = d.Verdict((), ("job llama-s1-node-0 has not confirmed its suspension yet",))


def plain_start() -> tuple[TrainJobView, TrainJobView]:
    """dispatch release's unsuspend: A=3 raised (generation 6), started marked 3 in the same write."""
    old = tj(a=3, started=2, token="t", generation=6)
    return old, tj(suspend=False, a=3, started=3, token="t", generation=7)


def kueue_start(gen: int = 7) -> tuple[TrainJobView, TrainJobView]:
    """Kueue's unsuspend after the controller raised A=3 on generation 5 (the raise made it 6, Kueue's
    write of the pod set information 7, as the real Kueue does)."""
    old = tj(a=3, started=0, token=kueue_token(workload(), 5), generation=gen)
    return old, tj(suspend=False, a=3, started=0, token=kueue_token(workload(), 5), generation=gen + 1)


# --------------------------------------------------------------------------- what counts as starting


@pytest.mark.parametrize(("operation", "old_suspend", "new_suspend", "starts"), [
    ("CREATE", None, False, True), ("CREATE", None, True, False),
    ("UPDATE", True, False, True), ("UPDATE", True, True, False),
    ("UPDATE", False, False, False), ("UPDATE", False, True, False), ("DELETE", True, False, False),
])
def test_starts_execution(operation: str, old_suspend: bool | None, new_suspend: bool, starts: bool) -> None:
    old = tj(suspend=old_suspend) if old_suspend is not None else None
    assert d.starts_execution(operation, old, tj(suspend=new_suspend)) is starts


def kueue_token(workload: WorkloadView, generation: int | None) -> str:
    """The token the controller writes with a Kueue-mode raise (it calls the same function)."""
    return d.kueue_raise_token(workload.ref.uid, generation)


def test_token_is_the_workload_uid_and_the_generation_raised_on() -> None:
    assert d.kueue_raise_token(WL_UID, 5) == f"{WL_UID}/5"
    assert d.kueue_raise_token(WL_UID, None) == f"{WL_UID}/0"


# --------------------------------------------------------------------------- the armed starts pass


def test_dispatch_release_unsuspend_is_allowed() -> None:
    old, new = plain_start()
    assert d.guard("UPDATE", old, new, CLEAR, record(3)) is None


@pytest.mark.parametrize("gen", [6, 7])
def test_kueue_unsuspend_after_the_raise_is_allowed(gen: int) -> None:
    """Right after the raise (6), or after Kueue's own pod set write (7)."""
    old, new = kueue_start(gen)
    assert d.guard("UPDATE", old, new, CLEAR, record(3), workload()) is None


@pytest.mark.parametrize(("gen", "writes"), [(5, 0), (8, 3), (9, 4)])
def test_kueue_start_after_a_start_and_a_stop_is_denied(gen: int, writes: int) -> None:
    """Raised on 5: at 8 the object can have been started (7) and stopped (8) since; 5 means no raise."""
    old, new = kueue_start(gen)
    msg = d.guard("UPDATE", old, new, CLEAR, record(3), workload())
    assert msg == ("trainjob llama-s1 cannot start: A=3 was not raised for this admission of workload "
                   f"trainjob-llama-s1-abc ({writes} spec writes since the raise; a start and a stop since "
                   "would make it run twice)")


# --------------------------------------------------------------------------- pods and layers


@pytest.mark.parametrize("start", [plain_start, kueue_start])
def test_a_pod_that_may_run_denies_even_an_armed_start(start: Any) -> None:
    old, new = start()
    msg = d.guard("UPDATE", old, new, PODS, record(3), workload())
    assert msg == ("trainjob llama-s1 cannot start: remaining pods: llama-s1-node-0-0-x on node-1 (Ready)")


def test_unscheduled_pod_is_named_as_status_names_it() -> None:
    old, new = plain_start()
    pending = RemainingPod("p-0", None, "", "Pending", False, None, None)
    msg = d.guard("UPDATE", old, new, d.Verdict((pending,), ()), record(3))
    assert msg == "trainjob llama-s1 cannot start: remaining pods: p-0 on no node (not scheduled)"


def test_a_layer_that_has_not_confirmed_its_suspension_denies() -> None:
    old, new = plain_start()
    assert d.guard("UPDATE", old, new, LAYER, record(3)) == (
        "trainjob llama-s1 cannot start: job llama-s1-node-0 has not confirmed its suspension yet")


def test_no_read_denies() -> None:
    old, new = plain_start()
    assert d.guard("UPDATE", old, new, None, record(3)) == (
        "trainjob llama-s1 cannot start: the guard could not read its pods")


def test_unsuspended_create_is_denied_naming_no_pod() -> None:
    """Refused whatever the pods show, so the answer names none: the guard reads nothing for a create, and a
    review made up by anyone who reaches its port (any namespace, any identity) learns nothing of the pods."""
    new = tj(suspend=False, a=3, started=3)
    created = ("trainjob llama-s1 cannot start: a dispatch TrainJob is created suspended and started by "
               "`dispatch release` (or Kueue through dispatch's admission check)")
    assert d.guard("CREATE", None, new, PODS, record(3)) == created
    assert d.guard("CREATE", None, new, CLEAR, record(3)) == created
    assert d.guard("CREATE", None, new, None, None) == created


def test_suspended_create_is_allowed() -> None:
    assert d.guard("CREATE", None, tj(), None, None) is None


# --------------------------------------------------------------------------- reuse of A


def test_bare_unsuspend_without_a_new_a_is_denied() -> None:
    """After an execution of A=3 ran (started=3), `kubectl patch suspend=false` would run A=3 again."""
    old = tj(a=3, started=3, token="t", generation=8)
    msg = d.guard("UPDATE", old, tj(suspend=False, a=3, started=3, token="t", generation=9), CLEAR, record(3))
    assert msg == ("trainjob llama-s1 cannot start: A=3 has already started (annotation "
                   "dispatch.phpboyscout.uk/started=3); `dispatch release` issues a new A")


def test_bare_unsuspend_of_an_armed_object_must_mark_started() -> None:
    old, _ = plain_start()
    msg = d.guard("UPDATE", old, tj(suspend=False, a=3, started=2, token="t", generation=7), CLEAR, record(3))
    assert msg is not None and "must mark dispatch.phpboyscout.uk/started=3 in the same write" in msg


def test_a_not_issued_by_the_record_is_denied() -> None:
    old, new = plain_start()
    msg = d.guard("UPDATE", old, new, CLEAR, record(4))
    assert msg is not None and "A=3 was not issued to it" in msg and "issued A=4" in msg


def test_record_bound_to_another_uid_is_denied() -> None:
    old, new = plain_start()
    msg = d.guard("UPDATE", old, new, CLEAR, record(3, uid="other-uid"))
    assert msg is not None and "A=3 was not issued to it" in msg


def test_a_released_record_is_denied_naming_the_unfinished_close() -> None:
    """``close`` released the claim but its reply was lost, so the TrainJob stayed (found by the every-writer
    machine): Kueue's start on the check's old Ready is refused, saying why."""
    old, new = kueue_start()
    released = RecordView.from_obj({**new_record("llama", "s1", "", admission=3),
                                    "metadata": {**new_record("llama", "s1", "", admission=3)["metadata"],
                                                 "resourceVersion": "5"}})
    msg = d.guard("UPDATE", old, new, CLEAR, released, workload())
    assert msg is not None and "names no TrainJob: its submission was released" in msg


def test_record_held_by_another_trainjob_is_denied() -> None:
    old, new = plain_start()
    msg = d.guard("UPDATE", old, new, CLEAR, record(3, holder="llama-s1b"))
    assert msg is not None and "is held by llama-s1b" in msg


def test_missing_record_is_denied() -> None:
    old, new = plain_start()
    msg = d.guard("UPDATE", old, new, CLEAR, None)
    assert msg is not None and "is missing, so no A was issued to it" in msg


def test_pods_carrying_another_a_are_denied() -> None:
    old = tj(a=3, patch_a=3, started=2, token="t", generation=6)
    new = tj(suspend=False, a=4, patch_a=3, started=4, token="t2", generation=7)
    msg = d.guard("UPDATE", old, new, CLEAR, record(4))
    assert msg == "trainjob llama-s1 cannot start: its pods would carry A=3 but the TrainJob carries A=4"


def test_object_without_a_runtime_patch_entry_cannot_start() -> None:
    old = tj(entry=False, a=3, started=2)
    msg = d.guard("UPDATE", old, tj(entry=False, suspend=False, a=3, started=3), CLEAR, record(3))
    assert msg is not None and "no dispatch runtime patch entry" in msg


# --------------------------------------------------------------------------- Kueue mode


def test_kueue_managed_object_not_admitted_is_denied() -> None:
    old, new = kueue_start()
    msg = d.guard("UPDATE", old, new, CLEAR, record(3), workload(admitted=False))
    assert msg == ("trainjob llama-s1 cannot start: Kueue manages it and has not admitted workload "
                   "trainjob-llama-s1-abc")


@pytest.mark.parametrize("token", ["", "other-wl/5"])
def test_kueue_admission_that_skipped_every_check_is_denied_naming_the_cause(token: str) -> None:
    """Kueue v0.19 admits a Workload given no flavor without asking its ClusterQueue's checks: A was never
    raised for it (found on the k8s-1.37 stack; docs/findings.md, "Two stacks")."""
    old = tj(a=0, started=0, token=token, generation=2)
    new = tj(suspend=False, a=0, started=0, token=token, generation=3)
    msg = d.guard("UPDATE", old, new, CLEAR, record(0), workload(checked=False))
    assert msg == ("trainjob llama-s1 cannot start: Kueue admitted workload trainjob-llama-s1-abc without asking "
                   "any admission check, so dispatch raised no A for it (Kueue v0.19 and later skip the checks of "
                   "a Workload that is given no flavor: add `pods` to the coveredResources of its ClusterQueue)")
    # the same Workload with a check (so Kueue asked it) gets the ordinary denial
    assert "has already started" in (d.guard("UPDATE", old, new, CLEAR, record(0), workload()) or "")


def test_evicted_workload_is_denied() -> None:
    old, new = kueue_start()
    assert "has not admitted" in (d.guard("UPDATE", old, new, CLEAR, record(3), workload(evicted=True)) or "")


def test_kueue_restart_of_a_started_a_is_denied() -> None:
    """A=3 raised on 5 (6), Kueue's pod set write (7), started (8), then suspended (9)."""
    old = tj(a=3, started=0, token=kueue_token(workload(), 5), generation=9)
    new = tj(suspend=False, a=3, started=0, token=kueue_token(workload(), 5), generation=10)
    msg = d.guard("UPDATE", old, new, CLEAR, record(3), workload())
    assert msg is not None and "was not raised for this admission" in msg


@pytest.mark.parametrize("token", ["other-wl/5", "plain-release-token", f"{WL_UID}/x", ""])
def test_kueue_token_not_of_this_workload_is_denied(token: str) -> None:
    old = tj(a=3, token=token, generation=6)
    new = tj(suspend=False, a=3, token=token, generation=7)
    msg = d.guard("UPDATE", old, new, CLEAR, record(3), workload()) or ""
    assert msg.endswith("(its admission token names no raise for this workload)")


def test_kueue_start_with_a_changed_token_is_denied() -> None:
    old, _ = kueue_start()
    new = tj(suspend=False, a=4, token=kueue_token(workload(), 6), generation=7)
    msg = d.guard("UPDATE", old, new, CLEAR, record(4), workload())
    assert msg is not None and "was not raised for this admission" in msg


def test_kueue_start_of_a_started_mark_is_denied() -> None:
    old = tj(a=3, started=3, token=kueue_token(workload(), 5), generation=6)
    new = tj(suspend=False, a=3, started=3, token=kueue_token(workload(), 5), generation=7)
    assert "has already started" in (d.guard("UPDATE", old, new, CLEAR, record(3), workload()) or "")


# --------------------------------------------------------------------------- identity kept


def kept(**changes: Any) -> TrainJobView:
    """The held object with A=2, started=2, token t, and only ``changes`` applied."""
    fields: dict[str, Any] = {"a": 2, "started": 2, "token": "t"}
    fields.update(changes)
    return tj(**fields)


@pytest.mark.parametrize(("new", "expected"), [
    (kept(a=1), "annotation dispatch.phpboyscout.uk/admission only rises (2); this write would lower it to 1"),
    (kept(a=None, patch_a=2),
     "annotation dispatch.phpboyscout.uk/admission only rises (2); this write would remove it"),
    (kept(started=1), "annotation dispatch.phpboyscout.uk/started only rises (2); this write would lower it to 1"),
    (kept(started=None), "annotation dispatch.phpboyscout.uk/started only rises (2); this write would remove it"),
    (kept(labels={LABEL_SUBMISSION: "s1"}),
     "dispatch's identity label dispatch.phpboyscout.uk/job-id=llama is kept; this write would remove it"),
    (kept(labels={**LABELS, LABEL_SUBMISSION: "s9"}),
     "dispatch's identity label dispatch.phpboyscout.uk/submission=s1 is kept; this write would change it to 's9'"),
    (kept(entry=False), "dispatch's runtime patch entry (dispatch.phpboyscout.uk/dispatch) is kept"),
    (kept(patch_a=1), "the A in dispatch's runtime patch entry only rises (2); this write would lower it to 1"),
    (kept(token="forged"), "annotation dispatch.phpboyscout.uk/admission-token changes only with a raise"),
    (kept(token=None), "annotation dispatch.phpboyscout.uk/admission-token changes only with a raise"),
    (kept(extra={ANNOTATION_ADMISSION: "two"}),
     "annotation dispatch.phpboyscout.uk/admission is 'two', not a number"),
])
def test_identity_is_kept(new: TrainJobView, expected: str) -> None:
    msg = d.guard("UPDATE", kept(), new, None, None)
    assert msg is not None and msg.startswith("trainjob llama-s1: ") and expected in msg


def test_raising_a_with_a_new_token_is_allowed() -> None:
    """dispatch's raise: A up, token new, the runtime patch entry's A up; nothing starts."""
    assert d.guard("UPDATE", tj(a=2, token="t"), tj(a=3, token="u"), None, None) is None


def test_hold_and_other_writes_are_allowed() -> None:
    running = tj(suspend=False, a=3, started=3, token="t")
    assert d.guard("UPDATE", running, tj(suspend=True, a=3, started=3, token="t"), None, None) is None
    assert d.guard("UPDATE", running, tj(suspend=False, a=3, started=3, token="t",
                                          extra={"note": "x"}), None, None) is None


def test_trainjob_without_dispatch_labels_is_untouched() -> None:
    old = tj(labels={}, a=None, entry=False)
    new = tj(labels={}, a=None, entry=False, suspend=False)
    assert d.guard("UPDATE", old, new, PODS, None) is None
    assert d.guard("CREATE", None, new, PODS, None) is None


def test_adding_dispatch_labels_and_starting_in_one_write_is_judged() -> None:
    old = tj(labels={}, a=None, entry=False)
    new = tj(suspend=False, a=None, entry=False)
    assert "remaining pods" in (d.guard("UPDATE", old, new, PODS, None) or "")


def test_job_id_label_alone_is_not_an_identity() -> None:
    old = tj(labels={LABEL_JOB_ID: "llama"}, a=None, entry=False)
    new = tj(labels={LABEL_JOB_ID: "llama"}, a=None, entry=False, suspend=False)
    assert d.guard("UPDATE", old, new, PODS, None) is None


def _with_tuner(view: TrainJobView, a: str) -> TrainJobView:
    """``view`` with another manager's entry after dispatch's, setting the admission pod label to ``a``."""
    entry = {"manager": "example.com/tuner", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {LABEL_ADMISSION: a}}}}}}]}}}}
    return TrainJobView.from_obj({"metadata": {
        "name": NAME, "namespace": "ns", "uid": UID, "labels": dict(view.labels),
        "annotations": {ANNOTATION_ADMISSION: str(view.admission)}},
        "spec": {"suspend": view.suspended, "runtimePatches": [*view.patches, entry]}})


def test_the_identity_policy_alone_refuses_what_the_cel_policy_refuses_and_nothing_the_webhook_adds() -> None:
    """``identity_policy`` is the ``dispatch-identity`` CEL policy, which holds without the webhook (issue 25,
    item 5): another manager's entry below the TrainJob's A, a lowered A or ``started``, a changed identity
    label are refused; an entry with the TrainJob's own A, a raise, and what only the webhook judges (a start,
    dispatch's entry lowered) are not its business."""
    old = tj(a=1)
    assert d.identity_policy("UPDATE", old, _with_tuner(old, "0")) is not None
    assert "sets pod label" in (d.identity_policy("UPDATE", old, _with_tuner(old, "0")) or "")
    assert d.identity_policy("UPDATE", old, _with_tuner(old, "1")) is None
    assert d.identity_policy("CREATE", None, _with_tuner(old, "0")) is not None
    assert "only rises" in (d.identity_policy("UPDATE", tj(a=2), tj(a=1)) or "")
    assert "only rises" in (d.identity_policy("UPDATE", tj(a=2, started=2), tj(a=2, started=1)) or "")
    assert "not a number" in (d.identity_policy("UPDATE", tj(a=2), tj(a=2, extra={ANNOTATION_ADMISSION: "x"})) or "")
    assert "identity labels" in (d.identity_policy(
        "UPDATE", tj(), tj(labels={LABEL_JOB_ID: "other", LABEL_SUBMISSION: "s1"})) or "")
    assert d.identity_policy("UPDATE", tj(a=1), tj(a=2)) is None
    assert d.identity_policy("UPDATE", tj(suspend=True), tj(suspend=False)) is None   # a start: the webhook's
    assert d.identity_policy("UPDATE", tj(a=3, patch_a=3), tj(a=3, patch_a=2)) is None  # the webhook's rule
    assert d.identity_policy("UPDATE", tj(labels={}), tj(labels={})) is None          # not a dispatch object


# --------------------------------------------------------------------------- a MultiKueue copy in its worker

COPY_LABELS = {**LABELS, "kueue.x-k8s.io/multikueue-origin": "multikueue",
               "kueue.x-k8s.io/prebuilt-workload-name": "trainjob-llama-s1-abc"}


def copy_start(a: int = 3, patch_a: int | None = None) -> tuple[TrainJobView, TrainJobView]:
    """The worker's Kueue unsuspends the copy MultiKueue made of the manager's TrainJob (A raised there; no
    record, token or started mark means anything in this worker)."""
    return (tj(a=a, patch_a=patch_a, labels=COPY_LABELS, token="manager-wl/5", generation=2),
            tj(suspend=False, a=a, patch_a=patch_a, labels=COPY_LABELS, token="manager-wl/5", generation=3))


def copy_workload(**kw: Any) -> WorkloadView:
    """The Workload MultiKueue made in the worker for the copy (it carries MultiKueue's origin label too)."""
    return workload(labels={"kueue.x-k8s.io/multikueue-origin": "multikueue"}, **kw)


def test_a_copy_started_by_its_workers_kueue_is_allowed_without_a_record_there() -> None:
    old, new = copy_start()
    assert d.multikueue_copy(new, worker=True) and not d.multikueue_copy(tj(), worker=True)
    assert d.guard("UPDATE", old, new, CLEAR, None, copy_workload(checked=False), worker=True) is None


def test_a_copy_keeps_the_local_rule() -> None:
    old, new = copy_start()
    assert d.guard("UPDATE", old, new, PODS, None, copy_workload(), worker=True) == (
        "trainjob llama-s1 cannot start: remaining pods: llama-s1-node-0-0-x on node-1 (Ready)")


def test_multikueue_labels_make_no_copy_where_dispatch_is_not_a_worker() -> None:
    """Issue 35 item 3: the labels are ordinary labels; only a worker's guard judges a TrainJob as a copy, so
    elsewhere an object carrying them is judged as any other (here: no record issued this A, and Kueue's
    restart of a suspended object that ran is refused by the generation rule)."""
    old, new = copy_start()
    assert not d.multikueue_copy(new, worker=False)
    msg = d.guard("UPDATE", old, new, CLEAR, None, copy_workload())
    assert msg is not None and "is missing, so no A was issued to it" in msg, msg
    token = kueue_token(workload(), 5)       # raised on generation 5; a start and a stop since (9): the
    kold = tj(a=3, started=0, token=token, generation=9, labels=COPY_LABELS)   # restart Kueue makes
    knew = tj(suspend=False, a=3, started=0, token=token, generation=10, labels=COPY_LABELS)
    msg = d.guard("UPDATE", kold, knew, CLEAR, record(3), copy_workload())
    assert msg is not None and "was not raised for this admission" in msg, msg


def test_a_copy_runs_its_a_once() -> None:
    """Issue 35 item 3: a copy suspended after it ran (a writer in the worker, or its Kueue) is not started
    again with the same A by the worker's Kueue; nor is an A at or below its started mark."""
    old = tj(a=3, labels=COPY_LABELS, token="manager-wl/5", generation=4)
    new = tj(suspend=False, a=3, labels=COPY_LABELS, token="manager-wl/5", generation=5)
    msg = d.guard("UPDATE", old, new, CLEAR, None, copy_workload(), worker=True)
    assert msg is not None and "this MultiKueue copy has started before (generation 4" in msg, msg
    old = tj(a=3, started=3, labels=COPY_LABELS, token="manager-wl/5", generation=2)
    new = tj(suspend=False, a=3, started=3, labels=COPY_LABELS, token="manager-wl/5", generation=3)
    msg = d.guard("UPDATE", old, new, CLEAR, None, copy_workload(), worker=True)
    assert msg is not None and "A=3 has already started" in msg, msg


def test_a_copy_starts_only_through_the_workload_multikueue_made() -> None:
    old, new = copy_start()
    msg = d.guard("UPDATE", old, new, CLEAR, None, workload(), worker=True)
    assert msg is not None and "was not made by MultiKueue" in msg, msg


def test_the_copy_marks_are_kept_and_a_copy_is_created_only_by_multikueue() -> None:
    """Issue 35 item 3: the marks of a copy are neither added to, changed on nor removed from a dispatch
    TrainJob (guard and CEL policy); a dispatch TrainJob with the origin label is created only by a holder of
    the copy permission (the CEL policy, through the authorizer)."""
    plain, marked = tj(), tj(labels=COPY_LABELS)
    other = tj(labels={**COPY_LABELS, "kueue.x-k8s.io/prebuilt-workload-name": "another"})
    for before, after in ((plain, marked), (marked, plain), (marked, other)):
        for msg in (d.guard("UPDATE", before, after, None, None), d.identity_policy("UPDATE", before, after)):
            assert msg is not None and "MultiKueue marks" in msg, msg
    assert d.identity_policy("UPDATE", marked, tj(labels=COPY_LABELS, a=3)) is None
    assert d.copy_create_problem(marked, allowed=False) == f"trainjob {NAME}: {d.COPY_CREATE_DENIED}"
    assert d.copy_create_problem(marked, allowed=True) is None
    assert d.copy_create_problem(plain, allowed=False) is None


@pytest.mark.parametrize(("case", "expected"), [
    ("not admitted", "this worker's Kueue has not admitted the copy's workload trainjob-llama-s1-abc"),
    ("evicted", "this worker's Kueue has not admitted the copy's workload trainjob-llama-s1-abc"),
    ("no workload", "this worker's Kueue has not admitted the copy's workload"),
    ("no A", "this MultiKueue copy carries no A"),
    ("pods carry another A", "its pods would carry A=2 but the TrainJob carries A=3"),
    ("created running", "a MultiKueue copy is created suspended"),
])
def test_a_copy_that_is_not_armed_is_denied(case: str, expected: str) -> None:
    old, new = copy_start(a=0) if case == "no A" else copy_start(patch_a=2) if case == "pods carry another A" \
        else copy_start()
    wl = {"not admitted": copy_workload(admitted=False), "evicted": copy_workload(evicted=True),
          "no workload": None}.get(case, copy_workload())
    operation, before = ("CREATE", None) if case == "created running" else ("UPDATE", old)
    msg = d.guard(operation, before, new, CLEAR, None, wl, worker=True)
    assert msg is not None and expected in msg, msg


def test_close_lifts_its_own_record_creates_one_for_an_object_that_ran_before_records_and_leaves_anothers() -> None:
    """``close``'s record policy, pure (issue 36: it was the verb's own branches)."""
    assert d.close_record(tj(a=2), record(3), []) == "lift"
    assert d.close_record(tj(a=2), record(3, holder="other"), []) is None       # another object holds it
    assert d.close_record(tj(a=2), None, []) == "create"                         # opened before records, ran
    assert d.close_record(tj(a=0, entry=False), None, []) is None                # nothing ran: nothing to keep
    assert d.close_record(tj(a=2, labels={}), record(3), []) is None             # not dispatch's
