"""The shipped roles decide the same way, with the same 403, on the fake and on the real API server.

On the real server each role is held by a ServiceAccount of the test's namespace, bound as the deployment
binds it (the writer by a RoleBinding in its namespace, the node reader and the controller cluster-wide),
and its requests carry that ServiceAccount's token.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import Forbidden, NotFound, Refused
from dispatch import _kube as k
from dispatch._api import SUBMISSION_FLOORS
from dispatch._identity import ADMISSION_LIMIT, floor_name, new_floor, new_record
from dispatch.testbed.harness import floors_of_this_tree
from dispatch.testing import Binding, FakeApiServer
from dispatch.testing._rbac import SHIPPED_RBAC

Obj = dict[str, Any]
SECRETS = k.Res("", "v1", "secrets", "Secret", status=False)
SERVICE_ACCOUNTS = k.Res("", "v1", "serviceaccounts", "ServiceAccount")
CLUSTER_ROLES = k.Res("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
ROLE_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLE_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                              namespaced=False)


@dataclass
class Roles:
    namespace: str
    writer: k.Kube
    controller: k.Kube

    def user(self, sa: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{sa}"


def _ref(kind: str, name: str) -> Obj:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


async def _bind_real(admin: k.Kube, ns: str, kubeconfig: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Install the shipped ClusterRoles, two ServiceAccounts and their bindings; return kubeconfigs by SA."""
    for doc in yaml.safe_load_all(SHIPPED_RBAC.read_text()):
        if doc and doc["kind"] == "ClusterRole":
            current = await admin.get_or_none(CLUSTER_ROLES, doc["metadata"]["name"])
            if current is None:
                await admin.create(CLUSTER_ROLES, doc)
            else:
                await admin.replace(CLUSTER_ROLES, doc["metadata"]["name"], {
                    **doc, "metadata": {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}})
    for sa in ("writer", "reader", "controller"):
        await admin.create(SERVICE_ACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    for sa in ("writer", "reader"):
        await admin.create(ROLE_BINDINGS, {
            "metadata": {"name": sa}, "roleRef": _ref("ClusterRole", f"dispatch-{sa}"),
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
    cluster_bindings = []
    for role, sa in (("dispatch-node-reader", "writer"), ("dispatch-node-reader", "reader"),
                     ("dispatch-controller", "controller")):
        name = f"{ns}-{sa}-{role}"
        await admin.create(CLUSTER_ROLE_BINDINGS, {
            "metadata": {"name": name}, "roleRef": _ref("ClusterRole", role),
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})
        cluster_bindings.append(name)
    return cluster_bindings, _token_kubeconfigs(ns, kubeconfig, tmp)


def _token_kubeconfigs(ns: str, kubeconfig: str, tmp: Path) -> dict[str, str]:
    """A kubeconfig per ServiceAccount that authenticates with that account's token (and nothing else)."""
    from dispatch import testbed

    kubectl = str(Path(testbed.env()["PATH"].split(os.pathsep)[0]) / "kubectl")
    cluster = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]
    paths = {}
    for sa in ("writer", "reader", "controller"):
        token = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "-n", ns, "create", "token", sa],
                               check=True, capture_output=True, text=True).stdout.strip()
        path = tmp / f"{sa}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
            "current-context": sa}))
        paths[sa] = str(path)
    return paths


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.testbed)])
async def roles(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Roles]:
    ns = f"contract-{uuid.uuid4().hex[:8]}"
    writer_user = f"system:serviceaccount:{ns}:writer"
    controller_user = f"system:serviceaccount:{ns}:controller"
    cleanup: list[str] = []
    if request.param == "fake":
        server = FakeApiServer()
        admin = k.Kube.connect(namespace=ns, transport=server.transport())
        writer = k.Kube.connect(namespace=ns, transport=server.transport(
            roles=(Binding("dispatch-writer", ns), "dispatch-node-reader"), user=writer_user))
        controller = k.Kube.connect(namespace=ns, transport=server.transport("dispatch-controller",
                                                                             user=controller_user))
        await admin.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    else:
        kubeconfig = request.getfixturevalue("testbed_kubeconfig")
        admin = k.Kube.connect(namespace=ns, kubeconfig=kubeconfig)
        await admin.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        cleanup, paths = await _bind_real(admin, ns, kubeconfig, tmp_path)
        writer = k.Kube.connect(namespace=ns, kubeconfig=paths["writer"])
        controller = k.Kube.connect(namespace=ns, kubeconfig=paths["controller"])
    try:
        yield Roles(ns, writer, controller)
    finally:
        for kube in (writer, controller):
            await kube.aclose()
        if request.param == "real":
            for name in cleanup:
                await admin.delete(CLUSTER_ROLE_BINDINGS, name)
            await admin.delete(k.NAMESPACES, ns)
        await admin.aclose()


async def denial(call: Callable[[], Awaitable[Any]]) -> str:
    """The API server's message of a 403 (the client puts it after its own words)."""
    with pytest.raises(Forbidden) as err:
        await call()
    assert err.value.code == 403 and err.value.reason == "Forbidden"
    return str(err.value)


async def test_a_denied_request_on_a_named_object_in_a_namespace(roles: Roles) -> None:
    message = await denial(lambda: roles.controller.delete(k.TRAINJOBS, "x"))
    assert message.endswith(
        f': trainjobs.trainer.kubeflow.org "x" is forbidden: User "{roles.user("controller")}" cannot delete '
        f'resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "{roles.namespace}"')


async def test_a_denied_list_names_no_object(roles: Roles) -> None:
    message = await denial(lambda: roles.writer.list(SECRETS))
    assert message.endswith(
        f': secrets is forbidden: User "{roles.user("writer")}" cannot list resource "secrets" in API group "" '
        f'in the namespace "{roles.namespace}"')


async def test_a_denied_request_on_a_cluster_scoped_object(roles: Roles) -> None:
    message = await denial(lambda: roles.writer.merge_patch(k.NODES, "n1", {"metadata": {"labels": {"a": "b"}}}))
    assert message.endswith(
        f': nodes "n1" is forbidden: User "{roles.user("writer")}" cannot patch resource "nodes" in API group "" '
        "at the cluster scope")


async def test_a_subresource_is_its_own_resource(roles: Roles) -> None:
    message = await denial(lambda: roles.controller.merge_patch(k.WORKLOADS, "w", {"spec": {"active": False}}))
    assert 'cannot patch resource "workloads" in API group "kueue.x-k8s.io"' in message
    with pytest.raises(NotFound):  # allowed: the server goes on to say w does not exist
        await roles.controller.merge_patch(k.WORKLOADS, "w", {"status": {}}, sub="status")
    message = await denial(lambda: roles.writer.merge_patch(k.WORKLOADS, "w", {"status": {}}, sub="status"))
    assert message.endswith(
        f': workloads.kueue.x-k8s.io "w" is forbidden: User "{roles.user("writer")}" cannot patch resource '
        f'"workloads/status" in API group "kueue.x-k8s.io" in the namespace "{roles.namespace}"')


async def test_the_cluster_scoped_runtime_read_comes_from_the_cluster_wide_binding(roles: Roles) -> None:
    """A RoleBinding never grants cluster-scoped kinds, so open's read of a ClusterTrainingRuntime is granted
    by dispatch-node-reader, bound cluster-wide next to the writer's RoleBinding (found by this contract)."""
    try:
        await roles.writer.get(k.CLUSTER_RUNTIMES, "torch-distributed")
    except NotFound:
        pass  # allowed: the fake serves no runtime here; the real testbed does


async def test_an_apply_that_would_create_needs_create(roles: Roles) -> None:
    message = await denial(lambda: roles.controller.apply(k.TRAINJOBS, "made-by-apply", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "made-by-apply"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}}))
    assert message.endswith(
        f': trainjobs.trainer.kubeflow.org "made-by-apply" is forbidden: User "{roles.user("controller")}" cannot '
        f'create resource "trainjobs" in API group "trainer.kubeflow.org" in the namespace "{roles.namespace}"')


async def test_a_list_with_watch_is_the_watch_verb(roles: Roles) -> None:
    async def watch() -> None:
        async for _ in roles.writer.watch(k.JOBSETS, resource_version="0", timeout_seconds=1):
            pass

    await roles.writer.list(k.JOBSETS)  # list is granted, watch is not
    message = await denial(watch)
    assert message.endswith(
        f': jobsets.jobset.x-k8s.io is forbidden: User "{roles.user("writer")}" cannot watch resource "jobsets" '
        f'in API group "jobset.x-k8s.io" in the namespace "{roles.namespace}"')


async def test_a_non_resource_path_is_denied_by_path_and_discovery_is_open_to_everyone(roles: Roles) -> None:
    client = roles.writer._client  # the client's own HTTP session: the same TLS and token as every call
    response = await client.get("/metrics")
    assert response.status_code == 403
    assert response.json()["message"] == f'forbidden: User "{roles.user("writer")}" cannot get path "/metrics"'
    assert response.json()["reason"] == "Forbidden"
    for path in ("/api", "/apis/batch/v1", "/version"):
        assert (await client.get(path)).status_code != 403, path


# (group, version, resource, namespaced, subresource)
RESOURCES = [
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs", True, ""),
    ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", True, ""),
    ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", False, ""),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets", True, ""),
    ("batch", "v1", "jobs", True, ""),
    ("", "v1", "pods", True, ""),
    ("", "v1", "pods", True, "log"),
    ("", "v1", "nodes", False, ""),
    ("", "v1", "configmaps", True, ""),
    ("", "v1", "events", True, ""),
    ("", "v1", "secrets", True, ""),
    ("coordination.k8s.io", "v1", "leases", True, ""),
    ("kueue.x-k8s.io", "v1beta2", "workloads", True, ""),
    ("kueue.x-k8s.io", "v1beta2", "workloads", True, "status"),
    ("kueue.x-k8s.io", "v1beta2", "admissionchecks", False, ""),
    ("kueue.x-k8s.io", "v1beta2", "admissionchecks", False, "status"),
]


def _requests(ns: str) -> list[tuple[str, str, dict[str, str]]]:
    """Requests that change nothing whatever the answer: reads, and writes to names that do not exist
    (a create is a dry run)."""
    out: list[tuple[str, str, dict[str, str]]] = []
    for group, version, resource, namespaced, sub in RESOURCES:
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        coll = f"{base}/namespaces/{ns}/{resource}" if namespaced else f"{base}/{resource}"
        for name in ("absent-x", "dispatch-admissions", "dispatch-admission-controller"):
            item = f"{coll}/{name}" + (f"/{sub}" if sub else "")
            out += [("GET", item, {}), ("PATCH", item, {}), ("DELETE", item, {})] if not sub or sub != "log" else [
                ("GET", item, {})]
        if not sub:
            out += [("GET", coll, {}), ("GET", coll, {"watch": "true", "timeoutSeconds": "1"}),
                    ("POST", coll, {"dryRun": "All"})]
    return out


@pytest.mark.testbed
async def test_the_fake_decides_every_request_as_the_real_server_does(
    testbed_kubeconfig: str, tmp_path: Path
) -> None:
    """Each request the roles could send, against the real server's authorizer and the fake's."""
    from dispatch.testing import Policy

    ns = f"contract-{uuid.uuid4().hex[:8]}"
    admin = k.Kube.connect(namespace=ns, kubeconfig=testbed_kubeconfig)
    await admin.create(k.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cleanup, paths = await _bind_real(admin, ns, testbed_kubeconfig, tmp_path)
    policy = Policy.load()
    who = {"writer": policy.identity([Binding("dispatch-writer", ns), "dispatch-node-reader"],
                                     user=f"system:serviceaccount:{ns}:writer"),
           "reader": policy.identity([Binding("dispatch-reader", ns), "dispatch-node-reader"],
                                     user=f"system:serviceaccount:{ns}:reader"),
           "controller": policy.identity([Binding("dispatch-controller")],
                                         user=f"system:serviceaccount:{ns}:controller")}
    from dispatch.testing._rbac import request_attributes

    wrong: list[tuple[str, str, str, dict[str, str], int]] = []
    checked = 0
    try:
        for sa, identity in who.items():
            kube = k.Kube.connect(namespace=ns, kubeconfig=paths[sa])
            try:
                for method, path, params in _requests(ns):
                    content = b"{}"
                    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {
                        "Content-Type": "application/json"}
                    if method == "POST":
                        content = b'{"metadata": {"name": "dry-run-only"}}'
                    response = await kube._client.request(method, path, params=params, content=content
                                                          if method in ("POST", "PATCH", "DELETE") else None,
                                                          headers=headers)
                    fake_allows = identity.allows(request_attributes(method, path, params))
                    checked += 1
                    if (response.status_code == 403) == fake_allows:
                        wrong.append((sa, method, path, params, response.status_code))
            finally:
                await kube.aclose()
    finally:
        for name in cleanup:
            await admin.delete(CLUSTER_ROLE_BINDINGS, name)
        await admin.delete(k.NAMESPACES, ns)
        await admin.aclose()
    assert wrong == [] and checked > 500, (checked, wrong)


# ---------------------------------------------------------------- floors: tied to the namespace they name


@pytest.fixture
async def floor_roles(roles: Roles, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Roles, str]]:
    """The roles, with the ``dispatch-floors`` policy and this tree's floor CRD in force; yields the policy's name
    (the fake always plays the shipped one; the real server gets it renamed, cluster-wide, for the test)."""
    if request.node.callspec.params["roles"] == "fake":
        yield roles, "dispatch-floors"
        return
    admin = k.Kube.connect(namespace=roles.namespace, kubeconfig=request.getfixturevalue("testbed_kubeconfig"))

    async def in_force() -> bool:
        try:
            await roles.writer.create(SUBMISSION_FLOORS, new_floor(f"{roles.namespace}-b", "j", "s", 1), dry_run=True)
        except Forbidden as exc:
            return "ValidatingAdmissionPolicy 'dispatch-floors" in str(exc)
        return False
    try:
        async with floors_of_this_tree(admin, in_force) as name:
            yield roles, name
    finally:
        for floor in (await admin.list(SUBMISSION_FLOORS)).items:
            if floor["spec"]["namespace"].startswith(roles.namespace):
                await admin.delete(SUBMISSION_FLOORS, floor["metadata"]["name"])
        await admin.aclose()


async def test_a_floor_is_written_only_by_whoever_may_write_records_in_the_namespace_it_names(
    floor_roles: tuple[Roles, str]
) -> None:
    """Floors are cluster-scoped, so RBAC grants the writer's floor writes cluster-wide (dispatch-node-reader); the
    ``dispatch-floors`` policy asks the authorizer whether the requester may create (or patch) identity records
    in the namespace the floor names: the writer only in its own, the controller in every one."""
    roles, policy = floor_roles
    ns, other = roles.namespace, f"{roles.namespace}-b"
    theirs = floor_name(other, "llama", "s1")

    def refused_as(message: str, verb: str) -> bool:
        """The server's whole answer, from this test's policy or from the shipped one when an earlier test left
        it installed (both are in force then, and either may answer first)."""
        for name in {policy, "dispatch-floors"}:
            said = (f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: a floor of namespace "
                    f"{other} is written only by whoever may {verb} submissionrecords in {other}")
            if message.endswith(f': submissionfloors.dispatch.phpboyscout.uk "{theirs}" is forbidden: {said} '
                                f'(: {said})'):
                return True
        return False
    message = await denial(lambda: roles.writer.create(SUBMISSION_FLOORS, new_floor(other, "llama", "s1", 5)))
    assert refused_as(message, "create"), message
    assert (await roles.writer.create(SUBMISSION_FLOORS, new_floor(ns, "llama", "s1", 1)))["spec"]["admission"] == 1
    assert (await roles.writer.merge_patch(SUBMISSION_FLOORS, floor_name(ns, "llama", "s1"),
                                           {"spec": {"admission": 2}}))["spec"]["admission"] == 2
    # the controller, bound cluster-wide, writes the floors of every namespace it serves
    assert (await roles.controller.create(SUBMISSION_FLOORS, new_floor(other, "llama", "s1", 1)))["spec"][
        "admission"] == 1
    assert (await roles.controller.merge_patch(SUBMISSION_FLOORS, theirs, {"spec": {"admission": 3}}))["spec"][
        "admission"] == 3
    message = await denial(lambda: roles.writer.merge_patch(SUBMISSION_FLOORS, theirs, {"spec": {"admission": 7}}))
    assert refused_as(message, "patch"), message


async def test_a_floors_name_is_held_to_its_namespace_and_its_a_to_the_highest_a(
    floor_roles: tuple[Roles, str]
) -> None:
    """The CRD's rules, answered before any policy (422): a floor's name spells out the namespace it names, so a
    writer cannot squat another namespace's floor with one of its own; A stops at ``ADMISSION_LIMIT``."""
    roles, _ = floor_roles
    ns, other = roles.namespace, f"{roles.namespace}-b"
    squat = new_floor(ns, "llama", "s1", 5)
    squat["metadata"] = {**squat["metadata"], "name": floor_name(other, "llama", "s1")}
    with pytest.raises(Refused) as got:
        await roles.writer.create(SUBMISSION_FLOORS, squat)
    assert got.value.code == 422
    rule = "<nil>: Invalid value: a floor's name is the namespace it names, a dot and its record's name " \
           "(<namespace>.sub-<hash>)"
    assert str(got.value) == (f'SubmissionFloor.dispatch.phpboyscout.uk "{floor_name(other, "llama", "s1")}" is '
                              f"invalid: {rule} ({rule})"), str(got.value)
    with pytest.raises(Refused) as got:
        await roles.writer.create(SUBMISSION_FLOORS, new_floor(ns, "llama", "s1", ADMISSION_LIMIT + 1))
    assert (
        f'SubmissionFloor.dispatch.phpboyscout.uk "{floor_name(ns, "llama", "s1")}" is invalid: spec.admission: '
        f"Invalid value: {ADMISSION_LIMIT + 1}: spec.admission in body should be less than or equal to "
        f"{ADMISSION_LIMIT}") in str(got.value), str(got.value)
    assert (await roles.writer.create(SUBMISSION_FLOORS, new_floor(ns, "llama", "s1", ADMISSION_LIMIT)))["spec"][
        "admission"] == ADMISSION_LIMIT
    with pytest.raises(Refused) as got:
        await roles.writer.create(k.Res("dispatch.phpboyscout.uk", "v1alpha1", "submissionrecords", "SubmissionRecord"),
                                  {**new_record("llama", "s1", "llama-s1", admission=ADMISSION_LIMIT + 1)})
    assert "spec.admission in body should be less than or equal to 9007199254740991" in str(got.value)
