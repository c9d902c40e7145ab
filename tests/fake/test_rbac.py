"""The fake enforces the shipped roles: every call the library and the controller make is allowed for the
role that makes it, what a role must not do is denied with the real API server's 403, and a test that
forgets a verb in ``deploy/base/rbac.yaml`` fails here instead of on a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import yaml

from dispatch import ANNOTATION_ADMISSION, Adapter, AsyncAdapter, Forbidden, JobSpec, NotFound, State
from dispatch import _kube as k
from dispatch._identity import new_record
from dispatch.controller import Config, Controller
from dispatch.controller.testing import FakeKueue
from dispatch.testing import Binding, FakeApiServer, FakeCluster, Kind, Policy, RbacError
from dispatch.testing._rbac import SHIPPED_RBAC, request_attributes

Obj = dict[str, Any]
CONTROLLER = "system:serviceaccount:dispatch-system:dispatch-controller"
WRITER_ROLES = (Binding("dispatch-writer", "default"), "dispatch-node-reader")
READER_ROLES = (Binding("dispatch-reader", "default"), "dispatch-node-reader")


# ---------------------------------------------------------------- requests become the real attributes


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "", "pods", "", "ns", "")),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "", "pods", "", "ns", "")),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "1"}, ("watch", "", "pods", "", "ns", "")),
        ("GET", "/api/v1/namespaces/ns/pods", {"fieldSelector": "metadata.name=p"},
         ("list", "", "pods", "", "ns", "p")),
        ("GET", "/api/v1/namespaces/ns/pods/p", {}, ("get", "", "pods", "", "ns", "p")),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {"follow": "true"}, ("get", "", "pods", "log", "ns", "p")),
        ("GET", "/api/v1/pods", {}, ("list", "", "pods", "", "", "")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "nodes", "", "", "n1")),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "", "namespaces", "", "ns", "ns")),
        ("GET", "/api/v1/namespaces", {}, ("list", "", "namespaces", "", "", "")),
        ("PUT", "/api/v1/namespaces/ns/finalize", {}, ("update", "", "namespaces", "finalize", "ns", "ns")),
        ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs", {},
         ("create", "trainer.kubeflow.org", "trainjobs", "", "ns", "")),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/w/status", {},
         ("patch", "kueue.x-k8s.io", "workloads", "status", "ns", "w")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", {},
         ("update", "coordination.k8s.io", "leases", "", "ns", "l")),
        ("DELETE", "/api/v1/namespaces/ns/configmaps/c", {}, ("delete", "", "configmaps", "", "ns", "c")),
        ("DELETE", "/api/v1/namespaces/ns/configmaps", {}, ("deletecollection", "", "configmaps", "", "ns", "")),
        ("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "", "pods", "", "ns", "")),
    ],
)
def test_a_request_is_authorized_on_the_attributes_the_real_server_derives(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    a = request_attributes(method, path, query)
    assert a.resource_request
    assert (a.verb, a.group, a.resource, a.subresource, a.namespace, a.name) == expected


def test_discovery_and_other_paths_are_non_resource_requests() -> None:
    for path in ("/api", "/api/v1", "/apis", "/apis/batch/v1", "/version", "/healthz"):
        a = request_attributes("GET", path, {})
        assert not a.resource_request and a.verb == "get" and a.path == path


# ---------------------------------------------------------------- the denial is the real 403


async def test_a_denial_is_the_real_forbidden_status() -> None:
    server = FakeApiServer()
    transport = server.transport("dispatch-controller")
    async with httpx2.AsyncClient(transport=transport, base_url="http://fake") as http:
        r = await http.patch("/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/x",
                             content=b"{}", headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 404  # allowed: the fake goes on to answer that x does not exist
        r = await http.delete("/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/x")
        assert r.status_code == 403
        assert r.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
            "code": 403, "details": {"name": "x", "group": "trainer.kubeflow.org", "kind": "trainjobs"},
            "message": f'trainjobs.trainer.kubeflow.org "x" is forbidden: User "{CONTROLLER}" cannot delete '
                       'resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "default"',
        }
        r = await http.get("/api/v1/namespaces/default/secrets")
        assert r.json()["message"] == (f'secrets is forbidden: User "{CONTROLLER}" cannot list resource "secrets" '
                                       'in API group "" in the namespace "default"')
        assert r.json()["details"] == {"kind": "secrets"}
        r = await http.patch("/api/v1/nodes/n1", content=b"{}",
                             headers={"Content-Type": "application/merge-patch+json"})
        assert r.json()["message"] == (f'nodes "n1" is forbidden: User "{CONTROLLER}" cannot patch resource '
                                       '"nodes" in API group "" at the cluster scope')
        r = await http.patch("/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads/w", content=b"{}",
                             headers={"Content-Type": "application/merge-patch+json"})
        assert r.status_code == 403  # the controller may patch only workloads/status
        r = await http.get("/metrics")
        assert r.json()["message"] == f'forbidden: User "{CONTROLLER}" cannot get path "/metrics"'
        r = await http.get("/apis/batch/v1")  # discovery: every authenticated user may (bootstrap roles)
        assert r.status_code != 403
    assert server.objects("trainer.kubeflow.org", "trainjobs") == []


async def test_without_a_role_the_transport_is_unrestricted() -> None:
    server = FakeApiServer()
    kube = k.Kube.connect(namespace="default", transport=server.transport())
    try:
        await kube.create(k.CONFIGMAPS, {"metadata": {"name": "any"}, "data": {}})
        await kube.delete(k.CONFIGMAPS, "any")
        await kube.list(k.NODES)
    finally:
        await kube.aclose()
    assert server.denied == []


async def test_the_client_reports_a_denial_as_forbidden_naming_the_role_and_verb() -> None:
    server = FakeApiServer()
    kube = k.Kube.connect(namespace="default", transport=server.transport(roles=READER_ROLES, user="alice"))
    try:
        with pytest.raises(Forbidden) as err:
            await kube.create(k.TRAINJOBS, {"metadata": {"name": "t"}, "spec": {}})
        assert err.value.code == 403 and err.value.reason == "Forbidden"
        assert ('trainjobs.trainer.kubeflow.org is forbidden: User "alice" cannot create resource "trainjobs" '
                'in API group "trainer.kubeflow.org" in the namespace "default"') in str(err.value)
    finally:
        await kube.aclose()


async def test_a_role_binding_grants_only_inside_its_namespace() -> None:
    server = FakeApiServer()
    kube = k.Kube.connect(namespace="default", transport=server.transport(roles=READER_ROLES))
    try:
        await kube.list(k.PODS)
        await kube.list(k.NODES)
        with pytest.raises(Forbidden):
            await kube.list(k.PODS, namespace="other")
        with pytest.raises(Forbidden):
            await kube.list(k.PODS, all_namespaces=True)
    finally:
        await kube.aclose()


async def test_an_apply_that_creates_also_needs_create() -> None:
    """kube-apiserver's patch handler checks ``create`` once an apply finds the object missing."""
    server = FakeApiServer()
    kube = k.Kube.connect(namespace="default", transport=server.transport("dispatch-controller"))
    try:
        with pytest.raises(Forbidden) as err:
            await kube.apply(k.TRAINJOBS, "new", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                 "metadata": {"name": "new"}, "spec": {}})
        assert 'cannot create resource "trainjobs"' in str(err.value)
        assert server.get("trainer.kubeflow.org", "trainjobs", "default", "new") is None
        server.create("trainer.kubeflow.org", "trainjobs", "default", {"metadata": {"name": "new"}, "spec": {}})
        await kube.apply(k.TRAINJOBS, "new", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                             "metadata": {"name": "new", "labels": {"a": "b"}}})
    finally:
        await kube.aclose()


def test_the_controller_identity_carries_its_lease_role_from_the_shipped_bindings() -> None:
    who = Policy.load().identity(["dispatch-controller"])
    assert who.user == CONTROLLER
    assert Binding("dispatch-controller-leader-election", "dispatch-system", "Role") in who.bindings


def test_unknown_roles_and_bad_manifests_are_clear_errors() -> None:
    with pytest.raises(RbacError, match="no ClusterRole dispatch-nobody"):
        FakeApiServer().transport("dispatch-nobody")
    with pytest.raises(RbacError, match="verbs must be a list"):
        Policy.load("kind: ClusterRole\nmetadata: {name: x}\nrules: [{apiGroups: [''], verbs: get}]\n")
    with pytest.raises(RbacError, match="unknown rule fields"):
        Policy.load("kind: ClusterRole\nmetadata: {name: x}\nrules: [{verb: [get]}]\n")


# ---------------------------------------------------------------- the library under its roles


def test_the_writer_role_covers_the_whole_plain_mode_lifecycle(cluster: FakeCluster) -> None:
    with Adapter.connect("default", transport=cluster.transport(roles=("dispatch-writer", "dispatch-node-reader"))
                         ) as writer:
        writer.open(JobSpec(job_id="llama", submission="s1"))
        cluster.settle()
        assert writer.inspect("llama-s1").state is State.HELD
        assert writer.release("llama-s1").admission == 1
        cluster.settle()
        assert writer.inspect("llama-s1").state is State.RUNNING
        writer.hold("llama-s1")
        cluster.settle(honour_grace=False)
        assert writer.ceased("llama-s1")
        assert writer.release("llama-s1").admission == 2
        cluster.settle()
        assert [s.name for s in writer.find(job_id="llama")] == ["llama-s1"]
        writer.hold("llama-s1")
        cluster.settle(honour_grace=False)
        writer.close("llama-s1")
        writer.open(JobSpec(job_id="llama", submission="s2"), hold=False)
        cluster.settle()
    cluster.history.check()


def test_the_writer_bound_in_its_namespace_can_open_on_a_cluster_training_runtime(cluster: FakeCluster) -> None:
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER_ROLES)) as writer:
        writer.open(JobSpec(job_id="llama", submission="s1"))


def test_the_writer_bound_in_its_namespace_runs_the_lifecycle_on_a_namespaced_runtime(cluster: FakeCluster) -> None:
    runtime = cluster.server.get("trainer.kubeflow.org", "clustertrainingruntimes", "", "torch-distributed")
    assert runtime is not None
    cluster.server.create("trainer.kubeflow.org", "trainingruntimes", "default", {
        "metadata": {"name": "torch-distributed"}, "spec": runtime["spec"]})
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER_ROLES)) as writer:
        spec = JobSpec(job_id="llama", submission="s1", runtime_kind="TrainingRuntime")
        writer.open(spec)
        with pytest.raises(Forbidden):  # nothing outside its namespace
            Adapter.connect("other", transport=cluster.transport(roles=WRITER_ROLES)).open(spec)
        assert writer.release("llama-s1").admission == 1
        writer.hold("llama-s1")
        writer.close("llama-s1")


def test_the_reader_role_inspects_but_every_write_is_forbidden(cluster: FakeCluster, adapter: Adapter) -> None:
    adapter.open(JobSpec(job_id="llama", submission="s1"), hold=False)
    cluster.settle()
    with Adapter.connect("default", transport=cluster.transport(roles=READER_ROLES), read_only=True) as reader:
        assert reader.inspect("llama-s1").state is State.RUNNING
        assert [s.name for s in reader.find(job_id="llama")] == ["llama-s1"]
        assert not reader.ceased("llama-s1")
    with Adapter.connect("default", transport=cluster.transport(roles=READER_ROLES)) as reader:
        for write in (lambda: reader.hold("llama-s1"), lambda: reader.close("llama-s1"),
                      lambda: reader.open(JobSpec(job_id="llama", submission="s2"))):
            with pytest.raises(Forbidden):
                write()
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "llama-s1")
    assert tj is not None and not tj["spec"].get("suspend")


async def test_what_the_writer_must_not_do_is_denied(cluster: FakeCluster) -> None:
    kube = k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER_ROLES))
    cluster.server.create("", "pods", "default", {"metadata": {"name": "p"}, "spec": {}})
    cluster.server.create("", "configmaps", "default", {"metadata": {"name": "other"}, "data": {}})
    try:
        for call in (
            kube.delete(k.PODS, "p"),
            kube.replace(k.TRAINJOBS, "t", {"metadata": {"name": "t"}}),
            kube.merge_patch(k.WORKLOADS, "w", {}, sub="status"),
            kube.get(k.CONFIGMAPS, "other"),
            kube.merge_patch(k.CONFIGMAPS, "other", {"data": {"x": "1"}}),
            kube.delete(k.CONFIGMAPS, "dispatch-admissions"),
            kube.list(k.CONFIGMAPS),
            kube.merge_patch(k.EVENTS, "e", {"message": "x"}),     # it may record Events, not rewrite them
            kube.delete(k.EVENTS, "e"),
        ):
            with pytest.raises(Forbidden):
                await call
    finally:
        await kube.aclose()


# ---------------------------------------------------------------- the controller under its role


@pytest.fixture
async def controller_kube(cluster: FakeCluster) -> AsyncIterator[k.Kube]:
    kube = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
    yield kube
    await kube.aclose()


async def test_the_controller_role_decides_a_batch_with_leader_election(
    cluster: FakeCluster, controller_kube: k.Kube
) -> None:
    kueue = FakeKueue(cluster)
    kueue.install()
    writer = AsyncAdapter(k.Kube.connect(namespace="default", transport=cluster.transport(
        roles=("dispatch-writer", "dispatch-node-reader"))))
    names = []
    try:
        for i in range(4):
            await writer.open(JobSpec(job_id="batch", submission=f"s{i}", queue="lq-dispatch"))
            names.append(kueue.workload_for(f"batch-s{i}"))
    finally:
        await writer.aclose()
    config = Config(resync_seconds=3600, workers=2, leader_elect=True, lease_namespace="dispatch-system")
    ctl = Controller(controller_kube, config)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        await _until(lambda: all(_check_state(cluster, wl) == "Ready" for wl in names), "every check Ready")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert cluster.server.denied == []
    for i in range(4):
        tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", f"batch-s{i}")
        assert tj is not None and tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"


def _check_state(cluster: FakeCluster, wl: str) -> str | None:
    obj = cluster.server.get("kueue.x-k8s.io", "workloads", "default", wl) or {}
    for c in (obj.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == "dispatch":
            return str(c.get("state"))
    return None


async def _until(pred: Any, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def shipped_docs() -> list[Obj]:
    return [d for d in yaml.safe_load_all(SHIPPED_RBAC.read_text()) if d]


def rules_of(docs: list[Obj], role: str) -> list[Obj]:
    rules: list[Obj] = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == role)["rules"]
    return rules


async def test_a_controller_role_without_list_on_trainjobs_stalls_a_batch_and_the_fake_says_so(
    cluster: FakeCluster
) -> None:
    """Regression for the shipped role that granted trainjobs only get and patch: every batch of two or more
    Workloads failed with 403 on a real cluster while every fake test passed."""
    docs = shipped_docs()
    for rule in rules_of(docs, "dispatch-controller"):
        if rule["resources"] == ["trainjobs"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    kueue = FakeKueue(cluster)
    kueue.install()
    writer = AsyncAdapter(k.Kube.connect(namespace="default", transport=cluster.transport()))
    names = []
    try:
        for i in range(2):
            await writer.open(JobSpec(job_id="batch", submission=f"s{i}", queue="lq-dispatch"))
            names.append(kueue.workload_for(f"batch-s{i}"))
    finally:
        await writer.aclose()
    kube = k.Kube.connect(namespace="default", transport=cluster.transport(
        "dispatch-controller", rbac=Policy.from_documents(docs)))
    ctl = Controller(kube, Config(resync_seconds=3600, workers=2))
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        # the batch's own list (namespaced): the TrainJob watch's cluster-wide list is denied too, at once
        await _until(lambda: (CONTROLLER, "GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs")
                     in cluster.server.denied, "the batch's list denied")
        await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kube.aclose()
    assert ("system:serviceaccount:dispatch-system:dispatch-controller", "GET",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs") in cluster.server.denied
    # the stall explained itself where `dispatch status` reads it: a Warning Event naming the refusal
    stalled = [e for e in cluster.server.objects("", "events", "default") if e.get("reason") == "AdmissionStalled"]
    assert stalled and all("cannot list resource \"trainjobs\"" in e["message"] for e in stalled)


SUBMISSION_RECORDS = Kind("dispatch.phpboyscout.uk", "v1alpha1", "submissionrecords", "SubmissionRecord",
                          status=False)


async def test_a_writer_can_create_and_raise_a_submission_record_but_not_delete_it() -> None:
    """The shipped roles: writers claim and issue A in records; only dispatch-admin deletes one."""
    server = FakeApiServer()
    kube = k.Kube.connect(namespace="default", transport=server.transport(
        roles=(Binding("dispatch-writer", "default"),), user="system:serviceaccount:default:writer"))
    body = new_record("llama", "s1", "llama-s1")
    name = body["metadata"]["name"]
    try:
        await kube.create(SUBMISSION_RECORDS, body)
        assert (await kube.get(SUBMISSION_RECORDS, name))["spec"]["jobId"] == "llama"
        await kube.merge_patch(SUBMISSION_RECORDS, name, {"spec": {"admission": 1}})
        with pytest.raises(Forbidden) as err:
            await kube.delete(SUBMISSION_RECORDS, name)
        assert err.value.code == 403 and err.value.reason == "Forbidden"
        assert (f'submissionrecords.dispatch.phpboyscout.uk "{name}" is forbidden: User '
                '"system:serviceaccount:default:writer" cannot delete resource "submissionrecords" in API group '
                '"dispatch.phpboyscout.uk" in the namespace "default"') in str(err.value)
        assert [m for _, m, _ in server.denied] == ["DELETE"]
    finally:
        await kube.aclose()
    assert server.get("dispatch.phpboyscout.uk", "submissionrecords", "default", name) is not None


def test_the_reader_may_read_logs(cluster: FakeCluster, adapter: Adapter) -> None:
    """``pods/log`` is its own resource: the reader holds it, the controller does not."""
    adapter.open(JobSpec(job_id="llama", submission="s1"), hold=False)
    cluster.settle()
    reader = Adapter.connect("default", transport=cluster.transport(roles=READER_ROLES), read_only=True)
    controller = Adapter.connect("default", transport=cluster.transport("dispatch-controller"), read_only=True)
    try:
        with pytest.raises(NotFound):  # authorized; this fake serves no log subresource
            list(reader.logs("llama-s1"))
        assert cluster.server.denied == []
        with pytest.raises(Forbidden, match='cannot get resource "pods/log"'):
            list(controller.logs("llama-s1"))
    finally:
        reader.shutdown()
        controller.shutdown()


@pytest.mark.parametrize("dropped", [("watch",), ("list", "watch")], ids=["no-watch", "no-list-no-watch"])
async def test_a_controller_role_that_cannot_watch_trainjobs_loses_only_the_early_read(
    cluster: FakeCluster, dropped: tuple[str, ...]
) -> None:
    """The TrainJob watch only saves a lone decision one round trip (``_versions``: nothing decides from it), so a
    role without watch, or without list and watch, on TrainJobs (a role kept from before that watch, an image
    upgraded alone, a role narrowed by hand, a cluster where Trainer's kind is not served yet) must cost only that
    trip: the replica is ready (its Service serves the guard's webhooks, whose failurePolicy is Fail), a lone
    Workload is decided at once, not after the wait for informers that have never listed, and the refused
    informer keeps no version (each would only go stale) and does not relist the kind every few seconds."""
    docs = shipped_docs()
    for rule in rules_of(docs, "dispatch-controller"):
        if rule["resources"] == ["trainjobs"]:
            rule["verbs"] = [v for v in rule["verbs"] if v not in dropped]
    kueue = FakeKueue(cluster)
    kueue.install()
    writer = AsyncAdapter(k.Kube.connect(namespace="default", transport=cluster.transport()))
    try:
        await writer.open(JobSpec(job_id="lone", submission="s1", queue="lq-dispatch"))
    finally:
        await writer.aclose()
    wl = kueue.workload_for("lone-s1")
    kube = k.Kube.connect(namespace="default", transport=cluster.transport(
        "dispatch-controller", rbac=Policy.from_documents(docs)))
    # an hour: a decision that waits for every informer to list never comes within the test
    ctl = Controller(kube, Config(resync_seconds=3600, workers=1, sync_wait_seconds=3600))
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        await _until(lambda: (CONTROLLER, "GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs")
                     in cluster.server.denied, "the TrainJob list or watch denied")
        await _until(lambda: all(inf.synced.is_set() for name, inf in ctl.informers.items() if name != "trainjobs"),
                     "every other informer listed")
        assert ctl.readyz()[0], ctl.readyz()
        await _until(lambda: _check_state(cluster, wl) == "Ready", "the lone Workload's check Ready")
        await asyncio.sleep(1.0)    # five backoffs of the first length: a relist would come within them
        assert ctl.informers["trainjobs"].lists == 1 and len(ctl.trainjobs) == 0 and not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kube.aclose()
