"""controller-runtime's series, scraped from /metrics as Prometheus scrapes them, after one reconcile that
admits a Workload and one guard review: stock controller dashboards and alerts (reconcile rate and errors,
active workers, webhook rate and latency, stuck work queues, API requests by code and host) read dispatch
as they read Kueue's or JobSet's controller."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from dispatch import AsyncAdapter
from dispatch import _api as api
from dispatch import _kube as k
from dispatch.controller import _guard as g
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import BASE, NAME, SPEC, running, until
from .test_guard_server import post, review

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: Samples, series: str, **labels: str) -> float:
    """The sum over the samples of ``series`` whose labels include ``labels``."""
    return sum(v for got, v in samples.get(series, []) if labels.items() <= got.items())


async def test_controller_runtimes_series_after_a_reconcile_and_a_guard_review(
        cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, adapter: AsyncAdapter, tmp_path: Path) -> None:
    async with running(kube, BASE, metrics_port=0, guard_port=0, guard_host="127.0.0.1",
                       guard_cert_dir=str(tmp_path / "certs"), guard_webhook="",
                       guard_hosts=("localhost", "127.0.0.1")) as ctl:
        await adapter.open(SPEC)
        wl = kueue.workload_for(NAME)
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="the admission")
        old = cluster.server.get(api.TRAINJOBS.group, "trainjobs", "default", NAME)
        assert old is not None and ctl.guard is not None
        noted = copy.deepcopy(old)
        noted["metadata"].setdefault("annotations", {})["team"] = "vision"
        [(status, _)] = await post(ctl.guard.port, tmp_path / "certs" / "ca.crt", [review(old, noted)])
        assert status == 200
        await until(lambda: (ctl.metrics.registry.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": "workloads", "result": "success"}) or 0) >= 1)
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{ctl.http_port}") as http:
            got = scrape((await http.get("/metrics")).text)

    # the reconciler's, per controller (each result series declared at 0, as controller-runtime does)
    assert value(got, "controller_runtime_reconcile_total", controller="workloads", result="success") >= 1
    assert {s["result"] for s, _ in got["controller_runtime_reconcile_total"] if s["controller"] == "workloads"} == {
        "success", "error", "requeue", "requeue_after"}
    assert [s for s, _ in got["controller_runtime_reconcile_errors_total"]] == [
        {"controller": "workloads"}, {"controller": "pod-finalizers"}]
    assert value(got, "controller_runtime_reconcile_time_seconds_count", controller="workloads") >= 1
    assert {s["controller"]: v for s, v in got["controller_runtime_active_workers"]} == {
        "workloads": 0.0, "pod-finalizers": 0.0}
    assert value(got, "controller_runtime_max_concurrent_reconciles", controller="workloads") == BASE.workers
    # the guard's, per webhook path and code
    assert value(got, "controller_runtime_webhook_requests_total", webhook=g.PATH, code="200") == 1
    assert value(got, "controller_runtime_webhook_latency_seconds_count", webhook=g.PATH) == 1
    assert value(got, "controller_runtime_webhook_requests_in_flight", webhook=g.PATH) == 0
    # the work queues, labelled by name and controller
    for name in ("workloads", "pod-finalizers"):
        for series in ("workqueue_depth", "workqueue_adds_total", "workqueue_retries_total",
                       "workqueue_unfinished_work_seconds", "workqueue_longest_running_processor_seconds"):
            assert [s for s, _ in got[series] if s["name"] == name] == [{"name": name, "controller": name}], series
    assert value(got, "workqueue_adds_total", name="workloads") >= 1
    assert value(got, "workqueue_queue_duration_seconds_count", name="workloads") >= 1
    assert value(got, "workqueue_work_duration_seconds_count", name="workloads") >= 1
    # API requests: client-go's labels, and dispatch's own by resource
    assert {tuple(sorted(s)) for s, _ in got["rest_client_requests_total"]} == {("code", "host", "method")}
    assert value(got, "rest_client_requests_total", code="200", host="fake.invalid", method="PATCH") >= 1
    assert value(got, "rest_client_request_duration_seconds_count", verb="GET", host="fake.invalid") >= 1
    assert value(got, "dispatch_api_requests_total", code="200", method="GET", resource="workloads") >= 1
    assert value(got, "dispatch_admissions_total") == 1        # dispatch's own series stay
    assert value(got, "dispatch_guard_reviews_total", answer="allowed") == 1


async def test_work_in_progress_is_reported_while_a_worker_holds_a_key() -> None:
    """``workqueue_unfinished_work_seconds`` and ``..._longest_running_processor_seconds`` rise while a key
    is held and fall to 0 once it is done: what a stuck-worker alert reads."""
    from prometheus_client import CollectorRegistry

    from dispatch.controller import Metrics
    from dispatch.controller._queue import WorkQueue

    metrics = Metrics.create(CollectorRegistry())
    q = WorkQueue()
    q.instrument(metrics.queue, "workloads")
    labels = {"name": "workloads", "controller": "workloads"}
    sample = metrics.registry.get_sample_value
    q.add("ns/a")
    q.add("ns/b")
    assert sample("workqueue_unfinished_work_seconds", labels) == 0.0
    first = await q.get()
    second = await q.get()
    held = sample("workqueue_longest_running_processor_seconds", labels)
    unfinished = sample("workqueue_unfinished_work_seconds", labels)
    assert held is not None and unfinished is not None and held > 0 and unfinished >= held
    q.done(first)
    q.done(second)
    assert sample("workqueue_unfinished_work_seconds", labels) == 0.0
    assert sample("workqueue_longest_running_processor_seconds", labels) == 0.0
