"""The guard's decision on a pod of a dispatch object being created (``_decision.pod_start_problem``), branch by
branch: which other pods of the submission stop it, which do not, and what the denial says."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch._names import (
    COMPLETION_INDEX_LABEL,
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    OUT_OF_SERVICE_TAINT,
    REPLICATED_JOB_LABEL,
)
from dispatch._views import POD_FINALIZER, NodeView, PodView

READY = NodeView("n1", ready="True")


def pod_obj(name: str, *, a: int | None = 1, rank: tuple[str, str, str] | None = ("node", "0", "0"),
            submission: str = "s1", phase: str = "Running", node: str | None = "n1", deleting: bool = False,
            index_as: str = "label", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    labels = {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: submission, JOBSET_NAME_LABEL: f"llama-{submission}"}
    annotations: dict[str, str] = {}
    if a is not None:
        labels[LABEL_ADMISSION] = str(a)
    if rank is not None:
        labels[REPLICATED_JOB_LABEL], labels[JOB_INDEX_LABEL] = rank[0], rank[1]
        (labels if index_as == "label" else annotations)[COMPLETION_INDEX_LABEL] = rank[2]
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": labels, "annotations": annotations,
                            "finalizers": [POD_FINALIZER], "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    state = {"terminated": {"exitCode": 0}} if phase in ("Succeeded", "Failed") else {"running": {}}
    obj: dict[str, Any] = {"metadata": meta,
                           "spec": {"containers": [{"name": "node"}], "restartPolicy": "OnFailure",
                                    **({"nodeName": node} if node else {})},
                           "status": {"phase": phase, "containerStatuses": [{"name": "node", "state": state}]}}
    for key, value in (extra or {}).items():
        obj[key].update(value)
    return obj


def pod(name: str, **kw: Any) -> PodView:
    return PodView.from_obj(pod_obj(name, **kw))


NEW = pod("llama-s1-node-0-0-new", phase="Pending", node=None)


def problem(*others: PodView, new: PodView = NEW, nodes: dict[str, NodeView] | None = None) -> str | None:
    return d.pod_start_problem(new, others, {"n1": READY} if nodes is None else nodes)


def test_the_rank_is_read_from_jobsets_and_the_job_controllers_labels() -> None:
    assert NEW.rank == ("node", "0", "0")
    assert pod("p", index_as="annotation").rank == ("node", "0", "0")  # the index also rides an annotation
    assert pod("p", rank=None).rank is None


def test_a_pod_without_dispatchs_identity_is_not_judged() -> None:
    new = PodView.from_obj({"metadata": {"name": "other", "labels": {}}})
    assert d.pod_start_problem(new, [pod("old", deleting=True)], {"n1": READY}) is None


def test_the_first_pod_of_a_submission_starts() -> None:
    assert problem() is None


def test_other_ranks_of_the_same_execution_run_beside_it() -> None:
    assert problem(pod("w1", rank=("node", "0", "1")), pod("w2", rank=("node", "1", "0")),
                   pod("l0", rank=("launcher", "0", "0"))) is None


def test_the_same_rank_still_terminating_refuses_it_naming_the_pod_its_node_and_the_way_out() -> None:
    got = problem(pod("llama-s1-node-0-0-old", deleting=True))
    assert got == ("pod llama-s1-node-0-0-new (A=1, replicatedJob node, job 0, index 0) cannot start while a pod "
                   "of the same rank of the same execution may still run: remaining pods: llama-s1-node-0-0-old "
                   "on n1 (Ready=True); its controller creates it again once that pod's end is proven")


def test_a_pod_of_another_execution_refuses_it_whatever_its_rank() -> None:
    got = problem(pod("old", a=2, rank=("node", "0", "3")))
    assert got is not None and "a pod of another execution may still run: remaining pods: old on n1" in got
    got = problem(pod("old", a=None))  # an A that cannot be read is not this execution's
    assert got is not None and "another execution" in got


def test_both_kinds_at_once_are_named_together() -> None:
    got = problem(pod("a", a=2), pod("b", deleting=True))
    assert got is not None
    assert "a pod of another execution or the same rank may still run: remaining pods: a on n1 (Ready=True), b on " \
           "n1 (Ready=True)" in got


def test_a_rank_that_cannot_be_read_counts_as_the_same() -> None:
    assert problem(pod("old", rank=None)) is not None
    got = problem(pod("old", rank=("node", "0", "1")), new=pod("new", rank=None, node=None, phase="Pending"))
    assert got is not None and "(A=1, rank unknown)" in got


@pytest.mark.parametrize(("other", "nodes"), [
    (pod("old", a=2, phase="Succeeded"), None),                                       # its kubelet confirmed the end
    (pod("old", phase="Failed", deleting=True), None),
    (pod("old", deleting=True), {"n1": NodeView("n1", exists=False, ready="Unknown")}),  # deleted, last silent
    (pod("old", deleting=True), {"n1": NodeView("n1", ready="Unknown", out_of_service=True)}),
    (pod("old", node=None, phase="Pending", deleting=True), None),                     # never scheduled, deleting
], ids=["succeeded", "failed", "node-deleted", "out-of-service", "never-scheduled"])
def test_a_pod_whose_end_is_proven_does_not_stop_it(other: PodView, nodes: dict[str, NodeView] | None) -> None:
    assert problem(other, nodes=nodes) is None


@pytest.mark.parametrize(("other", "nodes", "state"), [
    (pod("old", deleting=True), {}, "not readable"),                                  # its Node was not read
    (pod("old", deleting=True), {"n1": NodeView.unreadable("n1")}, "not readable"),
    (pod("old", deleting=True), {"n1": NodeView("n1", ready="Unknown")}, "Ready=Unknown"),
    (pod("old", node=None, phase="Pending"), None, "no node"),                          # may still be bound
    # issue 40: a deletion alone proves nothing (a live kubelet runs on), nor a Node registered again later
    (pod("old", deleting=True), {"n1": NodeView.gone("n1")}, "n1 was deleted, which proves nothing by itself"),
    (pod("old", deleting=True), {"n1": NodeView("n1", exists=False, ready="True")}, "(last seen Ready=True)"),
    (pod("old", deleting=True), {"n1": NodeView("n1", ready="Unknown", out_of_service=True, created=2e9)},
     "n1 was registered again after the pod was created"),
], ids=["node-missing", "node-unreadable", "node-unknown", "pending", "node-deleted", "node-deleted-while-ready",
        "node-registered-again"])
def test_a_pod_whose_end_is_unproven_stops_it(other: PodView, nodes: dict[str, NodeView] | None,
                                              state: str) -> None:
    got = problem(other, nodes=nodes)
    assert got is not None and state in got


def test_the_rules_why_and_stuck_sentences_come_with_it() -> None:
    marked = pod("old", phase="Failed", extra={"status": {
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
        "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": 137}}}]}})
    got = problem(marked, nodes={"n1": NodeView("n1", ready="Unknown")})
    assert got is not None and "pod old: marked Failed by PodGC, not its kubelet" in got
    held = pod("old", deleting=True, extra={"metadata": {"deletionGracePeriodSeconds": 0}})
    got = problem(held, nodes={"n1": NodeView("n1", ready="Unknown")})
    assert got is not None and "pod old was deleted for good, but its end is unproven" in got


def test_pods_of_other_submissions_and_the_pod_itself_do_not_count() -> None:
    assert problem(pod("other", submission="s2", a=7, deleting=True)) is None
    assert problem(pod("llama-s1-node-0-0-new", a=2)) is None  # its own uid (a retried create that went through)


def test_a_new_pod_without_a_name_yet_is_named_by_its_submission() -> None:
    unnamed = PodView.from_obj({**pod_obj("x", node=None, phase="Pending"),
                                "metadata": {**pod_obj("x")["metadata"], "name": "", "uid": ""}})
    got = problem(pod("old", deleting=True), new=unnamed)
    assert got is not None and got.startswith("pod of llama/s1 (A=1, ")


def test_an_out_of_service_taint_on_a_ready_node_proves_nothing() -> None:
    node = NodeView.from_obj({"metadata": {"name": "n1"}, "spec": {"taints": [{"key": OUT_OF_SERVICE_TAINT}]},
                              "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    got = problem(pod("old", deleting=True), nodes={"n1": node})
    assert got is not None and "tainted out-of-service but its kubelet still reports Ready=True" in got


# ---------------------------------------------------------------- status of a running object (waiting_ranks_text)


def running_tj(dispatch: bool = True) -> Any:
    from dispatch._trainer import TrainJobView
    labels = {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"} if dispatch else {}
    return TrainJobView.from_obj({"metadata": {"name": "llama-s1", "labels": labels,
                                               "annotations": {"dispatch.phpboyscout.uk/admission": "1"}},
                                  "spec": {"suspend": False, "runtimeRef": {"name": "torch-distributed"}}})


def waits(*pods: PodView, dispatch: bool = True, nodes: dict[str, NodeView] | None = None) -> str | None:
    return d.waiting_ranks_text(running_tj(dispatch), pods, {"n1": READY} if nodes is None else nodes)


def test_a_rank_whose_old_pod_is_still_ending_and_has_no_new_pod_is_named_in_status() -> None:
    text = waits(pod("old", deleting=True), pod("other", rank=("node", "0", "1")))
    assert text == ("a rank of execution 1 waits to start again while the pod before may still run (remaining pods: "
                    "old on n1 (Ready=True)): the guard refuses a rank's new pod until that pod's end is proven")
    two = waits(pod("a", deleting=True), pod("b", deleting=True, rank=("node", "0", "1")))
    assert two is not None and two.startswith("2 ranks of execution 1 wait to start again") and "a on n1" in two


@pytest.mark.parametrize("pods", [
    (),                                                                    # nothing ending
    (pod("running"),),                                                     # the rank runs
    (pod("old", deleting=True), pod("new")),                               # its new pod already runs
    (pod("old", deleting=True, phase="Succeeded"),),                       # its end is proven by its kubelet
])
def test_no_rank_is_claimed_to_wait_where_none_does(pods: tuple[PodView, ...]) -> None:
    assert waits(*pods) is None


def test_an_object_that_is_not_dispatchs_gets_no_such_text() -> None:
    assert waits(pod("old", deleting=True), dispatch=False) is None


def test_an_ending_pod_on_an_out_of_service_node_is_proven_and_not_claimed_to_block() -> None:
    tainted = NodeView("n1", ready="Unknown", out_of_service=True)
    assert waits(pod("old", deleting=True), nodes={"n1": tainted}) is None


def test_ceased_of_a_running_object_names_the_waiting_rank_as_status_does() -> None:
    """`ceased` answers a caller (an operator's script, the every-writer machine) that acts on its reason:
    a running object whose rank waits on an ending pod (its Job re-created, its namespace being deleted)
    says why, not only that it runs."""
    ending, other = pod("old", deleting=True), pod("other", rank=("node", "0", "1"))
    got = d.cessation(trainjob=running_tj(), name="llama-s1", job_id="llama", submission="s1",
                      pods=[ending, other], nodes={"n1": READY})
    assert not got.ceased
    assert got.reason == "llama-s1 is admitted and running; " + str(waits(ending, other))
    plain = d.cessation(trainjob=running_tj(), name="llama-s1", job_id="llama", submission="s1",
                        pods=[other], nodes={"n1": READY})
    assert plain.reason == "llama-s1 is admitted and running"


# --------------------------------------------------------------------------- a NonIndexed Job (issue 35 item 6)


def test_a_pod_of_a_nonindexed_job_refused_says_why() -> None:
    """Its pods carry no completion index: the guard cannot tell a second pod of the Job from a replacement of one
    that may still run, so it is refused; the denial names the Job's replicatedJob and what to set."""
    unindexed = {"metadata": {"labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1", LABEL_ADMISSION: "1",
                                         JOBSET_NAME_LABEL: "llama-s1", REPLICATED_JOB_LABEL: "node",
                                         JOB_INDEX_LABEL: "0"}}}
    first = pod("llama-s1-node-0-x-1", rank=None, extra=unindexed)
    second = pod("llama-s1-node-0-x-2", rank=None, phase="Pending", node=None, extra=unindexed)
    assert second.rank is None and second.unindexed == "replicatedJob node, job 0"
    msg = problem(first, new=second)
    assert msg is not None and msg.startswith(
        "pod llama-s1-node-0-x-2 (A=1, replicatedJob node, job 0) cannot start while a pod of the same Job may still "
        "run (remaining pods: llama-s1-node-0-x-1 on n1 (Ready=True)): its Job is NonIndexed"), msg
    assert msg.endswith("set completionMode: Indexed (JobSet's default) on the Job template of replicatedJob node "
                        "in the runtime"), msg


def test_a_labelled_pod_without_dispatch_s_finalizer_is_refused_whatever_else_runs() -> None:
    """Issue 35, item 10: the guard accepted it; without the finalizer the pod can leave the API (a force
    delete, PodGC) while its process runs, unseen by the rule."""
    bare = pod("llama-s1-node-0-0-bare", phase="Pending", node=None, extra={"metadata": {"finalizers": []}})
    said = problem(new=bare)
    assert said == ("pod llama-s1-node-0-0-bare carries dispatch's label dispatch.phpboyscout.uk/job-id but not "
                    f"dispatch's finalizer {POD_FINALIZER}, which keeps a pod visible until its end is proven; "
                    "dispatch's runtime patch entry adds it to every pod, so whatever built this pod's template "
                    "removed it")
    # ... even with no submission label (the guard's objectSelector asks for the job-id alone)
    assert problem(new=dataclasses.replace(bare, submission="")) is not None
    assert problem(new=pod("llama-s1-node-0-0-ok", phase="Pending", node=None)) is None


def test_a_pod_created_with_dispatch_s_mark_record_is_refused() -> None:
    forged = pod("llama-s1-node-0-0-f", phase="Pending", node=None, extra={"metadata": {"annotations": {
        "dispatch.phpboyscout.uk/mark-seen": "1/" + "0" * 32}}})
    said = problem(new=forged)
    assert said is not None and "is created with dispatch's record dispatch.phpboyscout.uk/mark-seen" in said


@pytest.mark.parametrize("kind", ["debug", "sidecar"])
def test_an_ended_pod_with_a_debug_or_sidecar_container_running_blocks_its_rank(kind: str) -> None:
    """Issue 35, item 9: the guard read a pod whose own container ended as ended, beside a `kubectl debug`
    (ephemeral) or native sidecar container still reported running."""
    if kind == "debug":
        extra = {"spec": {"ephemeralContainers": [{"name": "debugger"}]},
                 "status": {"ephemeralContainerStatuses": [{"name": "debugger", "state": {"running": {}}}]}}
    else:
        extra = {"spec": {"initContainers": [{"name": "proxy", "restartPolicy": "Always"}]},
                 "status": {"initContainerStatuses": [{"name": "proxy", "state": {"running": {}}}]}}
    old = pod("llama-s1-node-0-0-old", phase="Succeeded", deleting=True, extra=extra)
    said = problem(old)
    assert said is not None and "llama-s1-node-0-0-old" in said
    assert problem(pod("llama-s1-node-0-0-old", phase="Succeeded", deleting=True)) is None


def test_a_static_pods_mirror_is_admitted_whatever_else_runs() -> None:
    """Issue 34, question 2c: a real kubelet runs a static pod from its file whatever the API says, and a webhook
    can refuse only its mirror, which would hide that process from the rule instead of stopping it. So the guard
    admits a mirror (even without dispatch's finalizer, even beside another execution's pod): the rule then
    counts it among the object's pods."""
    mirror = {"metadata": {"annotations": {"kubernetes.io/config.mirror": "5d2c1b0a"}}}
    new = pod("static-node-real", a=0, rank=None, phase="Pending", extra=mirror)
    assert new.mirror
    running_other = pod("llama-s1-node-0-0-a1")
    assert problem(running_other, new=new) is None
    bare = pod("static-node-real", a=0, rank=None, phase="Pending",
               extra={"metadata": {**mirror["metadata"], "finalizers": []}})
    assert d.pod_create_problem(bare) is None and problem(running_other, new=bare) is None
    # the same pod without the annotation is refused on both counts, as before
    assert problem(running_other, new=pod("static-node-real", a=0, rank=None, phase="Pending")) is not None
    assert d.pod_create_problem(dataclasses.replace(bare, mirror=False)) is not None
