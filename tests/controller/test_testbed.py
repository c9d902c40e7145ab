"""The controller against the testbed's real Kueue, Trainer, JobSet and kube-apiserver.

Each test works in a namespace of its own, with a ClusterQueue of its own wired to AdmissionCheck
``dispatch`` (so quota and preemption stay inside the test on a shared testbed), and runs the controller
scoped to that namespace: as a subprocess (``python -m dispatch.controller``) where timing matters, in
process where a crash point is needed. Pods of the previous execution are kept Terminating with the
testbed's ``dispatch.test/hold-delete`` annotation, so the test decides when they go.
"""

from __future__ import annotations

# ruff: noqa: ASYNC221  (test harness: subprocesses and files, off the hot path)
import asyncio
import contextlib
import functools
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import ANNOTATION_ADMISSION, ENROL_LABEL, AsyncAdapter, JobSpec, State
from dispatch import _kube as k
from dispatch.controller import Config, Controller
from dispatch.testbed.harness import (
    LAUNCHERS,
    A,
    Launcher,
    all_terminating,
    apply_shipped_roles,
    as_role,
    check_of,
    cond,
    container_controller,
    controller_env,
    controller_name,
    hold_pods,
    is_running,
    pods_of,
    readmission_latencies,
    release_pods,
    running_pods,
    running_testbed_kubeconfig,
    scrape,
    shipped_rbac,
    subprocess_controller,
    until,
    workload_of,
)

from .test_guard_testbed import held_with_terminating_pod as guard_held
from .test_guard_testbed import installed as guard_installed
from .test_guard_testbed import unsuspend as guard_unsuspend

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                         namespaced=False)
NS_ROLES = k.Res("rbac.authorization.k8s.io", "v1", "roles", "Role")
SERVICE_ACCOUNTS = k.Res("", "v1", "serviceaccounts", "ServiceAccount")
ACCESS_REVIEWS = k.Res("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview",
                       namespaced=False)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def kubeconfig() -> Path:
    path = running_testbed_kubeconfig()
    if path is None:
        pytest.skip("the testbed is not up (python -m dispatch.testbed up)")
    return path


@pytest.fixture(params=["process", "container"])
def launch(request: pytest.FixtureRequest) -> Launcher:
    """How the controller is started: ``python -m dispatch.controller`` with the admin kubeconfig, or its
    image with only the shipped ServiceAccount's token and roles (skipped when podman is absent)."""
    if request.param == "container":
        request.getfixturevalue("shipped")
    return LAUNCHERS[str(request.param)]


@pytest.fixture
async def env(testbed_kubeconfig: str) -> AsyncIterator[tuple[k.Kube, str, str]]:
    """(admin Kube in a fresh namespace, namespace, ClusterQueue name); both removed afterwards."""
    async with controller_env(kubeconfig()) as got:
        yield got


# ---------------------------------------------------------------- the issue's scenario


async def test_preempted_trainjob_is_readmitted_only_after_its_old_pods_go(
    env: tuple[k.Kube, str, str], launch: Launcher
) -> None:
    kube, ns, _ = env
    async with as_role(kube, ns) as writer, launch(ns):
        adapter = AsyncAdapter(writer)
        await adapter.open(JobSpec(job_id="low", submission="s1", queue="lq", priority_class="ctl-low",
                                   resources_per_node={"cpu": "3"}))
        await until(lambda: adapter.inspect("low-s1"), what="low opened")
        await until(lambda: is_running(kube, "low-s1"), what="low running")
        old = await hold_pods(kube, "low-s1")
        wl = await workload_of(kube, "low-s1")
        assert wl is not None and check_of(wl)["podSetUpdates"][0]["labels"][A] == "1"
        # A higher-priority TrainJob needs the quota: Kueue preempts low (suspends it; its pod Terminating)
        await adapter.open(JobSpec(job_id="high", submission="s1", queue="lq", priority_class="ctl-high",
                                   resources_per_node={"cpu": "3"}))
        await until(lambda: is_running(kube, "high-s1"), what="high running")
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
        await until(lambda: is_running(kube, "low-s1"), what="low running again")
        pods = running_pods(await pods_of(kube, "low-s1"))
        assert [p["metadata"]["labels"][A] for p in pods] == ["2"]
        tj = await kube.get(k.TRAINJOBS, "low-s1")
        assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "2"


async def test_readmissions_wait_for_the_last_pod_and_never_overlap(env: tuple[k.Kube, str, str]) -> None:
    """Hold/release re-admissions through the real Kueue: each waits for the old pod, raises A by one,
    and its first pod appears only after the old one went. (Timing is reported by
    ``bench/controller_latency_bench.py``, never asserted here.)"""
    kube, ns, _ = env
    rounds = int(os.environ.get("DISPATCH_LATENCY_ROUNDS", "5"))
    latencies = await readmission_latencies(kube, ns, rounds)
    assert len(latencies) == rounds and all(x >= 0 for x in latencies)


# ---------------------------------------------------------------- crash, replicas


@pytest.fixture
async def controller_kube(env: tuple[k.Kube, str, str]) -> AsyncIterator[k.Kube]:
    """A Kube of ``env``'s namespace holding exactly the shipped controller role, for an in-process controller."""
    kube, ns, _ = env
    async with as_role(kube, ns, "dispatch-controller") as got:
        yield got


async def test_controller_killed_between_raising_a_and_ready_never_reuses_a_number(
    env: tuple[k.Kube, str, str], controller_kube: k.Kube
) -> None:
    kube, ns, _ = env
    async with as_role(kube, ns) as writer:
        await AsyncAdapter(writer).open(JobSpec(job_id="crash", submission="s1", queue="lq"))
    ctl = Controller(controller_kube, Config(namespace=ns, resync_seconds=3600, controller_name=controller_name(ns)))
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
            await until(lambda: is_running(kube, "crash-s1"), timeout=120, what="running after restart")
        except AssertionError as exc:
            wl = await workload_of(kube, "crash-s1")
            raise AssertionError(f"{exc}; workload status: {json.dumps((wl or {}).get('status'))}") from None
    pods = running_pods(await pods_of(kube, "crash-s1"))
    labels = {p["metadata"]["labels"][A] for p in pods}
    tj = await kube.get(k.TRAINJOBS, "crash-s1")
    # the restarted controller finds the raise by its token and reuses that A if nothing changed the TrainJob
    # since (seen on this control plane), else skips it; never reuses an A that may have run. The pods carry
    # exactly the A the TrainJob reports.
    assert len(labels) == 1 and int(next(iter(labels))) >= first[0]
    assert labels == {tj["metadata"]["annotations"][ANNOTATION_ADMISSION]}


async def test_two_replicas_with_leader_election_admit_once(env: tuple[k.Kube, str, str]) -> None:
    kube, ns, _ = env
    lease = ["--leader-elect", "--lease-namespace", ns]
    async with as_role(kube, ns) as writer, subprocess_controller(ns, *lease, "--identity", "one"), \
            subprocess_controller(ns, *lease, "--identity", "two"):
        adapter = AsyncAdapter(writer)
        for i in range(3):
            await adapter.open(JobSpec(job_id="rep", submission=f"s{i}", queue="lq", resources_per_node={"cpu": "1"}))
        for i in range(3):
            await until(lambda i=i: is_running(kube, f"rep-s{i}"), what=f"rep-s{i} running")  # type: ignore[misc]
        got = await kube.get(k.LEASES, "dispatch-admission-controller")
        assert got["spec"]["holderIdentity"] in ("one", "two")
    for i in range(3):
        pods = running_pods(await pods_of(kube, f"rep-s{i}"))
        assert [p["metadata"]["labels"][A] for p in pods] == ["1"]


@pytest.mark.parametrize("started", ["in-process", "container"])
async def test_a_batch_of_queued_workloads_is_decided_from_shared_reads_on_the_real_kueue(
    env: tuple[k.Kube, str, str], started: str, request: pytest.FixtureRequest,
) -> None:
    """Twelve Workloads pending at once, each with a pod that may still run: the controller decides them
    in batches (set-based selectors and Kueue's pod-set labels on the real API server), names each one's
    pod, and admits each with A=1 once its pod goes. In process, or from its image under the shipped
    roles (where a missing verb, such as listing TrainJobs, stalls every batch)."""
    if started == "container":
        request.getfixturevalue("shipped")
    kube, ns, cq = env
    # Active before any controller runs (as the controller would write it), so Kueue reserves quota for
    # all twelve first and the controller finds them queued together.
    await kube.apply(k.ADMISSION_CHECKS, cq, {
        "apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck", "metadata": {"name": cq},
        "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Test", "message": "test",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}},
        sub="status", field_manager="dispatch-test")
    names = [f"many-s{i}" for i in range(12)]
    async with as_role(kube, ns) as writer:
        adapter = AsyncAdapter(writer)
        for i, name in enumerate(names):
            await adapter.open(JobSpec(job_id="many", submission=f"s{i}", queue="lq",
                                       resources_per_node={"cpu": "10m"}))
            await kube.create(k.PODS, {  # a pod of an earlier execution that may still run
                "metadata": {"name": f"left-{i}", "labels": {"jobset.sigs.k8s.io/jobset-name": name}},
                "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "example.invalid/x"}]}})

    async def all_reserved() -> bool:
        wls = (await kube.list(k.WORKLOADS)).items
        return len(wls) == len(names) and all(cond(w, "QuotaReserved") for w in wls)
    await until(all_reserved, timeout=120, what="quota reserved for every Workload")
    async with contextlib.AsyncExitStack() as stack:
        if started == "container":
            launched = await stack.enter_async_context(container_controller(ns, "--batch", "64",
                                                                            "--resync-seconds", "3600"))

            async def sample(name: str) -> float:
                return await scrape(launched.port, name)
        else:
            controller_kube = await stack.enter_async_context(as_role(kube, ns, "dispatch-controller"))
            ctl = Controller(controller_kube, Config(namespace=ns, resync_seconds=3600,
                                                     controller_name=controller_name(ns), batch=64))
            stop = asyncio.Event()
            task = asyncio.create_task(ctl.run(stop))

            async def halt() -> None:
                stop.set()
                await asyncio.wait_for(task, 15)
            stack.push_async_callback(halt)

            async def sample(name: str) -> float:
                return ctl.metrics.registry.get_sample_value(name) or 0.0

        async def all_waiting() -> bool:
            for i, name in enumerate(names):
                message = check_of(await workload_of(kube, name)).get("message", "")
                if message != f"waiting for pods of the previous execution to go: left-{i} on node-0":
                    return False
            return True
        await until(all_waiting, timeout=60, what="every check Pending naming its own pod")
        decided = await sample("dispatch_batch_size_sum")
        reads = await sample("dispatch_batch_size_count")
        assert decided > reads, (decided, reads)  # fewer shared reads than Workloads: batches held several
        for i in range(len(names)):
            await kube.delete(k.PODS, f"left-{i}", grace_seconds=0)
        for name in names:
            await until(functools.partial(is_running, kube, name), timeout=120, what=f"{name} running")
    for name in names:
        pods = running_pods(await pods_of(kube, name))
        assert [p["metadata"]["labels"][A] for p in pods] == ["1"], name


# ---------------------------------------------------------------- RBAC: each role exactly what it needs


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
    await asyncio.to_thread(apply_shipped_roles)
    for doc in shipped_rbac():
        if doc["kind"] == "Role":
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
    ("writer", "patch", "", "pods", "", False),  # freeing dispatch's pod finalizer is the controller's (issue 25)
    ("reader", "patch", "", "pods", "", False),
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
    ("controller", "delete", "", "pods", "", True),  # a pod its kubelet rejected, so the kubelet confirms its end
    ("controller", "get", "", "pods", "", True),  # the finalizer keeper reads each pod afresh
    ("controller", "patch", "", "pods", "", True),  # and removes dispatch's pod finalizer
    ("controller", "get", "", "pods", "log", False),
    ("controller", "watch", "", "nodes", "", True),
    ("controller", "patch", "", "nodes", "", False),
    ("controller", "create", "", "events", "", True),
    ("writer", "create", "", "events", "", True),  # plain mode's Events on the TrainJob
    ("writer", "patch", "", "events", "", False),
    ("writer", "delete", "", "events", "", False),
    ("reader", "create", "", "events", "", False),
    ("controller", "create", "coordination.k8s.io", "leases", "", True),
    ("controller", "list", "", "secrets", "", False),
    ("reader", "create", "", "configmaps", "", False),
    ("writer", "create", "", "configmaps", "", False),
    ("writer", "delete", "", "configmaps", "", False),
    ("controller", "create", "", "configmaps", "", False),
    ("controller", "delete", "", "configmaps", "", False),
    ("controller", "create", "authentication.k8s.io", "tokenreviews", "", True),
    ("controller", "create", "authorization.k8s.io", "subjectaccessreviews", "", True),
    ("reader", "create", "authentication.k8s.io", "tokenreviews", "", False),
    ("writer", "create", "authorization.k8s.io", "subjectaccessreviews", "", False),
    # identity records: created and raised by writers and the controller, deleted by nobody of theirs
    ("reader", "get", "dispatch.phpboyscout.uk", "submissionrecords", "", True),
    ("reader", "patch", "dispatch.phpboyscout.uk", "submissionrecords", "", False),
    ("writer", "create", "dispatch.phpboyscout.uk", "submissionrecords", "", True),
    ("writer", "patch", "dispatch.phpboyscout.uk", "submissionrecords", "", True),
    ("writer", "delete", "dispatch.phpboyscout.uk", "submissionrecords", "", False),
    ("controller", "create", "dispatch.phpboyscout.uk", "submissionrecords", "", True),
    ("controller", "patch", "dispatch.phpboyscout.uk", "submissionrecords", "", True),
    ("controller", "delete", "dispatch.phpboyscout.uk", "submissionrecords", "", False),
    ("controller", "list", "trainer.kubeflow.org", "trainjobs", "", True),
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
    for sa in ("writer", "controller"):  # the old ledger may be read (never written), and no other ConfigMap
        assert await _can(kube, sa, ns, "get", "", "configmaps", name="dispatch-admissions")
        assert not await _can(kube, sa, ns, "patch", "", "configmaps", name="dispatch-admissions")
        assert not await _can(kube, sa, ns, "get", "", "configmaps", name="other")
    for doc in shipped_rbac():
        for rule in doc.get("rules", []):
            for field in ("verbs", "resources", "apiGroups", "nonResourceURLs"):  # the metrics reader: URLs only
                assert "*" not in rule.get(field, []), (doc["metadata"]["name"], rule)


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
    async with as_role(kube, ns) as writer:
        await AsyncAdapter(writer).open(JobSpec(job_id="rbac", submission="s1", queue="lq"))
    async with subprocess_controller(ns, "--leader-elect", "--lease-namespace", ns, kubeconfig_path=path, log=log):
        await until(lambda: is_running(kube, "rbac-s1"), what="admitted by the least-privilege controller")
    text = log.read_text()
    assert "forbidden" not in text.lower(), text[-2000:]
    events = [e for e in (await kube.list(k.EVENTS)).items if e.get("reason") == "AdmissionProceeds"]
    assert events


async def test_identity_records_are_in_the_built_in_view_and_edit_roles_read_only(rbac: tuple[k.Kube, str]) -> None:
    """dispatch-records-view aggregates into view (and through it edit and admin): who views a namespace
    reads its records; nobody gains a write on them that way (a deleted record lets an A be reused)."""
    kube, ns = rbac
    records = ("dispatch.phpboyscout.uk", "submissionrecords")
    for role in ("view", "edit", "admin"):
        sa = f"builtin-{role}"
        await kube.create(SERVICE_ACCOUNTS, {"metadata": {"name": sa}})
        await kube.create(BINDINGS, {"metadata": {"name": sa}, "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})

        async def reads(sa: str = sa) -> bool:     # the aggregation controller fills the role within moments
            return all([await _can(kube, sa, ns, verb, *records) for verb in ("get", "list", "watch")])
        await until(reads, timeout=30, what=f"{role} reading identity records")
        for verb in ("create", "patch", "update", "delete", "deletecollection"):
            assert not await _can(kube, sa, ns, verb, *records), (role, verb)


async def test_the_guard_reads_with_only_the_controllers_service_account(
        rbac: tuple[k.Kube, str], tmp_path: Path) -> None:
    """The controller's own token (deploy/base/rbac.yaml): the guard's consistent read and enrolment's
    runtime read need nothing more, and its caBundle writes are allowed on its own webhook configurations
    only."""
    kube, ns = rbac
    for plural in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        wh = ("admissionregistration.k8s.io", plural)
        assert await _can(kube, "controller", ns, "get", *wh, name="dispatch-guard")
        assert await _can(kube, "controller", ns, "patch", *wh, name="dispatch-guard")
        assert not await _can(kube, "controller", ns, "patch", *wh, name="other")
        assert not await _can(kube, "controller", ns, "list", *wh)
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
    async with guard_installed(kube, ns, tmp_path, kubeconfig_path=path, publish=False, enrolment=True) as got:
        name, pods = await guard_held(got, "sa")
        denied = guard_unsuspend(ns, name)
        assert denied.returncode != 0 and f"cannot start: remaining pods: {pods[0]} on " in denied.stderr
        # enrolment, served with the same token: the runtime it names is read, the create is enrolled
        await kube.merge_patch(k.NAMESPACES, ns, {"metadata": {"labels": {ENROL_LABEL: "true"}}})
        await kube.create(k.TRAINJOBS, {"apiVersion": k.TRAINJOBS.api_version, "kind": "TrainJob",
                                        "metadata": {"name": "sdk-made"},
                                        "spec": {"runtimeRef": {"name": "torch-distributed"}}})
        made = await got.adapter.inspect("sdk-made")
        assert made.managed and made.state is State.HELD and made.identity is not None
        assert made.identity.job_id == "sdk-made"
    text = (tmp_path / "controller.log").read_text()
    assert "forbidden" not in text.lower(), text[-2000:]


def _kubectl() -> str:
    from dispatch import testbed

    return str(Path(testbed.env()["PATH"].split(os.pathsep)[0]) / "kubectl")



# ---------------------------------------------------------------- a lost node


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
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
    taint = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    try:
        async with as_role(kube, ns) as writer, subprocess_controller(ns):
            adapter = AsyncAdapter(writer)
            await adapter.open(JobSpec(job_id="frozen", submission="s1", queue="lq", runtime="pinned",
                                       runtime_kind="TrainingRuntime"))
            await until(lambda: is_running(kube, "frozen-s1"), what="running on the freezable node")
            [old] = [p["metadata"]["name"] for p in await pods_of(kube, "frozen-s1")]
            testbed.freeze(node)
            await adapter.hold("frozen-s1")
            await until(functools.partial(all_terminating, kube, [old]), what="pod Terminating on the frozen node")
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
