"""The controller's small parts: the work queue, the probes and metrics endpoint, the entry points."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
import structlog

from dispatch import _kube as k
from dispatch._decision import Verdict, waiting_text
from dispatch._kueue import CheckEntry, WorkloadView, controller_owner
from dispatch._records import RemainingPod
from dispatch.controller import ControllerOptions, run, run_from_cli
from dispatch.controller._queue import WorkQueue
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import BASE, quiet, running, until


async def test_queue_holds_a_key_once_and_runs_a_key_readded_while_processed_once_more() -> None:
    q = WorkQueue()
    for key in ("a", "b", "a", "a"):
        q.add(key)
    assert len(q) == 2
    key = await q.get()
    assert key == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 1                    # only "b": "a" is being processed
    q.done("a")
    assert len(q) == 2                    # ... and runs once more
    assert [await q.get(), await q.get()] == ["b", "a"]


async def test_queue_backoff_doubles_and_forget_resets() -> None:
    q = WorkQueue(base_delay=0.01, max_delay=0.05)
    assert [q.backoff("k") for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    q.forget("k")
    assert q.backoff("k") == 0.01


async def test_queue_add_after_delays_and_keeps_the_earliest_timer() -> None:
    q = WorkQueue()
    q.add_after("k", 0.05)
    q.add_after("k", 10)
    assert len(q) == 0
    await asyncio.sleep(0.1)
    assert len(q) == 1
    q.close()


def test_waiting_text_is_the_seeds_exact_form() -> None:
    pods = (RemainingPod("p-0", "node-0", "Ready=True", "Running", True),
            RemainingPod("p-1", None, "", "Pending", False))
    assert waiting_text(Verdict(pods, ())) == (
        "waiting for pods of the previous execution to go: p-0 on node-0, p-1 on no node")
    long = tuple(RemainingPod(f"pod-{i:05d}", "node-0", "Ready=True", "Running", True) for i in range(2000))
    text = waiting_text(Verdict(long, ()))
    assert len(text) <= 8000 and text.endswith("... (truncated)")


def test_entry_and_owner_readers() -> None:
    wl = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "1"},
                                           {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                            "name": "t", "uid": "2", "controller": True}]},
          "status": {"admissionChecks": [{"name": "other", "state": "Ready"},
                                         {"name": "mine", "state": "Pending", "message": "waiting for x",
                                          "lastTransitionTime": "t0"}]}}
    assert WorkloadView.from_obj(wl).entry({"mine"}) == CheckEntry("mine", "Pending", "waiting for x", "t0")
    assert WorkloadView.from_obj(wl).entry({"absent"}) is None
    owner = controller_owner(wl)
    assert owner is not None and owner.is_trainjob and owner.name == "t"


async def test_probes_and_metrics_are_served(cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    async with running(kube, BASE, metrics_port=0) as ctl:
        assert ctl.http_port
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{ctl.http_port}") as http:
            assert (await http.get("/healthz")).status_code == 200
            ready = await http.get("/readyz")
            assert ready.status_code == 200 and ready.text.strip() == "ok (leader)"
            metrics = (await http.get("/metrics")).text
            for name in ("dispatch_admissions_total", "dispatch_workloads_waiting", "dispatch_leader 1.0",
                         "dispatch_last_pod_gone_to_ready_seconds_bucket", "dispatch_workload_wait_seconds"):
                assert name in metrics
            assert (await http.get("/nope")).status_code == 404
            assert (await http.post("/metrics")).status_code == 405


async def test_the_standard_controller_series_are_exported_without_created(
        cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    """controller-runtime's names: API requests by code, method and resource with latency, the work
    queues, the leader status; and no ``*_created`` series."""
    from prometheus_client import generate_latest

    async with running(kube, BASE, metrics_port=0) as ctl:
        value = ctl.metrics.registry.get_sample_value
        host = {"host": "fake.invalid"}
        await until(lambda: (value("dispatch_api_requests_total",
                                   {"code": "200", "method": "GET", "resource": "pods"}) or 0) >= 1)
        assert (value("dispatch_api_request_duration_seconds_count", {"verb": "GET", "resource": "pods"}) or 0) >= 1
        assert (value("rest_client_requests_total", {"code": "200", "method": "GET", **host}) or 0) >= 1
        assert (value("rest_client_request_duration_seconds_count", {"verb": "GET", **host}) or 0) >= 1
        assert value("leader_election_master_status", {"name": ctl.config.lease_name}) == 1
        for name in ("workloads", "pod-finalizers"):
            assert value("workqueue_depth", {"name": name, "controller": name}) is not None
        wl = {"name": "workloads", "controller": "workloads"}
        ctl.queue.add("default/w-1")                     # one key through the queue, as a worker takes it
        await until(lambda: value("workqueue_queue_duration_seconds_count", wl) == 1)
        assert value("workqueue_adds_total", wl) == 1
        await until(lambda: value("workqueue_work_duration_seconds_count", wl) == 1)
        text = generate_latest(ctl.metrics.registry).decode()
    assert "_created" not in text, [line for line in text.splitlines() if "_created" in line][:3]


async def test_readyz_fails_and_names_the_cause_until_the_lists_succeed(cluster: FakeCluster, kube: k.Kube) -> None:
    from dispatch.controller import Controller

    cluster.server.inject(path="/nodes", status=403, times=3)
    ctl = Controller(kube, BASE)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await until(lambda: "nodes" in ctl.readyz()[1] and "forbidden" in ctl.readyz()[1])
    assert ctl.readyz()[0] is False
    await until(lambda: ctl.readyz()[0], timeout=5)
    stop.set()
    await task


async def test_readyz_waits_for_the_guard_and_turns_unready_when_stopping(
        cluster: FakeCluster, kube: k.Kube, tmp_path: Any) -> None:
    """A replica gets webhook calls once ready, so ready means it can answer them: guard serving with a
    trusted certificate, caches synced; and a stopping replica leaves the Service at once."""
    from dispatch.controller import Config, Controller

    ctl = Controller(kube, Config(resync_seconds=3600, workers=2, guard_port=0, guard_host="127.0.0.1",
                                  guard_cert_dir=str(tmp_path / "certs"), guard_webhook="", metrics_port=0))
    assert ctl.readyz() == (False, "guard not started")
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await until(lambda: ctl.readyz()[0], timeout=5)
    assert ctl.readyz() == (True, "ok (leader)") and ctl.guard is not None
    stop.set()
    await task
    assert ctl.readyz() == (False, "stopping")


async def test_run_returns_when_stopped(cluster: FakeCluster, kube: k.Kube) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run(kube, BASE, stop=stop))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 5)


def test_run_from_cli_reports_a_missing_kubeconfig(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    code = run_from_cli(ControllerOptions(kubeconfig="/nonexistent/kubeconfig", metrics_port=0, leader_elect=False))
    structlog.reset_defaults()
    root.handlers, root.level = handlers, level       # run_from_cli sends the standard library's logs as JSON
    assert code == 1
    assert "does not exist" in capsys.readouterr().err


async def test_a_cluster_queue_that_lets_workloads_skip_the_check_gets_a_warning_event(
        cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, admin: k.Kube) -> None:
    """Kueue v0.19 admits a Workload given no flavor without asking any check: a queue of ours that does
    not cover `pods` is named in an Event (where `kubectl describe clusterqueue` shows it) and counted."""
    from dispatch.controller._checks import GAPS_REASON

    def gap_events() -> list[dict[str, Any]]:
        return [e for e in cluster.server.objects("", "events", "default") if e.get("reason") == GAPS_REASON]

    await admin.create(k.CLUSTER_QUEUES, {"metadata": {"name": "cq-cpu-only"}, "spec": {
        "admissionChecksStrategy": {"admissionChecks": [{"name": kueue.check}]},
        "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "8"}]}]}]}})
    await admin.create(k.CLUSTER_QUEUES, {"metadata": {"name": "cq-other-check"}, "spec": {
        "admissionChecksStrategy": {"admissionChecks": [{"name": "someone-elses"}]}}})
    async with running(kube) as ctl:
        await until(lambda: len(gap_events()) == 1, what="a Warning Event on the ClusterQueue")
        [event] = gap_events()
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "ClusterQueue" and event["involvedObject"]["name"] == "cq-cpu-only"
        assert "namespace" not in event["involvedObject"]
        assert event["message"] == (
            "ClusterQueue cq-cpu-only lets Workloads skip dispatch's admission check: a Workload that requests "
            f"none of cpu is given no flavor, and Kueue v0.19 and later admit it without asking check {kueue.check}:"
            " add `pods` to the coveredResources of a resource group")
        assert ctl.metrics.queue_gaps._value.get() == 1
        # fixed by the operator: the gauge clears and nothing more is said
        await admin.merge_patch(k.CLUSTER_QUEUES, "cq-cpu-only", {"spec": {"resourceGroups": [
            {"coveredResources": ["cpu", "pods"], "flavors": [{"name": "default", "resources": [
                {"name": "cpu", "nominalQuota": "8"}, {"name": "pods", "nominalQuota": "100"}]}]}]}})
        await until(lambda: ctl.metrics.queue_gaps._value.get() == 0, what="the gap cleared")
        await quiet()
        assert len(gap_events()) == 1


def test_the_longest_wait_is_the_first_started_and_a_wait_noted_again_keeps_its_start_and_nodes_index() -> None:
    """``Router.longest_wait`` reads the first wait only: that holds while a wait noted again keeps its start (and
    its place), whatever its nodes become."""
    from dispatch.controller._routing import Router

    router = Router(WorkQueue(), on_change=lambda: None)
    assert router.longest_wait(1e9) == 0.0
    router.note("ns/a", True, frozenset({"n1"}))
    router.note("ns/b", True, frozenset({"n2"}))
    started = router.waiting["ns/a"][0]
    router.note("ns/a", True, frozenset({"n3"}))          # a again, on another node: still waiting since it began
    assert list(router.waiting) == ["ns/a", "ns/b"] and router.waiting["ns/a"] == (started, frozenset({"n3"}))
    later = started + 1000.0
    # (later - started is 1000 up to the float rounding of the monotonic clock's value: compared as computed)
    assert router.longest_wait(later) == later - started == max(later - s for s, _ in router.waiting.values())
    assert router.node_waiters == {"n2": {"ns/b"}, "n3": {"ns/a"}}
    router.note("ns/a", False, frozenset())
    assert router.longest_wait(later) == later - router.waiting["ns/b"][0]
    assert router.node_waiters == {"n2": {"ns/b"}}
    router.note("ns/a", True, frozenset())                # a new wait: the latest
    assert list(router.waiting) == ["ns/b", "ns/a"]
    assert router.longest_wait(later) == max(later - s for s, _ in router.waiting.values())
