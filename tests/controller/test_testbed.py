"""The controller against the testbed's real Kueue, Trainer, JobSet and kube-apiserver.

Each test works in a namespace of its own, with a ClusterQueue of its own wired to AdmissionCheck
``dispatch`` (so quota and preemption stay inside the test on a shared testbed), and runs the controller
scoped to that namespace: as a subprocess (``python -m dispatch.controller``) where timing matters, in
process where a crash point is needed. Pods of the previous execution are kept Terminating with the
testbed's ``dispatch.test/hold-delete`` annotation, so the test decides when they go.
"""

from __future__ import annotations

# ruff: noqa: ASYNC220, ASYNC221, ASYNC230, ASYNC240  (test harness: subprocesses and files, off the hot path)
import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import ANNOTATION_ADMISSION, AsyncAdapter, JobSpec, State
from dispatch import _kube as k
from dispatch.controller import Config, Controller
from dispatch.testbed import ANN_HOLD_DELETE

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
A = "dispatch.phpboyscout.uk/admission"
LOCALQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTERQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
PRIORITIES = k.Res("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass",
                   namespaced=False)
ROLES = k.Res("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                         namespaced=False)
NS_ROLES = k.Res("rbac.authorization.k8s.io", "v1", "roles", "Role")
SERVICE_ACCOUNTS = k.Res("", "v1", "serviceaccounts", "ServiceAccount")
ACCESS_REVIEWS = k.Res("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                       namespaced=False)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def kubeconfig() -> Path:
    from dispatch import testbed

    if not testbed.is_up():
        pytest.skip("the testbed is not up (python -m dispatch.testbed up)")
    return testbed.kubeconfig_path()


@pytest.fixture
async def env(testbed_kubeconfig: str) -> AsyncIterator[tuple[k.Kube, str, str]]:
    """(admin Kube in a fresh namespace, namespace, ClusterQueue name); both removed afterwards."""
    path = kubeconfig()
    suffix = uuid.uuid4().hex[:6]
    ns, cq = f"ctl-{suffix}", f"ctl-{suffix}"
    kube = k.Kube.connect(namespace=ns, kubeconfig=path)
    await kube.create(k.NAMESPACES, {"metadata": {"name": ns}})
    # A check of our own, owned under a controllerName of our own: another dispatch controller running
    # on the shared testbed (all namespaces) must not decide this test's Workloads.
    await kube.create(k.ADMISSION_CHECKS, {"apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                                           "metadata": {"name": cq}, "spec": {"controllerName": f"{CTL}-{suffix}"}})
    await kube.create(CLUSTERQUEUES, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "default",
                     "resources": [{"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "8Gi"}]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": cq}]}}})
    await kube.create(LOCALQUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                    "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": cq}})
    for name, value in (("ctl-low", 100), ("ctl-high", 1000)):
        try:
            await kube.create(PRIORITIES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                                           "metadata": {"name": name}, "value": value})
        except Exception:
            pass
    try:
        yield kube, ns, cq
    finally:
        for tj in (await kube.list(k.TRAINJOBS)).items:
            await kube.delete(k.TRAINJOBS, tj["metadata"]["name"])
        for pod in (await kube.list(k.PODS)).items:
            await kube.merge_patch(k.PODS, pod["metadata"]["name"], {"metadata": {"annotations": {
                ANN_HOLD_DELETE: None}}})
        await kube.delete(k.NAMESPACES, ns)
        await kube.delete(CLUSTERQUEUES, cq)
        await kube.delete(k.ADMISSION_CHECKS, cq)
        await kube.aclose()


CTL = "dispatch.phpboyscout.uk/admission-test"


def controller_name(ns: str) -> str:
    """The controllerName of the test's own AdmissionCheck (named like its namespace and ClusterQueue)."""
    return f"{CTL}-{ns.split('-', 1)[1]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def subprocess_controller(ns: str, *extra: str, kubeconfig_path: Path | None = None,
                                log: Path | None = None) -> AsyncIterator[subprocess.Popen[bytes]]:
    """``python -m dispatch.controller`` for one namespace, as the Deployment runs it."""
    logfile = open(log or os.devnull, "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "dispatch.controller", "--kubeconfig", str(kubeconfig_path or kubeconfig()),
            "--namespace", ns, "--metrics-port", str(free_port()), "--controller-name", controller_name(ns), *extra]
    if "--leader-elect" not in extra:
        argv.append("--no-leader-elect")
    proc = subprocess.Popen(argv, stderr=logfile)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
        logfile.close()


async def until(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = pred()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def workload_of(kube: k.Kube, trainjob: str) -> Obj | None:
    tj = await kube.get(k.TRAINJOBS, trainjob)
    found = (await kube.list(k.WORKLOADS, labels=f"kueue.x-k8s.io/job-uid={tj['metadata']['uid']}")).items
    return found[0] if found else None


def check_of(workload: Obj | None) -> Obj:
    """The test's own check entry (named ``ctl-<suffix>``, like the namespace)."""
    ns = str(((workload or {}).get("metadata") or {}).get("namespace", ""))
    for c in ((workload or {}).get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == ns:
            return dict(c)
    return {}


def cond(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


async def pods_of(kube: k.Kube, name: str) -> list[Obj]:
    return (await kube.list(k.PODS, labels=f"jobset.sigs.k8s.io/jobset-name={name}")).items


async def hold_pods(kube: k.Kube, name: str) -> list[str]:
    """Keep the object's pods Terminating once deleted, until ``release_pods``."""
    names = []
    for pod in await pods_of(kube, name):
        await kube.merge_patch(k.PODS, pod["metadata"]["name"],
                               {"metadata": {"annotations": {ANN_HOLD_DELETE: "true"}}})
        names.append(pod["metadata"]["name"])
    return names


async def release_pods(kube: k.Kube, names: list[str]) -> None:
    for pod in names:
        try:
            await kube.merge_patch(k.PODS, pod, {"metadata": {"annotations": {ANN_HOLD_DELETE: None}}})
        except Exception:
            pass


def running_pods(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


class Recorder:
    """A test-side watch of pods and Workloads: when the last blocking pod went, when the check turned Ready."""

    def __init__(self, kube: k.Kube) -> None:
        self.kube = kube
        self.events: list[tuple[float, str, str, Obj]] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def _watch(self, res: k.Res, label: str) -> None:
        listed = await self.kube.list(res)
        rv = listed.resource_version
        while True:
            try:
                async for etype, obj in self.kube.watch(res, resource_version=rv, timeout_seconds=60):
                    rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        self.events.append((time.monotonic(), label, etype, obj))
            except Exception:
                listed = await self.kube.list(res)
                rv = listed.resource_version

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._watch(k.PODS, "pod")),
                      asyncio.create_task(self._watch(k.WORKLOADS, "workload"))]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def gone_at(self, pods: list[str], after: float) -> float | None:
        """When the last of ``pods`` stopped blocking (terminal phase or deleted), seen after ``after``."""
        last: dict[str, float] = {}
        for t, label, etype, obj in self.events:
            if label != "pod" or t < after or obj["metadata"]["name"] not in pods:
                continue
            if etype == "DELETED" or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                last.setdefault(obj["metadata"]["name"], t)
        return max(last.values()) if len(last) == len(pods) else None

    def ready_at(self, workload: str, after: float) -> float | None:
        for t, label, _, obj in self.events:
            if label == "workload" and t >= after and obj["metadata"]["name"] == workload \
                    and check_of(obj).get("state") == "Ready":
                return t
        return None


# ---------------------------------------------------------------- the scenario


async def test_preempted_trainjob_is_readmitted_only_after_its_old_pods_go(env: tuple[k.Kube, str, str]) -> None:
    kube, ns, _ = env
    adapter = AsyncAdapter(kube)
    async with subprocess_controller(ns):
        await adapter.open(JobSpec(job_id="low", submission="s1", queue="lq", priority_class="ctl-low",
                                   resources_per_node={"cpu": "3"}))
        await until(lambda: adapter.inspect("low-s1"), what="low opened")
        await until(lambda: _running(kube, "low-s1"), what="low running")
        old = await hold_pods(kube, "low-s1")
        wl = await workload_of(kube, "low-s1")
        assert wl is not None and check_of(wl)["podSetUpdates"][0]["labels"][A] == "1"
        # A higher-priority TrainJob needs the quota: Kueue preempts low (suspends it; its pod Terminating)
        await adapter.open(JobSpec(job_id="high", submission="s1", queue="lq", priority_class="ctl-high",
                                   resources_per_node={"cpu": "3"}))
        await until(lambda: _running(kube, "high-s1"), what="high running")
        pods = await pods_of(kube, "low-s1")
        assert [p["metadata"]["name"] for p in pods] == old and pods[0]["metadata"].get("deletionTimestamp")
        # high finishes (deleted): low is re-admitted by Kueue's quota, but our check holds it
        await adapter.close("high-s1")
        message = f"waiting for pods of the previous execution to go: {old[0]} on "

        async def waiting() -> bool:
            return bool(check_of(await workload_of(kube, "low-s1")).get("message", "").startswith(message))
        await until(waiting, what="waiting message naming the old pod")
        wl = await workload_of(kube, "low-s1")
        assert wl is not None and check_of(wl)["state"] == "Pending"
        assert cond(wl, "QuotaReserved") and not cond(wl, "Admitted")
        tj = await kube.get(k.TRAINJOBS, "low-s1")
        assert tj["spec"]["suspend"] is True
        status = await adapter.inspect("low-s1")
        assert status.state is State.QUEUED and old[0] in status.cause.detail
        await asyncio.sleep(2)
        assert check_of(await workload_of(kube, "low-s1"))["state"] == "Pending"
        await release_pods(kube, old)
        await until(lambda: _running(kube, "low-s1"), what="low running again")
        pods = running_pods(await pods_of(kube, "low-s1"))
        assert [p["metadata"]["labels"][A] for p in pods] == ["2"]
        tj = await kube.get(k.TRAINJOBS, "low-s1")
        assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "2"


async def _running(kube: k.Kube, name: str) -> bool:
    return bool(running_pods(await pods_of(kube, name)))


# ---------------------------------------------------------------- latency: last pod gone -> Ready


async def test_check_turns_ready_within_a_second_of_the_last_pod_going(env: tuple[k.Kube, str, str]) -> None:
    """30 re-admissions (hold/release through the Workload's active flag); p50/p99 of pod gone -> Ready."""
    kube, ns, _ = env
    adapter = AsyncAdapter(kube)
    rounds = int(os.environ.get("DISPATCH_LATENCY_ROUNDS", "30"))
    rec = Recorder(kube)
    rec.start()
    latencies: list[float] = []
    log = Path(os.environ.get("DISPATCH_CONTROLLER_LOG", os.devnull))
    try:
        async with subprocess_controller(ns, log=log):
            await adapter.open(JobSpec(job_id="lat", submission="s1", queue="lq"))
            await until(lambda: _running(kube, "lat-s1"), what="running")
            for i in range(rounds):
                held = await hold_pods(kube, "lat-s1")
                await adapter.hold("lat-s1")                 # Workload deactivated: evicted, pod Terminating
                await until(functools.partial(_terminating, kube, held), what="old pod terminating")
                await adapter.release("lat-s1")              # re-queued: the check must wait for the pod

                async def waits() -> bool:
                    return bool(check_of(await workload_of(kube, "lat-s1")).get("message", "").startswith(
                        "waiting for pods of the previous execution"))
                await until(waits, what=f"round {i}: waiting")
                mark = time.monotonic()
                await release_pods(kube, held)
                wl = await workload_of(kube, "lat-s1")
                assert wl is not None
                wl_name = str(wl["metadata"]["name"])
                await until(functools.partial(rec.ready_at, wl_name, mark), what="Ready")
                gone = rec.gone_at(held, mark)
                ready = rec.ready_at(wl["metadata"]["name"], mark)
                assert gone is not None and ready is not None and ready >= gone
                latencies.append(ready - gone)
                await until(lambda: _running(kube, "lat-s1"), what="running again")
                # no overlap: the first pod of the new execution appeared only after the old one went
                born = min(t for t, label, etype, obj in rec.events if label == "pod" and etype == "ADDED"
                           and obj["metadata"]["labels"].get(A) == str(i + 2))
                assert born > gone
                pods = running_pods(await pods_of(kube, "lat-s1"))
                assert [p["metadata"]["labels"][A] for p in pods] == [str(i + 2)]
    finally:
        await rec.stop()
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    result = {"admissions": len(latencies), "p50_ms": round(p50 * 1000, 1), "p99_ms": round(p99 * 1000, 1),
              "max_ms": round(latencies[-1] * 1000, 1)}
    print("LATENCY", json.dumps(result))
    out = os.environ.get("DISPATCH_LATENCY_OUT")
    if out:
        Path(out).write_text(json.dumps({**result, "samples_ms": [round(x * 1000, 1) for x in latencies]}))
    assert p99 <= 1.0


async def _terminating(kube: k.Kube, pods: list[str]) -> bool:
    got = {p["metadata"]["name"]: p for p in (await kube.list(k.PODS)).items}
    return all(name in got and got[name]["metadata"].get("deletionTimestamp") for name in pods)


# ---------------------------------------------------------------- crash, replicas


async def test_controller_killed_between_raising_a_and_ready_only_skips_a_number(
    env: tuple[k.Kube, str, str]
) -> None:
    kube, ns, _ = env
    adapter = AsyncAdapter(kube)
    await adapter.open(JobSpec(job_id="crash", submission="s1", queue="lq"))
    ctl = Controller(kube, Config(namespace=ns, resync_seconds=3600, controller_name=controller_name(ns)))
    ctl.reconciler.before_ready = lambda: asyncio.Event().wait()      # killed here
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))

    first: list[int] = []

    async def raised() -> bool:  # a conflict with Kueue's own first writes may already have skipped a number
        tj = await kube.get(k.TRAINJOBS, "crash-s1")
        value = int(tj["metadata"].get("annotations", {}).get(ANNOTATION_ADMISSION) or 0)
        first[:] = [value]
        return value >= 1
    await until(raised, what="A raised")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(1)
    assert check_of(await workload_of(kube, "crash-s1"))["state"] == "Pending"
    assert await pods_of(kube, "crash-s1") == []
    async with subprocess_controller(ns, log=Path(os.environ.get("DISPATCH_CONTROLLER_LOG", os.devnull))):
        try:
            await until(lambda: _running(kube, "crash-s1"), timeout=120, what="running after restart")
        except AssertionError as exc:
            wl = await workload_of(kube, "crash-s1")
            raise AssertionError(f"{exc}; workload status: {json.dumps((wl or {}).get('status'))}") from None
    pods = running_pods(await pods_of(kube, "crash-s1"))
    labels = {p["metadata"]["labels"][A] for p in pods}
    assert len(labels) == 1 and int(labels.pop()) > first[0]  # the crashed raise is skipped, never reused


async def test_two_replicas_with_leader_election_admit_once(env: tuple[k.Kube, str, str]) -> None:
    kube, ns, _ = env
    adapter = AsyncAdapter(kube)
    lease = ["--leader-elect", "--lease-namespace", ns]
    async with subprocess_controller(ns, *lease, "--identity", "one"), \
            subprocess_controller(ns, *lease, "--identity", "two"):
        for i in range(3):
            await adapter.open(JobSpec(job_id="rep", submission=f"s{i}", queue="lq", resources_per_node={"cpu": "1"}))
        for i in range(3):
            await until(lambda i=i: _running(kube, f"rep-s{i}"), what=f"rep-s{i} running")  # type: ignore[misc]
        got = await kube.get(k.LEASES, "dispatch-admission-controller")
        assert got["spec"]["holderIdentity"] in ("one", "two")
    for i in range(3):
        pods = running_pods(await pods_of(kube, f"rep-s{i}"))
        assert [p["metadata"]["labels"][A] for p in pods] == ["1"]


# ---------------------------------------------------------------- RBAC: each role exactly what it needs


def _rbac_docs() -> list[Obj]:
    return [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()) if d]


async def _can(kube: k.Kube, sa: str, ns: str, verb: str, group: str, resource: str,
               sub: str = "", name: str = "") -> bool:
    attrs: Obj = {"verb": verb, "group": group, "resource": resource, "namespace": ns}
    if sub:
        attrs["subresource"] = sub
    if name:
        attrs["name"] = name
    review = await kube.create(ACCESS_REVIEWS, {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{ns}:{sa}",
                 "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
                 "resourceAttributes": attrs}})
    return bool(review.get("status", {}).get("allowed"))


@pytest.fixture
async def rbac(env: tuple[k.Kube, str, str]) -> AsyncIterator[tuple[k.Kube, str]]:
    """deploy/base/rbac.yaml's roles, bound in the test namespace to three ServiceAccounts."""
    kube, ns, _ = env
    suffix = ns.split("-", 1)[1]
    created: list[tuple[k.Res, str]] = []
    for doc in _rbac_docs():
        kind = doc["kind"]
        if kind == "ClusterRole":
            try:
                await kube.replace(ROLES, doc["metadata"]["name"], {**doc, "metadata": {
                    **doc["metadata"], "resourceVersion": (await kube.get(ROLES, doc["metadata"]["name"]))[
                        "metadata"]["resourceVersion"]}})
            except Exception:
                await kube.create(ROLES, doc)
        elif kind == "Role":
            await kube.create(NS_ROLES, {**doc, "metadata": {**doc["metadata"], "namespace": ns}})
    for sa in ("reader", "writer", "controller"):
        await kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": sa}})
    for sa in ("reader", "writer"):
        await kube.create(BINDINGS, {"metadata": {"name": sa}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"dispatch-{sa}"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    await kube.create(BINDINGS, {"metadata": {"name": "controller-lease"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dispatch-controller-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": "controller", "namespace": ns}]})
    for role, sa in (("dispatch-controller", "controller"), ("dispatch-node-reader", "reader"),
                     ("dispatch-node-reader", "writer")):
        name = f"ctl-{suffix}-{sa}-{role}"
        await kube.create(CLUSTER_BINDINGS, {"metadata": {"name": name}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
        created.append((CLUSTER_BINDINGS, name))
    try:
        yield kube, ns
    finally:
        for res, name in created:
            await kube.delete(res, name)


# (role, verb, group, resource, subresource, expected)
MATRIX: list[tuple[str, str, str, str, str, bool]] = [
    ("reader", "get", "trainer.kubeflow.org", "trainjobs", "", True),
    ("reader", "list", "", "pods", "", True),
    ("reader", "get", "", "pods", "log", True),
    ("reader", "list", "", "nodes", "", True),
    ("reader", "list", "kueue.x-k8s.io", "workloads", "", True),
    ("reader", "create", "trainer.kubeflow.org", "trainjobs", "", False),
    ("reader", "patch", "trainer.kubeflow.org", "trainjobs", "", False),
    ("reader", "patch", "kueue.x-k8s.io", "workloads", "", False),
    ("reader", "delete", "", "pods", "", False),
    ("reader", "list", "", "secrets", "", False),
    ("writer", "create", "trainer.kubeflow.org", "trainjobs", "", True),
    ("writer", "patch", "trainer.kubeflow.org", "trainjobs", "", True),
    ("writer", "delete", "trainer.kubeflow.org", "trainjobs", "", True),
    ("writer", "get", "trainer.kubeflow.org", "clustertrainingruntimes", "", True),
    ("writer", "patch", "kueue.x-k8s.io", "workloads", "", True),
    ("writer", "patch", "kueue.x-k8s.io", "workloads", "status", False),
    ("writer", "delete", "", "pods", "", False),
    ("writer", "update", "trainer.kubeflow.org", "trainjobs", "", False),
    ("writer", "list", "", "secrets", "", False),
    ("controller", "watch", "kueue.x-k8s.io", "workloads", "", True),
    ("controller", "patch", "kueue.x-k8s.io", "workloads", "status", True),
    ("controller", "patch", "kueue.x-k8s.io", "workloads", "", False),
    ("controller", "patch", "kueue.x-k8s.io", "admissionchecks", "status", True),
    ("controller", "patch", "kueue.x-k8s.io", "admissionchecks", "", False),
    ("controller", "patch", "trainer.kubeflow.org", "trainjobs", "", True),
    ("controller", "create", "trainer.kubeflow.org", "trainjobs", "", False),
    ("controller", "delete", "trainer.kubeflow.org", "trainjobs", "", False),
    ("controller", "watch", "", "pods", "", True),
    ("controller", "watch", "batch", "jobs", "", True),
    ("controller", "delete", "batch", "jobs", "", False),
    ("controller", "watch", "jobset.x-k8s.io", "jobsets", "", True),
    ("controller", "patch", "jobset.x-k8s.io", "jobsets", "", False),
    ("controller", "delete", "", "pods", "", False),
    ("controller", "get", "", "pods", "log", False),
    ("controller", "watch", "", "nodes", "", True),
    ("controller", "patch", "", "nodes", "", False),
    ("controller", "create", "", "events", "", True),
    ("controller", "create", "coordination.k8s.io", "leases", "", True),
    ("controller", "list", "", "secrets", "", False),
    ("reader", "create", "", "configmaps", "", False),
    ("writer", "create", "", "configmaps", "", True),
    ("writer", "delete", "", "configmaps", "", False),
    ("controller", "create", "", "configmaps", "", True),
    ("controller", "delete", "", "configmaps", "", False),
]


async def test_each_role_can_do_exactly_what_it_needs(rbac: tuple[k.Kube, str]) -> None:
    kube, ns = rbac
    wrong = []
    for sa, verb, group, resource, sub, expected in MATRIX:
        if await _can(kube, sa, ns, verb, group, resource, sub) != expected:
            wrong.append((sa, verb, group, resource, sub, expected))
    assert wrong == []
    assert await _can(kube, "controller", ns, "update", "coordination.k8s.io", "leases",
                      name="dispatch-admission-controller")
    assert not await _can(kube, "controller", ns, "update", "coordination.k8s.io", "leases", name="other")
    for sa in ("writer", "controller"):  # the admission ledger, and no other ConfigMap
        assert await _can(kube, sa, ns, "patch", "", "configmaps", name="dispatch-admissions")
        assert not await _can(kube, sa, ns, "patch", "", "configmaps", name="other")
        assert not await _can(kube, sa, ns, "get", "", "configmaps", name="other")
    for doc in _rbac_docs():
        for rule in doc.get("rules", []):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]


async def test_the_controller_runs_with_only_its_service_accounts_token(
    rbac: tuple[k.Kube, str], tmp_path: Path
) -> None:
    """Impersonation for real: the controller's own ServiceAccount token, its roles and nothing else."""
    kube, ns = rbac
    token = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig()), "-n", ns, "create", "token", "controller"],
        check=True, capture_output=True, text=True).stdout.strip()
    admin = yaml.safe_load(kubeconfig().read_text())
    cluster = admin["clusters"][0]
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
              "users": [{"name": "sa", "user": {"token": token}}],
              "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa", "namespace": ns}}],
              "current-context": "sa"}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "controller.log"
    adapter = AsyncAdapter(kube)
    await adapter.open(JobSpec(job_id="rbac", submission="s1", queue="lq"))
    async with subprocess_controller(ns, "--leader-elect", "--lease-namespace", ns, kubeconfig_path=path, log=log):
        await until(lambda: _running(kube, "rbac-s1"), what="admitted by the least-privilege controller")
    text = log.read_text()
    assert "forbidden" not in text.lower(), text[-2000:]
    events = [e for e in (await kube.list(k.EVENTS)).items if e.get("reason") == "AdmissionProceeds"]
    assert events


def _kubectl() -> str:
    from dispatch import testbed

    return str(Path(testbed.env()["PATH"].split(os.pathsep)[0]) / "kubectl")



# ---------------------------------------------------------------- a lost node


@pytest.mark.skipif(os.environ.get("DISPATCH_TESTBED_EXCLUSIVE") != "1",
                    reason="freezes and taints node-2 out-of-service, which force-deletes every pod on it: "
                           "run only on a testbed no one else is using (DISPATCH_TESTBED_EXCLUSIVE=1)")
async def test_a_frozen_node_holds_the_check_until_the_out_of_service_taint(env: tuple[k.Kube, str, str]) -> None:
    from dispatch import testbed

    kube, ns, _ = env
    node = "node-2"
    runtime = await kube.get(k.CLUSTER_RUNTIMES, "torch-distributed")
    spec = runtime["spec"]
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        pod_spec = rj["template"]["spec"]["template"].setdefault("spec", {})
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    await kube.create(k.RUNTIMES, {"apiVersion": k.RUNTIMES.api_version, "kind": "TrainingRuntime",
                                   "metadata": {"name": "pinned", "labels": runtime["metadata"].get("labels", {})},
                                   "spec": spec})
    adapter = AsyncAdapter(kube)
    taint = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    try:
        async with subprocess_controller(ns):
            await adapter.open(JobSpec(job_id="frozen", submission="s1", queue="lq", runtime="pinned",
                                       runtime_kind="TrainingRuntime"))
            await until(lambda: _running(kube, "frozen-s1"), what="running on the freezable node")
            [old] = [p["metadata"]["name"] for p in await pods_of(kube, "frozen-s1")]
            testbed.freeze(node)
            await adapter.hold("frozen-s1")
            await until(functools.partial(_terminating, kube, [old]), what="pod Terminating on the frozen node")
            await adapter.release("frozen-s1")

            async def waiting() -> bool:
                msg = check_of(await workload_of(kube, "frozen-s1")).get("message", "")
                return bool(msg == f"waiting for pods of the previous execution to go: {old} on {node}")
            await until(waiting, what="waiting for the pod on the frozen node")
            await asyncio.sleep(15)              # the node goes Ready=Unknown; nothing proves the process gone
            assert check_of(await workload_of(kube, "frozen-s1"))["state"] == "Pending"
            testbed.kubectl("taint", "nodes", node, taint)

            async def ready() -> bool:
                return bool(check_of(await workload_of(kube, "frozen-s1")).get("state") == "Ready")
            await until(ready, timeout=120, what="Ready once the operator tainted the node out-of-service")
            tj = await kube.get(k.TRAINJOBS, "frozen-s1")
            assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "2"
    finally:
        testbed.kubectl("taint", "nodes", node, f"{taint}-", check=False)
        testbed.thaw(node)
