"""The admission check on the fake cluster, Kueue played by ``FakeKueue``: every branch of the reconcile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import (
    ANNOTATION_ADMISSION,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    PATCH_MANAGER,
    AsyncAdapter,
    JobSpec,
)
from dispatch import _kube as k
from dispatch._api import SUBMISSION_FLOORS
from dispatch._identity import ADMISSION_LIMIT, new_floor
from dispatch.controller import WAITING_PREFIX
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import NAME, SPEC, pods_summary, quiet, running, until, writes

A = LABEL_ADMISSION


def admission_of(cluster: FakeCluster, name: str = NAME, ns: str = "default") -> int:
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", ns, name)
    assert tj is not None
    return int(tj["metadata"].get("annotations", {}).get(ANNOTATION_ADMISSION, "0"))


def status_writes(cluster: FakeCluster, since: int = 0) -> list[tuple[str, str]]:
    return [w for w in writes(cluster, since) if w[1].endswith("/status") and "/workloads/" in w[1]]


async def running_object(adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue,
                         kube: k.Kube, spec: JobSpec = SPEC) -> str:
    """Open under Kueue, let the controller admit it, let Kueue start it: one execution with A=1 running."""
    await adapter.open(spec)
    name = spec.name or f"{spec.job_id}-{spec.submission}"
    wl = kueue.workload_for(name)
    await until(lambda: kueue.entry(wl)["state"] == "Ready", what="first admission")
    kueue.sync()
    cluster.settle()
    return wl


# ---------------------------------------------------------------- none remain: raise A, then Ready


async def test_first_admission_raises_a_then_sets_ready_with_identity_labels(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    entry = kueue.entry(wl)
    assert admission_of(cluster) == 1
    assert entry["podSetUpdates"] == [{"name": "node", "labels": {
        LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1", A: "1"}}]
    assert "admitted as llama/s1#1" in entry["message"]
    kueue.sync()
    cluster.settle()
    assert pods_summary(cluster) == [(pods_summary(cluster)[0][0], "Running", "1", False)]
    cluster.history.check()


async def test_every_pod_set_gets_the_identity_labels(kube: k.Kube) -> None:
    cluster = FakeCluster()
    cluster.add_runtime(replicated=("launcher", "node"))
    cluster.add_node("node-0")
    kueue = FakeKueue(cluster)
    kueue.install()
    kb = k.Kube.connect(namespace="default", transport=cluster.transport())
    await AsyncAdapter(kb).open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kb):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    names = [u["name"] for u in kueue.entry(wl)["podSetUpdates"]]
    assert names == ["launcher", "node"]
    assert all(u["labels"][A] == "1" for u in kueue.entry(wl)["podSetUpdates"])
    await kb.aclose()


async def test_an_admission_without_waiting_costs_two_writes_and_one_event(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube) as ctl:
        await until(lambda: ctl.metrics.admissions._value.get() == 1)
        await quiet()
        counts = {kind: ctl.metrics.writes.labels(kind)._value.get() for kind in ("trainjob", "workload", "event")}
    assert counts == {"trainjob": 1, "workload": 1, "event": 1}
    assert kueue.entry(wl)["state"] == "Ready"


# ---------------------------------------------------------------- pods remain: stay Pending, quota kept


async def test_preempted_object_waits_for_terminating_pods_then_is_readmitted_with_higher_a(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        wl = await running_object(adapter, cluster, kueue, kube)
        [(old_pod, _, _, _)] = pods_summary(cluster)
        kueue.evict(wl)
        cluster.settle()            # suspended: the pod is Terminating, its grace period not over
        kueue.sync()                # JobSet reports active=0: Kueue releases and re-reserves at once
        expected = f"waiting for pods of the previous execution to go: {old_pod} on node-0"
        await until(lambda: kueue.entry(wl)["message"] == expected, what="waiting message")
        before = len(cluster.server.requests)
        kueue.sync()
        cluster.settle()
        await quiet()
        entry = kueue.entry(wl)
        workload = kueue.workload(wl)
        tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
        assert tj is not None
        assert entry["state"] == "Pending"
        assert any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in workload["status"]["conditions"])
        assert tj["spec"]["suspend"] is True
        assert admission_of(cluster) == 1
        assert status_writes(cluster, before) == []          # nothing changed, nothing written
        cluster.advance(31)
        cluster.settle()                                     # the kubelet confirms: the pod goes
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="Ready after the pod went")
        assert admission_of(cluster) == 2
        kueue.sync()
        cluster.settle()
    assert [p[1:] for p in pods_summary(cluster)] == [("Running", "2", False)]
    cluster.history.check()


async def test_message_is_rewritten_only_when_the_remaining_pods_change(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    spec = JobSpec(job_id="llama", submission="s1", queue="lq-dispatch", num_nodes=2)
    async with running(kube):
        wl = await running_object(adapter, cluster, kueue, kube, spec)
        pods = sorted(p[0] for p in pods_summary(cluster))
        assert len(pods) == 2
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].count(" on node-") == 2)
        first = len(status_writes(cluster))
        cluster.confirm_termination(pods[0])
        await until(lambda: kueue.entry(wl)["message"].count(" on node-") == 1)
        assert pods[1] in kueue.entry(wl)["message"] and pods[0] not in kueue.entry(wl)["message"]
        await quiet()
        assert len(status_writes(cluster)) == first + 1
        cluster.confirm_termination(pods[1])
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    cluster.history.check()


async def test_a_pod_on_a_lost_node_holds_the_check_until_the_out_of_service_taint(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        wl = await running_object(adapter, cluster, kueue, kube)
        [(pod, _, _, _)] = pods_summary(cluster)
        cluster.freeze_node("node-0")
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].startswith(WAITING_PREFIX))
        cluster.advance(3600)
        cluster.settle()
        await quiet()
        assert kueue.entry(wl)["state"] == "Pending" and pod in kueue.entry(wl)["message"]
        cluster.taint_out_of_service("node-0")
        cluster.settle()
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        kueue.sync()
        cluster.settle()
    cluster.history.check()


async def test_a_jobset_not_yet_suspended_blocks_like_a_pod(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        wl = await running_object(adapter, cluster, kueue, kube)
        kueue.evict(wl)             # TrainJob suspended; Trainer has not yet propagated it to the JobSet
        cluster.job_sync()

        def requeue(obj: dict[str, Any]) -> None:
            for c in obj["status"]["conditions"]:
                if c["type"] == "Evicted":
                    c["status"] = "False"
        cluster.server.update("kueue.x-k8s.io", "workloads", "default", wl, requeue, status=True)
        await until(lambda: "is not suspended yet" in kueue.entry(wl)["message"])
        assert kueue.entry(wl)["state"] == "Pending"
        assert kueue.entry(wl)["message"].startswith(WAITING_PREFIX)
        [(pod, _, _, _)] = pods_summary(cluster)
        cluster.force_delete(pod)            # the pod goes, but the Job could still start another
        await until(lambda: kueue.entry(wl)["message"] == "waiting for the previous execution to stop: jobset "
                    "llama-s1 is not suspended yet; job llama-s1-node-0 is not suspended yet")
        cluster.settle()                     # Trainer and JobSet catch up: the Job is suspended
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        kueue.sync()
        cluster.settle()
    cluster.history.check()


async def test_unblocking_follows_the_pod_event_not_a_polling_period(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube, resync_seconds=3600) as ctl:
        wl = await running_object(adapter, cluster, kueue, kube)
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].startswith(WAITING_PREFIX))
        cluster.advance(31)
        cluster.settle()
        await until(lambda: kueue.entry(wl)["state"] == "Ready", timeout=1.0)
        assert ctl.metrics.pod_gone_to_ready._sum.get() < 1.0
        assert ctl.metrics.wait_seconds._sum.get() >= 0


async def test_a_node_change_re_evaluates_the_workloads_waiting_on_it(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube) as ctl:
        wl = await running_object(adapter, cluster, kueue, kube)
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].startswith(WAITING_PREFIX))
        await quiet()
        seen = ctl.metrics.decisions.labels("waiting")._value.get()
        cluster.freeze_node("node-1")        # a node nothing waits on: no reconcile
        await quiet()
        assert ctl.metrics.decisions.labels("waiting")._value.get() == seen
        cluster.freeze_node("node-0")        # the node the remaining pod sits on
        await until(lambda: ctl.metrics.decisions.labels("waiting")._value.get() == seen + 1)


# ---------------------------------------------------------------- writes that cannot clobber or go stale


async def test_another_controllers_check_beside_ours_is_left_untouched(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME, other_checks=["provisioning"])
    kueue.set_check(wl, "provisioning", "Pending", "waiting for capacity")
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        assert kueue.entry(wl, "provisioning") == {
            "name": "provisioning", "state": "Pending", "message": "waiting for capacity",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
        kueue.sync()
        assert kueue.admitted == []                      # Kueue waits for every check
        kueue.set_check(wl, "provisioning", "Ready", "provisioned")
        await quiet()
        assert kueue.entry(wl)["state"] == "Ready"
        assert [c["name"] for c in kueue.workload(wl)["status"]["admissionChecks"]] == ["provisioning", "dispatch"]
        kueue.sync()
    assert len(kueue.admitted) == 1


async def test_a_stale_workload_write_gets_409_and_is_retried(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    cluster.server.inject(method="PATCH", path=r"/workloads/.*/status$", status=409, times=2)
    async with running(kube) as ctl:
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        assert ctl.metrics.errors.labels("WorkloadConflict")._value.get() == 0
    # The TrainJob did not change since our own write, so the same A was re-used for the retried write.
    assert admission_of(cluster) == 1
    assert kueue.entry(wl)["podSetUpdates"][0]["labels"][A] == "1"


async def test_a_workload_changed_by_kueue_between_read_and_write_is_decided_again(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube) as ctl:
        def evict_now() -> None:
            kueue.evict(wl)                  # Kueue evicts after our read: the Ready write must not land
        ctl.reconciler.before_ready = evict_now
        await until(lambda: ctl.metrics.errors.labels("WorkloadChanged")._value.get() >= 1)
        ctl.reconciler.before_ready = None
        assert kueue.entry(wl)["state"] == "Pending"
        cluster.settle()
        kueue.sync()                         # inactive: released and re-reserved
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    # A=1 never ran and nothing changed the TrainJob since its raise: the same admission reuses it
    assert admission_of(cluster) == 1
    assert kueue.entry(wl)["podSetUpdates"][0]["labels"][A] == "1"


async def test_a_stale_trainjob_write_gets_409_and_is_requeued(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    cluster.server.inject(method="PATCH", path=r"/trainjobs/llama-s1$", status=409, times=1)
    async with running(kube) as ctl:
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        assert ctl.metrics.errors.labels("TrainJobConflict")._value.get() == 1
    assert admission_of(cluster) == 1  # nothing was written before the conflict, so nothing is skipped


async def test_transient_api_errors_are_retried_with_backoff(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    cluster.server.inject(method="PATCH", path=r"/workloads/.*/status$", status="connect", times=2)
    async with running(kube) as ctl:
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        assert ctl.metrics.errors.labels("ConnectionError")._value.get() == 2
    kueue.sync()
    cluster.settle()
    cluster.history.check()


async def test_a_crash_between_raising_a_and_ready_is_found_and_its_number_reused(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube) as ctl:
        ctl.reconciler.before_ready = lambda: asyncio.Event().wait()   # killed here: never returns
        await until(lambda: admission_of(cluster) == 1, what="A raised")
    assert kueue.entry(wl)["state"] == "Pending"
    kueue.sync()
    cluster.settle()
    assert cluster.pods(NAME) == []          # still suspended: A=1 never ran
    async with running(kube):                # the restarted controller finds its own raise (the token)
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    assert admission_of(cluster) == 1
    kueue.sync()
    cluster.settle()
    assert [p[2] for p in pods_summary(cluster)] == ["1"]
    cluster.history.check()


# ---------------------------------------------------------------- what is not ours to decide


async def test_pending_without_reserved_quota_is_not_decided(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME, reserve=False)
    async with running(kube) as ctl:
        await until(lambda: ctl.metrics.decisions.labels("no-quota")._value.get() >= 1)
        assert kueue.entry(wl)["state"] == "Pending" and admission_of(cluster) == 0

        def reserve(obj: dict[str, Any]) -> None:
            obj["status"]["conditions"][0]["status"] = "True"
        cluster.server.update("kueue.x-k8s.io", "workloads", "default", wl, reserve, status=True)
        await until(lambda: kueue.entry(wl)["state"] == "Ready")


@pytest.mark.parametrize("state", ["Retry", "Rejected", "Ready"])
async def test_a_check_not_pending_is_left_alone(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, state: str
) -> None:
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    kueue.set_check(wl, "dispatch", state, "set by a person")
    before = len(cluster.server.requests)
    async with running(kube):
        await quiet()
    assert kueue.entry(wl)["state"] == state and kueue.entry(wl)["message"] == "set by a person"
    assert [w for w in writes(cluster, before) if "/workloads/" in w[1] or "/trainjobs/" in w[1]] == []


async def test_a_workload_of_another_kind_passes_at_once_by_default(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    job = cluster.server.create("batch", "jobs", "default", {"metadata": {"name": "plain"}, "spec": {}})
    cluster.server.create("kueue.x-k8s.io", "workloads", "default", {
        "metadata": {"name": "job-plain", "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "plain", "uid": job["metadata"]["uid"],
             "controller": True}]},
        "spec": {"podSets": [{"name": "main", "count": 1}]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                   "admissionChecks": [{"name": "dispatch", "state": "Pending", "message": "",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    })
    async with running(kube):
        await until(lambda: kueue.entry("job-plain")["state"] == "Ready")
    entry = kueue.entry("job-plain")
    assert entry["message"].startswith("Job plain is not a TrainJob")
    assert "podSetUpdates" not in entry


async def test_a_workload_of_another_kind_is_ignored_when_so_configured(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    cluster.server.create("kueue.x-k8s.io", "workloads", "default", {
        "metadata": {"name": "orphan"},
        "spec": {"podSets": [{"name": "main", "count": 1}]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                   "admissionChecks": [{"name": "dispatch", "state": "Pending", "message": "",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    })
    async with running(kube, foreign="ignore") as ctl:
        await until(lambda: ctl.metrics.decisions.labels("foreign-ignored")._value.get() >= 1)
    assert kueue.entry("orphan")["state"] == "Pending" and kueue.entry("orphan")["message"] == ""


async def test_a_trainjob_not_opened_by_dispatch_gets_the_rule_but_no_admission_number(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    cluster.server.create("trainer.kubeflow.org", "trainjobs", "default", {
        "metadata": {"name": "byhand", "labels": {"kueue.x-k8s.io/queue-name": "lq-dispatch"}},
        "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}, "suspend": True},
    })
    async with running(kube):
        wl = kueue.workload_for("byhand")
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        assert "not a dispatch object" in kueue.entry(wl)["message"]
        assert "podSetUpdates" not in kueue.entry(wl)
        kueue.sync()
        cluster.settle()
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].startswith("waiting for pods of the previous execution"))
        cluster.advance(31)
        cluster.settle()
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        kueue.sync()
        cluster.settle()
    assert admission_of(cluster, "byhand") == 0
    first, second = sorted(cluster.history.processes, key=lambda p: p.started)   # no A to check, but no overlap
    assert first.ended is not None and first.ended < second.started


async def test_an_admission_check_created_after_its_workloads_still_gets_them_decided(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    kueue = FakeKueue(cluster)
    await adapter.open(SPEC)
    async with running(kube) as ctl:
        wl = kueue.workload_for(NAME)            # its check names an AdmissionCheck nobody owns yet
        await quiet()
        assert ctl.check_names == frozenset() and kueue.entry(wl)["state"] == "Pending"
        kueue.install()                          # now the check is ours; the Workload does not change
        await until(lambda: kueue.entry(wl)["state"] == "Ready")


async def test_checks_of_another_controller_are_not_ours(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    other = FakeKueue(cluster, check="someone-else", queue="lq-other", cluster_queue="cq-other")
    other.install(controller_name="example.com/other")
    await adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-other"))
    wl = other.workload_for(NAME)
    before = len(cluster.server.requests)
    async with running(kube) as ctl:
        await quiet()
        assert ctl.check_names == frozenset()
    assert other.entry(wl)["state"] == "Pending"
    assert [w for w in writes(cluster, before) if "/workloads/" in w[1] or "admissionchecks" in w[1]] == []


async def test_a_refused_raise_keeps_the_check_pending_with_the_reason_and_retries(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    deny = {"on": True}
    cluster.server.add_admission(
        "trainjobs", lambda op, old, new: "runtime patches are frozen" if deny["on"] and old is not None
        and old["spec"].get("runtimePatches") != new["spec"].get("runtimePatches")
        and any(p.get("manager") == PATCH_MANAGER for p in new["spec"]["runtimePatches"])
        and new["metadata"].get("annotations", {}).get(ANNOTATION_ADMISSION) != "0" else None)
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: "was refused" in kueue.entry(wl)["message"])
        assert kueue.entry(wl)["state"] == "Pending"
        assert "runtime patches are frozen" in kueue.entry(wl)["message"]
        deny["on"] = False
        await until(lambda: kueue.entry(wl)["state"] == "Ready", timeout=10)
    reasons = [e["reason"] for e in cluster.server.objects("", "events", "default")]
    assert "AdmissionRefused" in reasons and "AdmissionProceeds" in reasons


# ---------------------------------------------------------------- operable


async def test_events_on_the_trainjob_say_when_admission_waits_and_when_it_proceeds(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        wl = await running_object(adapter, cluster, kueue, kube)
        kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await until(lambda: kueue.entry(wl)["message"].startswith(WAITING_PREFIX))
        cluster.advance(31)
        cluster.settle()
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
        await quiet(0.05)
    events = cluster.server.objects("", "events", "default")
    reasons = [e["reason"] for e in events]
    assert reasons.count("AdmissionDelayed") == 1
    assert reasons.count("AdmissionProceeds") == 2
    assert {e["involvedObject"]["kind"] for e in events} == {"TrainJob"}
    delayed = next(e for e in events if e["reason"] == "AdmissionDelayed")
    assert "waiting for pods of the previous execution to go: llama-s1-node-0-0-" in delayed["message"]


async def test_the_admission_check_is_kept_active_and_written_only_on_change(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        await until(lambda: any(c["type"] == "Active" and c["status"] == "True" for c in (
            cluster.server.get("kueue.x-k8s.io", "admissionchecks", "", "dispatch") or {}
        ).get("status", {}).get("conditions", [])))
    before = len(cluster.server.requests)
    async with running(kube):
        await quiet()
    assert [w for w in writes(cluster, before) if "admissionchecks" in w[1]] == []
    check = cluster.server.get("kueue.x-k8s.io", "admissionchecks", "", "dispatch")
    assert check is not None
    [cond] = check["status"]["conditions"]
    assert cond["reason"] == "ControllerRunning" and "Pending while pods" in cond["message"]


async def test_watch_expiry_relists_and_keeps_working(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    async with running(kube):
        await adapter.open(SPEC)
        cluster.server.compact()
        cluster.server.close_watches()
        wl = kueue.workload_for(NAME)
        await until(lambda: kueue.entry(wl)["state"] == "Ready")


async def test_every_namespace_is_served_when_none_is_given(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, adapter: AsyncAdapter
) -> None:
    cluster.server.create("", "namespaces", "", {"metadata": {"name": "team-a"}})
    other = AsyncAdapter(adapter.kube.in_namespace("team-a"))
    await other.open(SPEC)
    wl = kueue.workload_for(NAME, namespace="team-a")
    async with running(kube, namespace=None):
        await until(lambda: kueue.entry(wl, namespace="team-a")["state"] == "Ready")
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "team-a", NAME)
    assert tj is not None and tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"


async def test_one_namespace_only_when_given(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, adapter: AsyncAdapter
) -> None:
    cluster.server.create("", "namespaces", "", {"metadata": {"name": "team-a"}})
    await AsyncAdapter(adapter.kube.in_namespace("team-a")).open(SPEC)
    wl = kueue.workload_for(NAME, namespace="team-a")
    async with running(kube, namespace="default"):
        await quiet()
    assert kueue.entry(wl, namespace="team-a")["state"] == "Pending"


async def test_a_submission_at_the_highest_a_keeps_the_check_pending_naming_admin_forget(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    """Kueue mode of the stall at ``ADMISSION_LIMIT`` (a floor raised to the top by a writer of the namespace):
    the check stays Pending, its message naming the way out, and nothing is raised."""
    await adapter.kube.create(SUBMISSION_FLOORS, new_floor("default", "llama", "s1", ADMISSION_LIMIT))
    await adapter.open(SPEC)
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: "dispatch admin forget llama s1 --yes" in kueue.entry(wl)["message"])
    assert kueue.entry(wl)["state"] == "Pending"
    assert kueue.entry(wl)["message"].startswith(
        f"{WAITING_PREFIX}a trustworthy identity record: llama/s1 has been issued A={ADMISSION_LIMIT}, the highest A "
        "dispatch issues: no new execution of it can be numbered")
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None and tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "0"
