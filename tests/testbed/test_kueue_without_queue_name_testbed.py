"""Kueue managing a dispatch TrainJob that has no queue-name label, on the real control plane (issue 11,
finding 1): Kueue restarted with ``manageJobsWithoutQueueName: true``, limited by
``managedJobsNamespaceSelector`` to one labelled namespace (whose LocalQueue ``default`` Kueue gives to
jobs without a queue name), so the rest of the testbed is unaffected. dispatch must take its mode from
the Workload that owns the TrainJob, not from the label: its release never unsuspends the TrainJob
behind Kueue's back, and the admission check admits it with A=1 on every pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_ADMISSION, Adapter, JobSpec
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.controller import Config, Controller
from dispatch.testbed.harness import role_kubeconfig_file

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(os.environ.get("DISPATCH_TESTBED_EXCLUSIVE") != "1",
                       reason="restarts the testbed's Kueue with another configuration: run only on a testbed no "
                              "one else is using (DISPATCH_TESTBED_EXCLUSIVE=1)"),
]
Obj = dict[str, Any]
MANAGED = "dispatch.test/kueue-manages-unlabelled"


def get(*args: str) -> Obj:
    out: Obj = json.loads(tb.kubectl("get", *args, "-o", "json").stdout)
    return out


def wait_for(what: str, pred: Callable[[], object], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def kueue_manages_unlabelled(testbed_kubeconfig: str) -> Iterator[None]:
    tb.reconfigure_kueue({"manageJobsWithoutQueueName": True,
                          "managedJobsNamespaceSelector": {"matchLabels": {MANAGED: "true"}}})
    try:
        yield
    finally:
        tb.reconfigure_kueue()


@pytest.fixture(params=["default-queue", "no-default-queue"])
def ns(request: pytest.FixtureRequest, kueue_manages_unlabelled: None) -> Iterator[str]:
    name = f"kwq-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", name)
    tb.kubectl("label", "namespace", name, f"{MANAGED}=true")
    if request.param == "default-queue":
        tb.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "default", "namespace": name}, "spec": {"clusterQueue": "cq-dispatch"}}))
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def adapter(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a user bound to the shipped dispatch-writer role in ``ns`` (and the node reader)."""
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


class RunningController:
    """dispatch's controller for one namespace in a thread, for the length of a ``with``, holding the shipped
    controller role."""

    def __init__(self, namespace: str) -> None:
        self.namespace, self.kubeconfig = namespace, ""
        self.roles = contextlib.ExitStack()
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(self._run()), daemon=True)

    async def _run(self) -> None:
        kube = k.Kube.connect(kubeconfig=self.kubeconfig)
        try:
            await Controller(kube, Config(namespace=self.namespace, events=False, resync_seconds=5)).run(self.stop)
        finally:
            await kube.aclose()

    def __enter__(self) -> RunningController:
        # exactly the shipped controller role, bound as deploy/ binds it
        directory = self.roles.enter_context(tempfile.TemporaryDirectory())
        self.kubeconfig = str(self.roles.enter_context(
            role_kubeconfig_file(self.namespace, Path(directory), "dispatch-controller")))
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)
        self.roles.close()


def workloads_of(ns: str, uid: str) -> list[Obj]:
    items: list[Obj] = get("workloads.kueue.x-k8s.io", "-n", ns, "-l", f"kueue.x-k8s.io/job-uid={uid}")["items"]
    return items


def has_default_queue(ns: str) -> bool:
    return tb.kubectl("get", "localqueue", "default", "-n", ns, check=False).returncode == 0


def test_kueue_manages_an_unlabelled_trainjob_and_dispatch_admits_it_only_through_its_workload(
        adapter: Adapter, ns: str, testbed_kubeconfig: str) -> None:
    """dispatch opens the TrainJob without a queue. With a LocalQueue ``default`` in the namespace, Kueue's
    webhook gives the TrainJob that queue's label at creation (seen on Kueue v0.17 and v0.19); without one the
    TrainJob stays unlabelled and Kueue still makes its Workload. Either way dispatch follows the Workload."""
    name = f"nolabel-{uuid.uuid4().hex[:4]}"
    adapter.open(JobSpec(job_id=name, submission="s1", name=name, num_nodes=1))
    tj = get("trainjob", name, "-n", ns)
    label = tj["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name")
    print("queue-name label after open:", label)
    assert label == ("default" if has_default_queue(ns) else None)
    uid = tj["metadata"]["uid"]
    wait_for("Kueue's Workload for the TrainJob dispatch opened without a queue", lambda: workloads_of(ns, uid))
    [wl] = workloads_of(ns, uid)
    print("workload:", wl["metadata"]["name"], "queueName:", wl["spec"].get("queueName"))
    assert adapter.inspect(name).mode == "kueue"

    adapter.release(name)                                # through Kueue: the Workload, never suspend=false
    time.sleep(2)
    tj = get("trainjob", name, "-n", ns)
    assert tj["spec"]["suspend"] is True, "dispatch unsuspended a TrainJob that Kueue manages"
    assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "0"
    if not has_default_queue(ns):
        print("status without a queue:", adapter.inspect(name).cause)
        return

    with RunningController(ns):
        wait_for("the check Ready and Kueue starting the TrainJob",
                 lambda: get("trainjob", name, "-n", ns)["spec"]["suspend"] is False, timeout=90)
        wait_for("its pod", lambda: [p for p in get("pods", "-n", ns)["items"]
                                     if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name],
                 timeout=90)
    pods = [p for p in get("pods", "-n", ns)["items"]
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name]
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in pods} == {"1"}
    assert get("trainjob", name, "-n", ns)["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"
    [wl] = workloads_of(ns, uid)
    entry = next(c for c in wl["status"]["admissionChecks"] if c["name"] == "dispatch")
    print("check:", entry["state"], entry.get("message"))
    assert entry["state"] == "Ready"

    adapter.hold(name)                                   # Kueue mode: deactivates the Workload
    wait_for("Kueue suspending it", lambda: get("trainjob", name, "-n", ns)["spec"]["suspend"] is True)
    assert workloads_of(ns, uid)[0]["spec"]["active"] is False
