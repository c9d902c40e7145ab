"""One or more tests per sentence of the seed's "The rule", "Who enforces it" (plain mode) and "Seeing it".

Each test is named after the sentence it checks and runs against the fake cluster, whose Trainer, JobSet,
Job controller and kubelets are stepped by hand so each interleaving is chosen, not hoped for.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch import (
    ANNOTATION_ADMISSION,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    POD_FINALIZER,
    Adapter,
    JobSpec,
    PodsRemain,
    ReadOnly,
    Refused,
    State,
    Unreachable,
)
from dispatch._trainer import TrainJobView
from dispatch._views import PodView
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")


def two_writes(adapter: Adapter, cluster: FakeCluster) -> None:
    """A plain release as on Trainer before v2.2.1, whose webhook lets runtime patches change only in a write that
    leaves the TrainJob suspended: A raised, then the unsuspend (as once the cluster refused the one-write start)."""
    cluster.trainer_before_2_2_1 = True
    adapter.core.core.atomic_start = False


def running(adapter: Adapter, cluster: FakeCluster) -> str:
    """Open, release and settle: one pod of execution 1 Running. Returns its name."""
    adapter.open(SPEC)
    adapter.release(NAME)
    cluster.settle()
    pods = cluster.pods(NAME)
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running"
    return str(pods[0]["metadata"]["name"])


def held_with_terminating_pod(adapter: Adapter, cluster: FakeCluster) -> str:
    pod = running(adapter, cluster)
    adapter.hold(NAME)
    cluster.settle()  # grace period not yet over: the pod stays Terminating
    obj = cluster.server.get("", "pods", "default", pod)
    assert obj is not None and obj["metadata"].get("deletionTimestamp")
    return pod


def writes(cluster: FakeCluster) -> list[tuple[str, str]]:
    """Writes that change objects: an Event only reports (a refused release records one naming the pods)."""
    return [(m, p) for m, p, _ in cluster.server.requests
            if m in ("POST", "PUT", "PATCH", "DELETE") and not p.endswith("/events")]


# ---------------------------------------------------------------- The rule


def test_nothing_readmits_an_object_while_any_pod_of_it_may_still_run(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert pod in str(err.value)
    assert adapter.inspect(NAME).state is State.HELD
    cluster.history.check()


def test_terminating_pods_are_included_in_the_read(adapter: Adapter, cluster: FakeCluster) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    status = adapter.inspect(NAME)
    assert [p.name for p in status.remaining] == [pod]
    assert status.remaining[0].terminating


def test_the_read_is_one_consistent_read_pinned_to_one_resource_version(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    held_with_terminating_pod(adapter, cluster)
    cluster.server.requests.clear()
    with pytest.raises(PodsRemain):
        adapter.release(NAME)
    pod_lists = [q for m, p, q in cluster.server.requests if m == "GET" and p.endswith("/pods")]
    assert len(pod_lists) == 2
    first, second = pod_lists
    assert "resourceVersion" not in first  # a quorum read: most recent
    assert second["resourceVersionMatch"] == "Exact"
    assert second["resourceVersion"]


def test_pods_are_selected_by_dispatch_labels(adapter: Adapter, cluster: FakeCluster) -> None:
    """A pod carrying only dispatch's labels (no jobset-name) still blocks."""
    adapter.open(SPEC)
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "stray", "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    })
    with pytest.raises(PodsRemain, match="stray on node-1"):
        adapter.release(NAME)


def test_pods_are_selected_by_jobset_name_so_a_rewritten_patch_cannot_hide_them(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "relabelled", "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}},
        "spec": {"nodeName": "node-2", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    })
    with pytest.raises(PodsRemain, match="relabelled on node-2"):
        adapter.release(NAME)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_succeeded_or_failed_pods_do_not_block_even_while_waiting_to_be_deleted(
    adapter: Adapter, cluster: FakeCluster, phase: str
) -> None:
    adapter.open(SPEC)
    # Changed with the force-delete fix: this pod used to carry the phase alone. A terminal phase proves
    # the end only as its kubelet reports it, with every container terminated (the next test: the same
    # phase written by someone else, containers still running, blocks).
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "done", "labels": {"jobset.sigs.k8s.io/jobset-name": NAME},
                     "finalizers": ["batch.kubernetes.io/job-tracking"]},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 0}}}]},
    })
    cluster.server.delete("", "pods", "default", "done")  # waits on its finalizer
    assert cluster.server.get("", "pods", "default", "done") is not None
    assert adapter.release(NAME).admission == 1


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_terminal_phase_its_kubelet_did_not_report_blocks(adapter: Adapter, cluster: FakeCluster,
                                                             phase: str) -> None:
    adapter.open(SPEC)
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "marked", "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "c", "state": {"running": {}}}]},
    })
    with pytest.raises(PodsRemain, match="marked on node-0"):
        adapter.release(NAME)
    assert not adapter.ceased(NAME)


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown"])
def test_any_other_pod_blocks(adapter: Adapter, cluster: FakeCluster, phase: str) -> None:
    adapter.open(SPEC)
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "other", "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase},
    })
    with pytest.raises(PodsRemain):
        adapter.release(NAME)


def test_if_pods_remain_nothing_is_raised_and_nothing_is_admitted(adapter: Adapter, cluster: FakeCluster) -> None:
    held_with_terminating_pod(adapter, cluster)
    before = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    cluster.server.requests.clear()
    with pytest.raises(PodsRemain):
        adapter.release(NAME)
    assert writes(cluster) == []
    after = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert after == before
    assert after is not None and after["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"


def test_a_is_raised_once_per_admission_and_strictly_increases(adapter: Adapter, cluster: FakeCluster,
                                                                keeper: Callable[[], object]) -> None:
    running(adapter, cluster)
    seen = [adapter.inspect(NAME).identity.admission]
    for _ in range(3):
        adapter.hold(NAME)
        cluster.settle()
        cluster.advance(60)
        cluster.settle()
        seen.append(adapter.release(NAME).admission)
        cluster.settle()
    assert seen == [1, 2, 3, 4]
    keeper()  # the controller frees the ended pods (their Jobs keep them)
    labels = {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)}
    assert labels == {"4"}
    cluster.history.check()


def test_admitting_writes_are_conditioned_on_the_resource_version_read(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    two_writes(adapter, cluster)  # the raise and the unsuspend are two writes there
    adapter.open(SPEC)
    cluster.server.requests.clear()
    adapter.release(NAME)
    # the floor of A is raised first, unconditioned: its CRD's rule refuses lowering it, whoever writes
    bodies = [q for m, p, q in cluster.server.requests if m == "PATCH" and "/submissionfloors/" not in p]
    assert len(bodies) == 3  # A issued in the identity record, raised on the TrainJob, then the unsuspend
    # a concurrent change between read and write turns into a retry, not a second execution
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    cluster.server.inject(method="PATCH", path="/trainjobs/", status=409)
    assert adapter.release(NAME).admission == 2  # the conflict turned into a re-read and a retry
    # a write based on a stale read is refused by the server, so it can never admit
    stale = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert stale is not None
    adapter.hold(NAME)
    with pytest.raises(Unreachable) as err:
        adapter._run(adapter.core.core.raise_trainjob(TrainJobView.from_obj(stale), 9, "stale"))
    assert err.value.code == 409


def test_no_pod_can_appear_between_the_list_and_the_admission_because_the_object_stays_suspended(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    cluster.settle()
    assert cluster.pods(NAME) == []  # suspended: Trainer/JobSet/Job start nothing
    adapter.release(NAME)
    cluster.settle()
    assert len(cluster.pods(NAME)) == 1


def test_a_lagging_jobset_blocks_admission_until_its_suspension_takes_effect(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    running(adapter, cluster)
    adapter.hold(NAME)  # the TrainJob is suspended; Trainer has not yet told the JobSet
    with pytest.raises(PodsRemain, match="jobset llama-s1 is not suspended yet"):
        adapter.release(NAME)
    cluster.trainer_sync()
    with pytest.raises(PodsRemain, match="job llama-s1-node-0 is not suspended yet"):
        adapter.release(NAME)


# ---------------------------------------------------------------- Who enforces it (plain mode)


def test_release_writes_nothing_and_raises_pods_remain_naming_the_pods(adapter: Adapter, cluster: FakeCluster) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert err.value.pods == (f"{pod} on node-0 (Ready=True)",)
    assert "the previous execution may still run" in str(err.value)
    assert f"remaining pods: {pod} on node-0 (Ready=True)" in str(err.value)


def test_the_hold_stays_in_force(adapter: Adapter, cluster: FakeCluster) -> None:
    held_with_terminating_pod(adapter, cluster)
    with pytest.raises(PodsRemain):
        adapter.release(NAME)
    cluster.settle()
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None and tj["spec"]["suspend"] is True


def test_pods_remain_is_classified_as_unreachable_not_refused() -> None:
    assert issubclass(PodsRemain, Unreachable)
    assert not issubclass(PodsRemain, Refused)


def test_release_admits_once_the_pods_are_gone(adapter: Adapter, cluster: FakeCluster,
                                               keeper: Callable[[], object]) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    cluster.confirm_termination(pod)
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    keeper()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"2"}
    cluster.history.check()


def test_release_of_an_admitted_object_returns_its_identity_without_writing(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    running(adapter, cluster)
    cluster.server.requests.clear()
    ident = adapter.release(NAME)
    assert ident.admission == 1
    assert writes(cluster) == []


def test_a_retried_release_after_a_lost_reply_is_safe(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC)
    cluster.server.inject(method="PATCH", path="/trainjobs/", status="timeout", after=True, times=1)
    with pytest.raises(Unreachable):
        adapter.release(NAME)
    ident = adapter.release(NAME)
    assert ident.admission >= 1
    cluster.settle()
    cluster.history.check()


def test_open_meets_the_same_check_a_same_named_earlier_objects_pods_block(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    pod = running(adapter, cluster)
    adapter.close(NAME)
    cluster.settle()  # the GC deletes JobSet and Jobs; the pod is Terminating
    assert cluster.server.get("", "pods", "default", pod) is not None
    cluster.server.requests.clear()
    with pytest.raises(PodsRemain, match=pod):
        adapter.open(SPEC, hold=False)
    assert writes(cluster) == []


def test_open_without_hold_admits_a_never_run_object_at_once(adapter: Adapter, cluster: FakeCluster) -> None:
    status = adapter.open(JobSpec(job_id="fresh", submission="a"), hold=False)
    assert status.state is State.RUNNING
    assert status.identity.admission == 1
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods("fresh-a")} == {"1"}


def test_a_read_only_adapter_refuses_writes_before_any_request(reader: Adapter, cluster: FakeCluster) -> None:
    cluster.server.requests.clear()
    for call in (lambda: reader.open(SPEC), lambda: reader.release(NAME), lambda: reader.hold(NAME),
                 lambda: reader.close(NAME)):
        with pytest.raises(ReadOnly):
            call()
    assert cluster.server.requests == []


# ---------------------------------------------------------------- How it ends


def test_on_a_lost_node_pods_stay_until_the_out_of_service_taint_and_then_admission_proceeds(
    adapter: Adapter, cluster: FakeCluster, keeper: Callable[[], object]
) -> None:
    pod = running(adapter, cluster)
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.advance(3600)
    cluster.settle()
    assert cluster.server.get("", "pods", "default", pod) is not None  # stuck Terminating
    with pytest.raises(PodsRemain, match=r"on node-0 \(Ready=Unknown\)"):
        adapter.release(NAME)
    assert not adapter.ceased(NAME)
    cluster.taint_out_of_service("node-0")
    assert adapter.ceased(NAME).ceased  # proven before PodGC even runs
    cluster.settle()
    # Changed with the force-delete fix: PodGC's delete no longer removes the pod by itself. dispatch's
    # finalizer keeps it (marked Failed by PodGC) until dispatch's controller proves its end, here by the
    # taint, and frees it (the writer role may not patch pods: issue 25).
    left = cluster.server.get("", "pods", "default", pod)
    assert left is not None and left["status"]["phase"] == "Failed"
    assert left["metadata"]["finalizers"] == [POD_FINALIZER]
    with pytest.raises(PodsRemain, match="its end is proven"):
        adapter.release(NAME)
    keeper()
    assert cluster.server.get("", "pods", "default", pod) is None
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_node_deletion_ends_the_wait(adapter: Adapter, cluster: FakeCluster, keeper: Callable[[], object]) -> None:
    pod = running(adapter, cluster)
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.remove_machine("node-0")  # the frozen machine is gone, and the operator deletes its Node
    status = adapter.inspect(NAME)
    assert status.cause.detail.startswith(f"remaining pods: {pod} on node-0 (gone)")
    # A plain read cannot tell what the Node was when deleted (issue 40) ...
    assert not adapter.ceased(NAME).ceased
    cluster.settle()
    # ... the controller's keeper can: it saw it Ready=Unknown, and frees the pod, which PodGC deletes (grace 0) 40 s
    # after it found the Node missing: a freed pod stays in the API through its grace period, as on the real one.
    keeper()
    cluster.advance(cluster.ORPHAN_QUARANTINE)
    cluster.settle()
    assert adapter.release(NAME).admission == 2


# ---------------------------------------------------------------- Seeing it


def test_inspect_puts_remaining_pods_in_the_cause_detail(adapter: Adapter, cluster: FakeCluster) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    status = adapter.inspect(NAME)
    assert status.cause.reason == "PodsRemain"
    assert status.cause.detail == f"remaining pods: {pod} on node-0 (Ready=True)"


@pytest.mark.parametrize(
    ("act", "state"),
    [
        ("none", "Ready=True"),
        ("freeze", "Ready=Unknown"),
        ("notready", "Ready=False"),
        ("delete", "gone"),
        ("freeze+taint", "Ready=Unknown, out-of-service"),
    ],
)
def test_node_state_is_shown_for_each_remaining_pod(
    adapter: Adapter, cluster: FakeCluster, act: str, state: str
) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    if "freeze" in act:
        cluster.freeze_node("node-0")
    if act == "notready":
        cluster.server.update("", "nodes", "", "node-0",
                              lambda o: o["status"]["conditions"][0].update(status="False"), status=True)
    if act == "delete":
        cluster.delete_node("node-0")
    if "taint" in act:
        cluster.taint_out_of_service("node-0")
    # a pod whose end its node proves names who frees it next; a deletion alone proves nothing (issue 40)
    proven = {"freeze+taint": "out-of-service"}.get(act)
    why = (f"; pod {pod}: its end is proven ({proven}); dispatch's controller removes dispatch's finalizer so it "
           f"goes (without a controller running: `dispatch admin release-pod {pod}`)" if proven else "")
    if act == "delete":
        why = (f"; pod {pod}: node node-0 was deleted, which proves nothing by itself: a kubelet whose Node is "
               "deleted keeps running its containers and does not register again; dispatch's controller takes "
               "the deletion as proof only of a Node it saw Ready=Unknown when deleted. Once the machine is "
               f"confirmed shut down, run `dispatch admin release-pod {pod} --node-confirmed-down`; if the Node "
               "was deleted by mistake, restart its kubelet: it registers again and ends the pod itself")
    assert adapter.inspect(NAME).cause.detail == f"remaining pods: {pod} on node-0 ({state}){why}"
    found = adapter.find(job_id="llama")
    assert found[0].cause.detail == f"remaining pods: {pod} on node-0 ({state}){why}"


def test_node_state_not_readable_when_nodes_are_forbidden(adapter: Adapter, cluster: FakeCluster) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    cluster.server.inject(method="GET", path="/api/v1/nodes/", status=403, times=10)
    status = adapter.inspect(NAME)
    assert status.cause.detail == f"remaining pods: {pod} on node-0 (not readable)"
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    assert "cannot prove cessation: nodes not readable" in cessation.reason


def test_find_answers_for_many_objects_with_a_constant_number_of_calls(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    counts = []
    for i in range(1, 9):
        adapter.open(JobSpec(job_id="sweep", submission=f"s{i}"))
        adapter.release(f"sweep-s{i}")
        adapter.hold(f"sweep-s{i}")
        cluster.settle()
        cluster.server.requests.clear()
        statuses = adapter.find(job_id="sweep")
        assert len(statuses) == i
        counts.append(len(cluster.server.requests))
    assert len(set(counts[1:])) == 1, counts


def test_find_of_running_objects_reads_their_pods_with_one_list_however_many(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """A running object's status names a rank waiting on an ending pod; find reads that for all of them with
    one pod list (and a Node read per pod being deleted, of which here there is none)."""
    counts = []
    for i in range(1, 6):
        adapter.open(JobSpec(job_id="sweep", submission=f"s{i}"))
        adapter.release(f"sweep-s{i}")
        cluster.settle()
        cluster.server.requests.clear()
        statuses = adapter.find(job_id="sweep")
        assert [s.state for s in statuses] == [State.RUNNING] * i
        pod_lists = [p for m, p, _ in cluster.server.requests if m == "GET" and p.endswith("/pods")]
        assert len(pod_lists) == 1, cluster.server.requests
        counts.append(len(cluster.server.requests))
    assert len(set(counts)) == 1, counts


def test_find_filters_by_state(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(JobSpec(job_id="f", submission="a"))
    adapter.open(JobSpec(job_id="f", submission="b"), hold=False)
    assert [s.name for s in adapter.find(job_id="f", state=State.HELD)] == ["f-a"]
    assert [s.name for s in adapter.find(job_id="f", state=State.RUNNING)] == ["f-b"]
    assert [s.name for s in adapter.find(submission="b")] == ["f-b"]


def test_ceased_writes_nothing_and_works_read_only(reader: Adapter, adapter: Adapter, cluster: FakeCluster) -> None:
    held_with_terminating_pod(adapter, cluster)
    cluster.server.requests.clear()
    result = reader.ceased(NAME)
    assert not result.ceased and "pods may still run" in result.reason
    assert writes(cluster) == []
    node_calls = [p for m, p, _ in cluster.server.requests if "/nodes" in p]
    assert node_calls == ["/api/v1/nodes/node-0"]  # get only, never list


def test_running_object_status_names_its_execution(adapter: Adapter, cluster: FakeCluster) -> None:
    running(adapter, cluster)
    status = adapter.inspect(NAME)
    assert status.state is State.RUNNING
    assert status.identity.admission == 1
    assert status.cause.detail == "execution 1 admitted"


def test_the_seeds_broken_design_is_caught_by_the_history_checker(adapter: Adapter, cluster: FakeCluster) -> None:
    """Admitting as soon as JobSet reports no active Job (the first design) starts A=2 beside A=1."""
    pod = held_with_terminating_pod(adapter, cluster)
    js = cluster.server.get("jobset.x-k8s.io", "jobsets", "default", NAME)
    assert js is not None and all(r["active"] == 0 for r in js["status"]["replicatedJobsStatus"])
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None
    # Trainer's webhook accepts: active is already 0
    adapter._run(adapter.core.core.raise_trainjob(TrainJobView.from_obj(tj), 2, "first-design"))
    cluster.server.update("trainer.kubeflow.org", "trainjobs", "default", NAME,
                          lambda o: o["spec"].update(suspend=False), status=False)
    cluster.settle()
    assert cluster.server.get("", "pods", "default", pod) is not None
    with pytest.raises(AssertionError, match="overlap"):
        cluster.history.check()


def test_pod_settings_survive_every_admission(adapter: Adapter, cluster: FakeCluster,
                                             keeper: Callable[[], object]) -> None:
    """Raising A re-applies dispatch's whole patch entry, so annotations and node selector are kept."""
    spec = JobSpec(job_id="pinned", submission="s1", pod_annotations={"example.com/a": "1"},
                   node_selector={"kubernetes.io/hostname": "node-2"}, termination_grace_period_seconds=5)
    adapter.open(spec)
    for expected in (1, 2):
        assert adapter.release("pinned-s1").admission == expected
        cluster.settle()
        pods = cluster.pods("pinned-s1")
        assert [p["spec"]["nodeName"] for p in pods] == ["node-2"]
        assert pods[0]["metadata"]["annotations"] == {"example.com/a": "1"}
        assert pods[0]["spec"]["terminationGracePeriodSeconds"] == 5
        adapter.hold("pinned-s1")
        cluster.settle()
        cluster.advance(10)
        cluster.settle()
        keeper()


def test_a_closed_and_reopened_submission_never_reuses_an_admission_number(
    adapter: Adapter, cluster: FakeCluster, keeper: Callable[[], object]
) -> None:
    """Found by the state machine: without a ledger, a re-opened submission started again at A=1."""
    running(adapter, cluster)
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    adapter.close(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    # Changed with the force-delete fix: the pods ended after close, so close could not free them then;
    # with no controller running they stay, ended as their kubelet reports and held only by dispatch's
    # finalizer, until dispatch's controller frees them (the writer role may not patch pods: issue 25).
    assert all(PodView.from_obj(p).kubelet_confirmed and p["metadata"]["finalizers"] == [POD_FINALIZER]
               for p in cluster.pods(NAME))
    keeper()
    assert adapter.open(SPEC, hold=False).identity.admission == 3
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"3"}
    adapter.close(NAME)
    adapter.open(SPEC)
    cluster.advance(60)
    cluster.settle()
    assert adapter.release(NAME).admission == 4
    cluster.history.check()


def test_a_crash_between_recording_a_and_raising_it_skips_a_number_and_never_reuses_it(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open(SPEC)
    cluster.server.inject(method="PATCH", path=f"/trainjobs/{NAME}$", status=500, times=1)
    with pytest.raises(Unreachable):
        adapter.release(NAME)  # A=1 is in the identity record; raising it on the TrainJob failed
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None and tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "0"
    adapter.close(NAME)
    assert adapter.open(SPEC, hold=False).identity.admission == 2


def test_a_status_write_between_raise_and_unsuspend_does_not_skip_a_number(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """Trainer writes a new TrainJob's status right after it is created; found on the testbed, where
    the unsuspend then met a 409 and release raised A again, so a fresh object started at A=2.
    Only the resourceVersion moved (still suspended, same generation, our A): the unsuspend is retried."""
    two_writes(adapter, cluster)  # the raise and the unsuspend are two writes there
    adapter.open(SPEC)
    patches = {"n": 0}

    def trainer_writes_status(method: str, path: str) -> None:
        if method == "PATCH" and path.endswith(f"/trainjobs/{NAME}"):
            patches["n"] += 1
            if patches["n"] == 2:  # the unsuspend, after our raise
                cluster.server.update("trainer.kubeflow.org", "trainjobs", "default", NAME,
                                      lambda o: o.setdefault("status", {}).update(conditions=[]), status=True)

    cluster.server.before_request = trainer_writes_status
    try:
        identity = adapter.release(NAME)
    finally:
        cluster.server.before_request = None
    assert identity.admission == 1
    assert patches["n"] == 3               # raise, the unsuspend that met the 409, its retry
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"1"}


def test_a_spec_change_between_raise_and_unsuspend_decides_afresh(adapter: Adapter, cluster: FakeCluster) -> None:
    """If the spec moved (another writer raised A), the unsuspend is not retried blindly: release decides
    again from a new consistent read, and the number it writes is above every one seen."""
    two_writes(adapter, cluster)  # the raise and the unsuspend are two writes there
    adapter.open(SPEC)
    patches = {"n": 0}

    def another_writer(method: str, path: str) -> None:
        if method == "PATCH" and path.endswith(f"/trainjobs/{NAME}"):
            patches["n"] += 1
            if patches["n"] == 2:
                def bump(o: dict[str, object]) -> None:
                    o["metadata"]["annotations"][ANNOTATION_ADMISSION] = "5"  # type: ignore[index]
                    o["spec"]["trainer"] = {"numNodes": 1}  # type: ignore[index]
                cluster.server.update("trainer.kubeflow.org", "trainjobs", "default", NAME, bump, status=False)

    cluster.server.before_request = another_writer
    try:
        identity = adapter.release(NAME)
    finally:
        cluster.server.before_request = None
    assert identity.admission == 6


def _trainjob_writes(cluster: FakeCluster) -> list[str]:
    """The TrainJob writes sent since the requests were last cleared: "apply" (server-side) or "merge"."""
    return ["apply" if "fieldManager" in q else "merge" for m, p, q in cluster.server.requests
            if m == "PATCH" and p.endswith(f"/trainjobs/{NAME}")]


def test_a_release_raises_a_and_starts_the_execution_in_one_write(adapter: Adapter, cluster: FakeCluster) -> None:
    """Trainer v2.2.1 and later take runtime patches that change in the write that unsuspends: A is raised on the
    TrainJob and the execution started in one conditioned write, after the record issued A (issue 36)."""
    adapter.open(SPEC)
    cluster.server.requests.clear()
    assert adapter.release(NAME).admission == 1
    assert _trainjob_writes(cluster) == ["apply"]
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None and tj["spec"]["suspend"] is False
    assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"
    assert tj["metadata"]["annotations"]["dispatch.phpboyscout.uk/started"] == "1"
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"1"}
    cluster.history.check()


def test_a_trainer_before_2_2_1_refuses_the_one_write_start_and_the_release_takes_two(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """Trainer v2.2.0 lets runtime patches change only in a write that leaves the TrainJob suspended: the refused
    start is raised alone and then unsuspended, and the adapter remembers it for its next releases."""
    cluster.trainer_before_2_2_1 = True
    adapter.open(SPEC)
    cluster.server.requests.clear()
    assert adapter.release(NAME).admission == 1
    assert _trainjob_writes(cluster) == ["apply", "apply", "merge"]  # refused, raised alone, unsuspended
    assert adapter.core.core.atomic_start is False
    cluster.settle()
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    cluster.server.requests.clear()
    assert adapter.release(NAME).admission == 2
    assert _trainjob_writes(cluster) == ["apply", "merge"]
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)
            if p["status"].get("phase") == "Running"} == {"2"}
    cluster.history.check()


def test_a_raise_alone_after_a_one_write_start_keeps_the_object_suspended_until_its_unsuspend(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """A server-side apply removes the fields its manager set before and leaves out now: a raise alone after a
    raise that started (a Trainer refusing the start, a start the guard refused) names ``spec.suspend`` as read,
    so it never unsuspends the object itself; only the conditioned unsuspend after it starts the execution."""
    adapter.open(SPEC)
    adapter.release(NAME)
    cluster.settle()
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    adapter.core.core.atomic_start = False
    seen: list[bool] = []

    def before_the_unsuspend(method: str, path: str) -> None:
        if method == "PATCH" and path.endswith(f"/trainjobs/{NAME}") and not seen:
            tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
            assert tj is not None
            if tj["metadata"]["annotations"].get(ANNOTATION_ADMISSION) == "2":  # the raise landed; this is next
                seen.append(bool(tj["spec"].get("suspend")))

    cluster.server.before_request = before_the_unsuspend
    try:
        assert adapter.release(NAME).admission == 2
    finally:
        cluster.server.before_request = None
    assert seen == [True]
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)
            if p["status"].get("phase") == "Running"} == {"2"}
    cluster.history.check()


def test_a_release_of_a_running_object_reads_only_its_trainjob_and_workload(adapter: Adapter, cluster: FakeCluster
                                                                            ) -> None:
    """An object that runs is answered from its TrainJob (and its Workload, for a hold Kueue has not acted on):
    release reads nothing else of it, and an ``Inputs`` without its consistent read gives no verdict."""
    adapter.open(SPEC)
    adapter.release(NAME)
    cluster.settle()
    cluster.server.requests.clear()
    assert adapter.release(NAME).admission == 1
    assert [(m, p.rsplit("/", 1)[-1]) for m, p, _ in cluster.server.requests] == [("GET", NAME), ("GET", "workloads")]
    got = adapter._run(adapter.core.core.reader.inputs([NAME], lower=False))[NAME]
    with pytest.raises(RuntimeError, match="no consistent read was taken"):
        got.verdict()
