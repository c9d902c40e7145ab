"""The pure decision, exhaustively: every pod phase × deletion × node state × selection, and every string."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER
from dispatch import _decision as d
from dispatch._identity import ADMISSION_LIMIT
from dispatch._records import Cause, State
from dispatch._trainer import TrainJobView

NAME = "llama-s1"
PHASES = ["Pending", "Running", "Succeeded", "Failed", "Unknown"]
NODE_STATES: dict[str, d.NodeView] = {
    "ready": d.NodeView("n", ready="True"),
    "notready": d.NodeView("n", ready="False"),
    "unknown": d.NodeView("n", ready="Unknown"),
    "nocondition": d.NodeView("n", ready=None),
    "unknown+oos": d.NodeView("n", ready="Unknown", out_of_service=True),
    "ready+oos": d.NodeView("n", ready="True", out_of_service=True),
    "gone": d.NodeView.gone("n"),
    "unreadable": d.NodeView.unreadable("n"),
    # a deleted Node as the controller last saw it (a plain read knows only "gone", above)
    "deleted-unknown": d.NodeView("n", exists=False, ready="Unknown"),
    "deleted-ready": d.NodeView("n", exists=False, ready="True"),
    "deleted-notready": d.NodeView("n", exists=False, ready="False"),
    "deleted-unknown-later": d.NodeView("n", exists=False, ready="Unknown", created=2e9),
    # a Node registered again under the name after the pod was created (another object, maybe another machine)
    "later-unknown+oos": d.NodeView("n", ready="Unknown", out_of_service=True, created=2e9),
}
PROVING_NODES = {"unknown+oos": "out-of-service", "deleted-unknown": "node-deleted"}
"""The node states that prove a pod's end, stated apart from the code: the out-of-service taint on a node
whose kubelet no longer reports Ready=True; a deletion of a Node last seen Ready=Unknown (its kubelet silent
past the node controller's grace) that the pod was bound to. A deletion alone, of a Node last seen Ready or
not known, or a Node created after the pod, proves nothing (issue 40)."""
SELECTIONS = {
    "dispatch": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"},
    "jobset": {"jobset.sigs.k8s.io/jobset-name": NAME},
    "both": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1",
             "jobset.sigs.k8s.io/jobset-name": NAME},
    "neither": {"jobset.sigs.k8s.io/jobset-name": "other"},
    "wrong-submission": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s2"},
}


CONTAINERS = ["kubelet", "running", "none", "exit137", "waiting", "sidecar-running", "debug-running"]
"""What the pod's container statuses say: terminated with exit 0 (what its kubelet reports once it stopped
a container that exited cleanly), still running (what PodGC or Kueue leave when they write Failed onto a
pod of an unreachable node), no statuses at all (a pod its kubelet rejected), terminated with exit 137
(killed), ``waiting: PodInitializing`` (a pod that ended before its init containers finished), or its own
container ended (exit 0) beside a native sidecar (restartable init container) or a ``kubectl debug``
(ephemeral) container still reported running (issue 35, item 9)."""
WRITERS = ["kubelet", "PodGC", "KueueFailureRecovery", "PodGC-out-of-service"]
"""Who wrote the pod's phase, as the conditions they add tell: the kubelet adds none of these. PodGC's
out-of-service path adds none either (issue 35, item 10): its Failed sits beside the sandbox its kubelet last
reported ready (``PodReadyToStartContainers=True``), which a kubelet's own terminal phase never does."""
POLICIES = ["OnFailure", "Never", "Always"]
OWN: dict[str, dict[str, Any]] = {
    "none": {},
    "Never": {"restartPolicy": "Never"},
    "OnFailure": {"restartPolicy": "OnFailure"},
    "Always": {"restartPolicy": "Always"},
    "restart-on-137": {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [137]}}]},
    "all-on-nonzero": {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}]},
    "restart-on-3": {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [3]}}]},
    "unknown-operator": {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "GreaterThan", "values": [5]}}]},
}
"""The container's own ``restartPolicy`` and ``restartPolicyRules`` (ContainerRestartRules, 1.35+;
RestartAllContainers, 1.36+), which a kubelet follows whatever the pod's policy (issue 41)."""


def pod(name: str = "p", *, phase: str = "Running", node: str | None = "n", deleting: bool = False,
        labels: dict[str, str] | None = None, containers: str | None = None, writer: str = "kubelet",
        policy: str = "OnFailure", own: str = "none") -> d.PodView:
    return d.PodView.from_obj(pod_obj(name, phase=phase, node=node, deleting=deleting, labels=labels,
                                      containers=containers, writer=writer, policy=policy, own=own))


def pod_obj(name: str = "p", *, phase: str = "Running", node: str | None = "n", deleting: bool = False,
            labels: dict[str, str] | None = None, containers: str | None = None, writer: str = "kubelet",
            policy: str = "OnFailure", own: str = "none") -> dict[str, Any]:
    """A pod, created at 2026-01-01; ``containers`` defaults to what a kubelet reports for ``phase``
    (terminated containers for Succeeded and Failed, running ones otherwise); ``own`` is the container's own
    restart policy and rules (``OWN``)."""
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": labels or SELECTIONS["both"],
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    spec["containers"] = [{"name": "node", "image": "example.invalid/train", **OWN[own]}]
    spec["restartPolicy"] = policy
    status: dict[str, Any] = {"phase": phase}
    if containers is None:
        containers = "kubelet" if phase in ("Succeeded", "Failed") else "running"
    if containers == "kubelet":
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": 0}}}]
    elif containers == "exit137":
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": 137}}}]
    elif containers == "waiting":
        status["containerStatuses"] = [{"name": "node", "state": {"waiting": {"reason": "PodInitializing"}}}]
    elif containers == "running":
        status["containerStatuses"] = [{"name": "node", "state": {"running": {}}}]
    elif containers == "sidecar-running":
        spec["initContainers"] = [{"name": "proxy", "image": "example.invalid/proxy", "restartPolicy": "Always"}]
        status["initContainerStatuses"] = [{"name": "proxy", "state": {"running": {}}}]
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": 0}}}]
    elif containers == "debug-running":
        spec["ephemeralContainers"] = [{"name": "debugger", "image": "example.invalid/busybox"}]
        status["ephemeralContainerStatuses"] = [{"name": "debugger", "state": {"running": {}}}]
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {"exitCode": 0}}}]
    if writer == "PodGC":
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}]
    elif writer == "KueueFailureRecovery":
        status["conditions"] = [{"type": "KueueFailureRecovery", "status": "True",
                                 "reason": "KueueForcefullyDeleted"}]
    elif writer == "PodGC-out-of-service":
        status["conditions"] = [{"type": "PodReadyToStartContainers", "status": "True"}]
    return {"metadata": meta, "spec": spec, "status": status}


def ended(phase: str, containers: str, writer: str, policy: str, own: str = "none") -> bool:
    """The expected proof, stated apart from the code: a terminal phase its kubelet wrote ends the pod
    unless a container is running or lacks a status (the kubelet never starts a container of a pod it ended,
    whatever the container's own policy); one written by someone else ends it only if every container
    terminated and the kubelet never starts it again: no rule of the container matches its exit (a rule
    whose operator is unknown may), then the container's own policy, else the pod's, does not restart it."""
    if phase not in ("Succeeded", "Failed") or containers in ("running", "none", "sidecar-running", "debug-running"):
        return False
    if writer == "kubelet":
        return True
    if containers == "waiting":
        return False
    code = 0 if containers == "kubelet" else 137
    if own == "unknown-operator" or (own == "restart-on-137" and code == 137) or (
            own == "all-on-nonzero" and code != 0):
        return False
    effective = OWN[own].get("restartPolicy", policy)
    return effective == "Never" or (effective == "OnFailure" and code == 0)


@pytest.mark.parametrize(
    ("phase", "deleting", "node_state", "containers", "writer", "policy"),
    list(itertools.product(PHASES, [False, True], NODE_STATES, CONTAINERS, WRITERS, POLICIES)),
)
def test_every_combination(phase: str, deleting: bool, node_state: str, containers: str, writer: str,
                           policy: str) -> None:
    view = NODE_STATES[node_state]
    nodes = {"n": view}
    the_pod = pod(phase=phase, deleting=deleting, containers=containers, writer=writer, policy=policy)
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[the_pod], nodes=nodes)
    # Changed twice. First with the force-delete fix ("any Succeeded/Failed pod does not block" became
    # "every container terminated"); then with what real kubelets write (a pod rejected at admission or
    # ended during its init containers, and OnFailure's restarts, reference pod-endings-2026-12).
    blocks = not ended(phase, containers, writer, policy)
    assert verdict.admissible is (not blocks)
    if blocks:
        assert verdict.remaining[0].terminating is deleting
        assert verdict.detail().startswith("remaining pods: p on n (")
    # the node state never changes the admission verdict: only cessation cares where a pod sits
    cessation = d.cessation(trainjob=None, name=NAME, job_id="llama", submission="s1", pods=[the_pod], nodes=nodes)
    # an out-of-service taint proves the end only on a node whose kubelet no longer reports Ready=True; a
    # deletion only of a Node last seen Ready=Unknown (issue 40: a live kubelet runs on after a deletion)
    proven = node_state in PROVING_NODES
    assert cessation.ceased is (not blocks or proven)
    expected = "kubelet-confirmed" if not blocks else PROVING_NODES.get(node_state, "unproven")
    assert [e.proof for e in cessation.ends] == [expected]
    if blocks and not proven and node_state.startswith(("gone", "deleted", "later")):
        assert "; pod p: " in cessation.reason, cessation.reason  # names why and the way out


@pytest.mark.parametrize(
    ("phase", "containers", "writer", "policy", "own"),
    list(itertools.product(PHASES, CONTAINERS, WRITERS, POLICIES, OWN)),
)
def test_every_ending_under_the_containers_own_restart_policy_and_rules(
        phase: str, containers: str, writer: str, policy: str, own: str) -> None:
    """Issue 41: a Failed someone else wrote over a container whose own policy or rules restart it is no
    proof, on a node that proves nothing by itself (a cut-off kubelet restarts it)."""
    the_pod = pod(phase=phase, containers=containers, writer=writer, policy=policy, own=own)
    nodes = {"n": NODE_STATES["unknown"]}
    proof = ended(phase, containers, writer, policy, own)
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[the_pod], nodes=nodes)
    assert verdict.admissible is proof
    cessation = d.cessation(trainjob=None, name=NAME, job_id="llama", submission="s1", pods=[the_pod], nodes=nodes)
    assert [e.proof for e in cessation.ends] == ["kubelet-confirmed" if proof else "unproven"]
    new = pod_obj("new", phase="Pending", node=None)
    new["metadata"]["finalizers"] = [POD_FINALIZER]  # dispatch's entry puts it on every pod of its objects
    assert d.pod_start_problem(d.PodView.from_obj(new), [the_pod], nodes) is None or not proof
    if not proof and phase in ("Succeeded", "Failed") and writer != "kubelet" and containers not in ("running", "none"):
        running = containers in ("sidecar-running", "debug-running")  # named as running, not as restartable
        said = "is reported running" if running else "its kubelet may still start container node"
        assert said in cessation.reason, cessation.reason


@pytest.mark.parametrize(("phase", "selection"), list(itertools.product(PHASES, SELECTIONS)))
def test_both_selections_and_only_them(phase: str, selection: str) -> None:
    the_pod = pod(phase=phase, labels=SELECTIONS[selection])
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[the_pod], nodes={"n": NODE_STATES["ready"]})
    selected = selection in ("dispatch", "jobset", "both")
    assert verdict.admissible is (not selected or phase in ("Succeeded", "Failed"))


@pytest.mark.parametrize(
    ("view", "text"),
    [
        (d.NodeView("n", ready="True"), "Ready=True"),
        (d.NodeView("n", ready="False"), "Ready=False"),
        (d.NodeView("n", ready="Unknown"), "Ready=Unknown"),
        (d.NodeView("n", ready=None), "Ready=Unknown"),
        (d.NodeView("n", ready="Unknown", out_of_service=True), "Ready=Unknown, out-of-service"),
        (d.NodeView("n", ready="True", out_of_service=True), "Ready=True, out-of-service"),
        (d.NodeView.gone("n"), "gone"),
        (d.NodeView.unreadable("n"), "not readable"),
    ],
)
def test_node_state_strings(view: d.NodeView, text: str) -> None:
    assert view.state_text() == text


def test_node_view_from_object_reads_ready_and_taint() -> None:
    view = d.NodeView.from_obj({
        "metadata": {"name": "node-3"},
        "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]},
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                  {"type": "Ready", "status": "Unknown"}]},
    })
    assert view.state_text() == "Ready=Unknown, out-of-service"
    assert view.proven_down


def test_remaining_detail_lists_every_pod_in_name_order() -> None:
    nodes = {"node-3": d.NodeView("node-3", ready="Unknown"), "node-1": d.NodeView("node-1", ready="True")}
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", nodes=nodes,
                       pods=[pod("train-1", node="node-1", deleting=True), pod("train-0", node="node-3")])
    assert verdict.detail() == (
        "remaining pods: train-0 on node-3 (Ready=Unknown), train-1 on node-1 (Ready=True)"
    )
    assert d.waiting_message(verdict.remaining) == (
        "waiting for pods of the previous execution to go: train-0 on node-3, train-1 on node-1"
    )


def test_a_pod_selected_both_ways_counts_once() -> None:
    p = pod("x")
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[p, p], nodes={"n": NODE_STATES["ready"]})
    assert len(verdict.remaining) == 1


def test_unscheduled_pod_is_described_without_a_node() -> None:
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[pod("x", node=None, phase="Pending")],
                       nodes={})
    assert verdict.detail() == "remaining pods: x on no node (not scheduled)"


def test_node_missing_from_the_snapshot_reads_not_readable() -> None:
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[pod("x", node="n9")], nodes={})
    assert verdict.detail() == "remaining pods: x on n9 (not readable)"


def job(name: str, *, suspend: bool, conds: dict[str, str] | None = None, started: bool = False) -> d.JobView:
    status: dict[str, Any] = {"conditions": [{"type": t, "status": s} for t, s in (conds or {}).items()]}
    if started:
        status["startTime"] = "2026-01-01T00:00:00Z"
    return d.JobView.from_obj({"metadata": {"name": name, "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}},
                               "spec": {"suspend": suspend}, "status": status})


@pytest.mark.parametrize(
    ("j", "blocker"),
    [
        (job("j", suspend=False), "job j is not suspended yet"),
        (job("j", suspend=True, started=True), "job j has not confirmed its suspension yet"),
        (job("j", suspend=True, conds={"Suspended": "False"}, started=True),
         "job j has not confirmed its suspension yet"),
        (job("j", suspend=True, conds={"Suspended": "True"}, started=True), None),
        # never started, suspend set, no Suspended condition: a Job re-suspended before its controller synced
        # looks exactly so, and that controller may still create pods from its cache (issue 11, finding 2)
        (job("j", suspend=True), "job j has not confirmed its suspension yet"),
        (job("j", suspend=False, conds={"Complete": "True"}), None),
        (job("j", suspend=False, conds={"Failed": "True"}), None),
    ],
)
def test_child_jobs_block_until_their_suspension_took_effect(j: d.JobView, blocker: str | None) -> None:
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[], nodes={}, jobs=[j])
    assert verdict.blockers == ((blocker,) if blocker else ())


@pytest.mark.parametrize(
    ("spec", "conds", "blocks"),
    [
        ({"suspend": False}, {}, True),
        ({"suspend": True}, {}, False),
        ({}, {}, True),
        ({"suspend": False}, {"Completed": "True"}, False),
        ({"suspend": False}, {"Failed": "True"}, False),
    ],
)
def test_jobset_blocks_until_suspended(spec: dict[str, Any], conds: dict[str, str], blocks: bool) -> None:
    js = d.JobSetView.from_obj({"metadata": {"name": NAME}, "spec": spec,
                                "status": {"conditions": [{"type": t, "status": s} for t, s in conds.items()]}})
    verdict = d.decide(name=NAME, job_id="llama", submission="s1", pods=[], nodes={}, jobset=js)
    assert (verdict.blockers == (f"jobset {NAME} is not suspended yet",)) is blocks


def trainjob(*, suspend: bool = True, admission: str | None = "1", queue: str | None = None,
             conds: dict[str, str] | None = None, deleting: bool = False) -> TrainJobView:
    labels = {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    meta: dict[str, Any] = {"name": NAME, "labels": labels, "annotations": {}}
    if admission is not None:
        meta["annotations"][ANNOTATION_ADMISSION] = admission
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": [{"type": t, "status": s} for t, s in (conds or {}).items()]}
    return TrainJobView.from_obj({"metadata": meta, "spec": {"suspend": suspend}, "status": status})


@pytest.mark.parametrize(
    ("tj", "state"),
    [
        (trainjob(), State.HELD),
        (trainjob(queue="lq"), State.QUEUED),
        (trainjob(suspend=False), State.RUNNING),
        (trainjob(suspend=False, conds={"Complete": "True"}), State.SUCCEEDED),
        (trainjob(suspend=False, conds={"Failed": "True"}), State.FAILED),
        (trainjob(deleting=True), State.CLOSING),
    ],
)
def test_state_of(tj: TrainJobView, state: State) -> None:
    assert tj.state is state


def test_next_admission_is_above_everything_seen() -> None:
    tj = trainjob(admission="3")
    assert d.next_admission(tj, []).admission == 4
    high = pod(labels={**SELECTIONS["both"], LABEL_ADMISSION: "7"})
    assert d.next_admission(tj, [high]).admission == 8
    garbage = trainjob(admission="garbage")
    assert d.next_admission(garbage, []).admission == 1
    assert garbage.problems == ("annotation dispatch.phpboyscout.uk/admission is 'garbage', not a number",)
    assert d.next_admission(trainjob(admission=None), []).admission == 1


def test_no_new_a_above_the_highest_a_dispatch_issues_and_the_refusal_names_admin_forget() -> None:
    """A floor or record raised to ``ADMISSION_LIMIT`` by hand: the next admission would need a number the CRDs
    refuse to store, so it is refused naming the way out; an A already issued to this object is still taken."""
    top = str(ADMISSION_LIMIT)
    assert d.plan_problem(trainjob(admission=top), d.Plan(ADMISSION_LIMIT, True, True)) is None
    said = d.plan_problem(trainjob(admission=top), d.next_admission(trainjob(admission=top), []))
    assert said == (f"llama/s1 has been issued A={top}, the highest A dispatch issues: no new execution of it "
                    f"can be numbered; `dispatch admin forget llama s1 --yes` (an admin's decision, once the object "
                    "is closed, no process of it can run and nothing fences on its old numbers) makes it count from "
                    "1 again, or open a new submission")
    assert d.plan_problem(trainjob(admission=top), d.Plan(ADMISSION_LIMIT, False, True)) is None  # issued: taken


@pytest.mark.parametrize(("operation", "allowed", "said"), [
    ("CREATE", True, None),
    ("UPDATE", True, None),
    ("CREATE", False, "a floor of namespace b is written only by whoever may create submissionrecords in b"),
    ("UPDATE", False, "a floor of namespace b is written only by whoever may patch submissionrecords in b"),
])
def test_a_floor_write_needs_the_record_permission_in_the_namespace_it_names(
    operation: str, allowed: bool, said: str | None
) -> None:
    assert d.floor_write_problem(operation, "b", allowed=allowed) == said


def test_explain_strings() -> None:
    blocked = d.Verdict((d.remaining([d.PodView("train-0", "u", "node-3", "Running", True, 1)],
                                     {"node-3": d.NodeView("node-3", ready="Unknown")})), ())
    clear = d.Verdict((), ())
    assert d.explain(trainjob(), blocked) == Cause(
        "PodsRemain", "remaining pods: train-0 on node-3 (Ready=Unknown)")
    assert d.explain(trainjob(), clear) == Cause("Held", "hold in force; release admits it")
    assert d.explain(trainjob(suspend=False), None) == Cause("Admitted", "execution 1 admitted")
    check = d.CheckEntry("dispatch", "Pending",
                         "waiting for pods of the previous execution to go: train-0 on node-3", "")
    assert d.explain(trainjob(queue="lq"), blocked, check) == Cause(
        "AdmissionCheckPending",
        "admission check dispatch Pending: waiting for pods of the previous execution to go: train-0 on node-3; "
        "remaining pods: train-0 on node-3 (Ready=Unknown)",
    )
    assert d.explain(trainjob(queue="lq"), clear).detail == "waiting for Kueue to admit it from queue lq"
    failed = d.explain(trainjob(suspend=False, conds={"Failed": "True"}), blocked)
    assert failed == Cause("Failed", "remaining pods: train-0 on node-3 (Ready=Unknown)")


def test_explain_a_kueue_managed_object_without_a_queue_label_is_not_held() -> None:
    """Kueue with manageJobsWithoutQueueName owns a TrainJob that has no queue-name label: after a release
    its Workload is active and Kueue starts it, so "hold in force" would be false (the every-writer testbed
    scenario showed it)."""
    clear = d.Verdict((), ())
    said = "Kueue manages it without a queue-name label: its Workload is active, and Kueue, not `release`, starts it"
    assert d.explain(trainjob(), clear, note="waiting for quota: no LocalQueue") == Cause(
        "Queued", f"waiting for quota: no LocalQueue; {said}")
    ready = d.CheckEntry("dispatch", "Ready", "A=2", "")
    assert d.explain(trainjob(), clear, ready) == Cause("Queued", f"admission check dispatch Ready: A=2; {said}")
    deactivated = "workload deactivated (held); release reactivates it"
    assert d.explain(trainjob(), clear, note=deactivated) == Cause(
        "Held", f"{deactivated}; hold in force; release admits it")


def test_cessation_of_a_running_object_is_false() -> None:
    c = d.cessation(trainjob=trainjob(suspend=False), name=NAME, job_id="llama", submission="s1", pods=[], nodes={})
    assert not c.ceased and c.reason == f"{NAME} is admitted and running"


def test_cessation_with_no_pods_is_true() -> None:
    c = d.cessation(trainjob=trainjob(), name=NAME, job_id="llama", submission="s1", pods=[], nodes={})
    assert c.ceased and c.reason == "no pod of the object may still run"


def test_cessation_waits_for_an_unscheduled_live_pod_but_not_a_deleted_one() -> None:
    live = pod("a", node=None, phase="Pending")
    dead = pod("b", node=None, phase="Pending", deleting=True)
    assert not d.cessation(trainjob=trainjob(), name=NAME, job_id="llama", submission="s1", pods=[live], nodes={})
    assert d.cessation(trainjob=trainjob(), name=NAME, job_id="llama", submission="s1", pods=[dead], nodes={})


def test_status_and_ceased_say_why_a_nonindexed_jobs_other_pods_do_not_run() -> None:
    """Issue 35 item 6: an object running a NonIndexed Job with parallelism above 1 (started before dispatch
    refused such runtimes): ``ceased`` (and status, from the same text) says the guard refuses the Job's other
    pods, not only that it runs."""
    from dispatch._trainer import TrainJobView
    from dispatch._views import JobView

    job = JobView.from_obj({"metadata": {"name": "llama-s1-node-0", "labels": {
        "jobset.sigs.k8s.io/jobset-name": "llama-s1", "jobset.sigs.k8s.io/replicatedjob-name": "node"}},
        "spec": {"completionMode": "NonIndexed", "parallelism": 2}})
    assert d.jobs_nonindexed([job], "llama-s1") == {"node": 2}
    tj = TrainJobView.from_obj({"metadata": {"name": "llama-s1", "uid": "u", "labels": {
        "dispatch.phpboyscout.uk/job-id": "llama", "dispatch.phpboyscout.uk/submission": "s1"},
        "annotations": {"dispatch.phpboyscout.uk/admission": "1"}}, "spec": {"suspend": False}})
    got = d.cessation(trainjob=tj, name="llama-s1", job_id="llama", submission="s1", pods=[], nodes={}, jobs=[job])
    assert not got.ceased and got.reason == (
        "llama-s1 is admitted and running; trainjob llama-s1: replicatedJob node (completionMode: NonIndexed, "
        "parallelism 2): the pods of a NonIndexed Job carry no completion index, so a second pod of the Job cannot "
        "be told from a replacement of one that may still run and the guard refuses every pod of such a Job beyond "
        "the one that runs; set completionMode: Indexed (JobSet's default) on that replicatedJob's Job template, or "
        "parallelism 1"), got.reason


# ---------------------------------------------------------------- issue 34: an earlier TrainJob's JobSet


def _jobset(owner_uid: str, *, suspended: bool = False) -> Any:
    from dispatch._views import JobSetView

    return JobSetView.from_obj({
        "metadata": {"name": "llama-s1", "ownerReferences": [
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "llama-s1",
             "uid": owner_uid, "controller": True}]},
        "spec": {"suspend": suspended, "replicatedJobs": [{"name": "node"}]}})


def test_a_jobset_owned_by_another_uid_of_the_name_is_named_as_an_orphan_with_the_delete() -> None:
    """The blocker names the deleted owner, Trainer's refusal and the one action; a JobSet of this TrainJob,
    or a read without the TrainJob's uid (a MultiKueue worker's copy has its own), keeps the plain words."""
    def blockers(owner: str, uid: str) -> tuple[str, ...]:
        return d.decide(name="llama-s1", job_id="llama", submission="s1", pods=(), nodes={},
                        jobset=_jobset(owner), uid=uid).blockers

    [orphan] = blockers("old", "new")
    assert orphan.startswith("jobset llama-s1 belongs to an earlier TrainJob of this name (uid old)")
    assert "(uid new)" in orphan and "TrainJobResourcesCreationFailed" in orphan
    assert "`kubectl delete jobset/llama-s1 configmap/llama-s1-runtime-snapshot --ignore-not-found`" in orphan
    assert blockers("new", "new") == ("jobset llama-s1 is not suspended yet",)
    assert blockers("old", "") == ("jobset llama-s1 is not suspended yet",)
    assert d.orphaned_jobset_text(_jobset("old", suspended=True), "new") is not None
    assert d.orphaned_jobset_text(_jobset("new", suspended=True), "new") is None


def _workload(**change: Any) -> Any:
    from dispatch._kueue import WorkloadView

    conds = [{"type": "QuotaReserved", "status": "True"}, *change.pop("conditions", [])]
    entries = change.pop("entries", [{"name": "dispatch", "state": "Pending", "message": "waiting for pods: p",
                                      "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    obj: dict[str, Any] = {
        "metadata": {"name": "w", "namespace": "ns", "uid": change.pop("uid", "u1"), "resourceVersion": "7",
                     "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                          "name": NAME, "uid": change.pop("owner", "o1"), "controller": True}],
                     **change.pop("metadata", {})},
        "spec": {"active": change.pop("active", True)},
        "status": {"conditions": conds, "admissionChecks": entries},
    }
    assert not change
    return WorkloadView.from_obj(obj)


CHECK_CONFLICTS: dict[str, tuple[dict[str, Any] | None, str | None]] = {
    "kueue-wrote-its-own-fields": ({"conditions": [{"type": "Admitted", "status": "False", "reason": "x"}],
                                    "entries": [{"name": "dispatch", "state": "Pending",
                                                 "message": "waiting for pods: p",
                                                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                                                {"name": "other", "state": "Ready", "message": "",
                                                 "lastTransitionTime": "2026-01-01T00:00:05Z"}]}, None),
    "gone": (None, "gone"),
    "recreated": ({"uid": "u2"}, "WorkloadChanged"),
    "other-owner": ({"owner": "o2"}, "WorkloadChanged"),
    "ready-meanwhile": ({"entries": [{"name": "dispatch", "state": "Ready", "message": "admitted",
                                      "lastTransitionTime": "2026-01-01T00:00:09Z"}]}, "WorkloadChanged"),
    "other-message": ({"entries": [{"name": "dispatch", "state": "Pending", "message": "waiting for pods: q",
                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}, "WorkloadChanged"),
    "reset-by-kueue": ({"entries": [{"name": "dispatch", "state": "Pending", "message": "",
                                     "lastTransitionTime": "2026-01-01T00:00:09Z"}]}, "WorkloadChanged"),
    "entry-gone": ({"entries": []}, "WorkloadChanged"),
    "deactivated": ({"active": False}, "WorkloadChanged"),
    "deleting": ({"metadata": {"deletionTimestamp": "2026-01-01T00:00:09Z"}}, "WorkloadChanged"),
    "evicted": ({"conditions": [{"type": "Evicted", "status": "True"}]}, "WorkloadChanged"),
    "finished": ({"conditions": [{"type": "Finished", "status": "True"}]}, "WorkloadChanged"),
}


@pytest.mark.parametrize("case", sorted(CHECK_CONFLICTS))
def test_a_write_that_admits_nothing_is_written_again_only_on_a_workload_unchanged_in_what_it_read(case: str) -> None:
    change, want = CHECK_CONFLICTS[case]
    read = _workload()
    fresh = _workload(**change) if change is not None else None
    entry = read.entry(["dispatch"])
    assert d.check_conflict(entry, read.ref.uid, "o1", fresh) == want
    # a read without our entry (nothing to compare with) never writes again
    assert d.check_conflict(None, read.ref.uid, "o1", fresh) == ("gone" if fresh is None else "WorkloadChanged")


def test_a_workload_without_reserved_quota_is_not_written_again() -> None:
    read = _workload()
    fresh = _workload(conditions=[])
    unreserved = type(fresh)(**{**fresh.__dict__, "quota_reserved": False})
    assert d.check_conflict(read.entry(["dispatch"]), "u1", "o1", unreserved) == "WorkloadChanged"
