"""Issue 25, every writer, second round: each finding as a named regression test on the fake cluster.

Every client holds exactly a shipped role (``deploy/base/rbac.yaml``) and the guard is installed as
``deploy/base/guard.yaml`` installs it (``FakeGuard``: the webhook, the TrainJob CEL policy and the
``dispatch-pods`` policy); the identity record's CRD rules hold for every writer. Each test fails on the
code before the fix (the test names the item). The same scenarios run on the real control plane in
``test_every_writer_second_round_testbed.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER, Adapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.controller import _guard as g
from dispatch.controller.testing import FakeGuard
from dispatch.errors import DispatchError, Forbidden, Refused
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")
WRITER = ("dispatch-writer", "dispatch-node-reader")
ADMIN = ("dispatch-admin", "dispatch-node-reader")
EDIT = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: namespace-editor}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "patch", "update", "delete"]
"""
"""A namespace editor beside dispatch (Kubernetes' own ``edit`` role grants this on pods): no dispatch role, so
only the ``dispatch-pods`` policy stands in its way."""
Obj = dict[str, Any]


@pytest.fixture
def guard(cluster: FakeCluster) -> FakeGuard:
    fg = FakeGuard(cluster)
    fg.install()
    return fg


@pytest.fixture
def writer(cluster: FakeCluster, guard: FakeGuard) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as a:
        a.core.settle_seconds = 0
        yield a


def patch_as(cluster: FakeCluster, res: k.Res, name: str, body: Obj, *, roles: tuple[str, ...] = WRITER,
             rbac: str | None = None) -> DispatchError | None:
    """``kubectl patch --type=merge`` as a user holding ``roles``: the error, or None if it went through."""
    async def go() -> DispatchError | None:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport(roles=roles, rbac=rbac))
        try:
            await kube.merge_patch(res, name, body)
            return None
        except DispatchError as exc:
            return exc
        finally:
            await kube.aclose()
    return asyncio.run(go())


def ran_once_on_a_lost_node(writer: Adapter, cluster: FakeCluster) -> str:
    """A=1 ran; its node is lost; the object is held and its pod stays Terminating (its process runs on)."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    pod = str(cluster.pods(NAME)[0]["metadata"]["name"])
    cluster.freeze_node(cluster.pods(NAME)[0]["spec"]["nodeName"])
    writer.hold(NAME)
    cluster.settle()
    return pod


# ---------------------------------------------------------------- item 1: pods


def test_item1_the_writer_role_can_no_longer_relabel_or_unfinalize_a_running_pod(
        writer: Adapter, cluster: FakeCluster) -> None:
    pod = ran_once_on_a_lost_node(writer, cluster)
    relabel = {"metadata": {"labels": {LABEL_JOB_ID: None, LABEL_SUBMISSION: None, LABEL_ADMISSION: None,
                                       n.JOBSET_NAME_LABEL: None, "batch.kubernetes.io/controller-uid": None,
                                       "batch.kubernetes.io/job-name": None}}}
    denied = patch_as(cluster, api.PODS, pod, relabel)
    assert isinstance(denied, Forbidden) and 'cannot patch resource "pods"' in str(denied)
    unfinalize = {"metadata": {"finalizers": None}}
    assert isinstance(patch_as(cluster, api.PODS, pod, unfinalize), Forbidden)
    cluster.server.denied.clear()
    # so the rule still sees it, and release still waits
    with pytest.raises(DispatchError, match=f"remaining pods: {pod}"):
        writer.release(NAME)
    assert not writer.ceased(NAME).ceased
    cluster.history.check()


def test_item1_anyone_else_who_may_patch_pods_meets_the_pod_policy(writer: Adapter, cluster: FakeCluster) -> None:
    pod = ran_once_on_a_lost_node(writer, cluster)
    editor: tuple[str, ...] = ("namespace-editor",)
    carried = cluster.server.get("", "pods", "default", pod)["metadata"]["labels"]  # type: ignore[index]
    for label in [x for x in n.POD_KEPT_LABELS if x in carried]:
        got = patch_as(cluster, api.PODS, pod, {"metadata": {"labels": {label: None}}}, roles=editor, rbac=EDIT)
        assert isinstance(got, Forbidden), label
        assert "ValidatingAdmissionPolicy 'dispatch-pods' with binding 'dispatch-pods' denied request: the labels " \
               "that say whose a dispatch pod is are kept" in str(got)
    changed = patch_as(cluster, api.PODS, pod, {"metadata": {"labels": {LABEL_ADMISSION: "7"}}}, roles=editor,
                       rbac=EDIT)
    assert isinstance(changed, Forbidden)
    gone = patch_as(cluster, api.PODS, pod, {"metadata": {"finalizers": None}}, roles=editor, rbac=EDIT)
    assert isinstance(gone, Forbidden) and "is removed only by dispatch's controller" in str(gone)
    # a force delete leaves the pod (the finalizer), and the finalizer still cannot be taken off
    cluster.force_delete(pod)
    assert isinstance(patch_as(cluster, api.PODS, pod, {"metadata": {"finalizers": []}}, roles=editor, rbac=EDIT),
                      Forbidden)
    assert cluster.server.get("", "pods", "default", pod) is not None
    # other labels and annotations of the pod stay the editor's to change
    assert patch_as(cluster, api.PODS, pod, {"metadata": {"labels": {"team": "a"}}}, roles=editor, rbac=EDIT) is None
    with pytest.raises(DispatchError, match=f"remaining pods: {pod}"):
        writer.release(NAME)
    # the admin (the operator's word that the node is down) may take it off
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.release_pod(pod, node_confirmed_down=True).proof == "operator-confirmed"
    cluster.history.check()


def test_item1_the_controllers_keeper_still_frees_proven_pods(writer: Adapter, cluster: FakeCluster,
                                                              keeper: Any) -> None:
    pod = ran_once_on_a_lost_node(writer, cluster)
    cluster.taint_out_of_service(str(cluster.server.get("", "pods", "default", pod)["spec"]["nodeName"]))  # type: ignore[index]
    cluster.settle()
    assert keeper() == {f"default/{pod}": "out-of-service"}
    assert cluster.server.get("", "pods", "default", pod) is None
    assert writer.release(NAME).admission == 2
    assert cluster.server.denied == []
    cluster.history.check()


# ---------------------------------------------------------------- item 4: A issued to another uid


def ran_twice_then_closed_and_reopened(writer: Adapter, cluster: FakeCluster, keeper: Any) -> None:
    writer.open(SPEC)
    for a in (1, 2):
        assert writer.release(NAME).admission == a
        cluster.settle()
        writer.hold(NAME)
        cluster.settle()
        cluster.advance(60)
        cluster.settle()
        keeper()
    writer.close(NAME)
    cluster.settle()
    keeper()
    cluster.settle()
    writer.open(SPEC)


def test_item4_a_writer_raising_the_reopened_trainjob_to_an_a_that_ran_does_not_make_release_reuse_it(
        writer: Adapter, cluster: FakeCluster, keeper: Any) -> None:
    ran_twice_then_closed_and_reopened(writer, cluster, keeper)
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    assert tj is not None
    entry = next(e for e in tj["spec"]["runtimePatches"] if e["manager"] == n.PATCH_MANAGER)
    for rj in entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["metadata"]["labels"][LABEL_ADMISSION] = "2"
    forged = {"metadata": {"annotations": {n.ANNOTATION_ADMISSION: "2"}},
              "spec": {"runtimePatches": tj["spec"]["runtimePatches"]}}
    assert patch_as(cluster, api.TRAINJOBS, NAME, forged) is None  # A only rises: nothing refuses this write
    assert writer.release(NAME).admission == 3
    cluster.settle()
    assert {p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(NAME)} == {"3"}
    cluster.history.check()


def test_item4_a_writer_cannot_bind_the_record_to_another_trainjob_without_a_raise(
        writer: Adapter, cluster: FakeCluster, keeper: Any) -> None:
    ran_twice_then_closed_and_reopened(writer, cluster, keeper)
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    records = cluster.server.objects(n.DOMAIN, "submissionrecords", "default")
    assert len(records) == 1 and records[0]["spec"]["admission"] == 2
    bind = {"spec": {"trainJob": {"name": NAME, "uid": tj["metadata"]["uid"]}}}  # type: ignore[index]
    refused = patch_as(cluster, api.SUBMISSION_RECORDS, records[0]["metadata"]["name"], bind)
    assert isinstance(refused, Refused), refused
    assert "a record is bound to a TrainJob's uid only together with a raise of A" in str(refused)
    # with a raise it may (that A never ran), and nothing reuses 2
    raised = {"spec": {"admission": 3, "trainJob": {"name": NAME, "uid": tj["metadata"]["uid"]}}}  # type: ignore[index]
    assert patch_as(cluster, api.SUBMISSION_RECORDS, records[0]["metadata"]["name"], raised) is None
    assert writer.release(NAME).admission >= 3
    cluster.settle()
    cluster.history.check()


# ---------------------------------------------------------------- item 5: other runtime patch entries


def foreign_entry(admission: str) -> Obj:
    return {"manager": "example.com/tuner", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {LABEL_ADMISSION: admission}},
                                                            "spec": {"containers": [{"name": "node"}]}}}}}]}}}}


def test_item5_another_managers_entry_may_not_set_dispatchs_labels_variables_or_finalizer(
        writer: Adapter, cluster: FakeCluster, guard: FakeGuard) -> None:
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    writer.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()  # Trainer's webhook takes runtime patch changes only once nothing is active
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    assert tj is not None
    for bad in (foreign_entry("0"), foreign_entry("5")):  # the TrainJob carries A=1
        got = patch_as(cluster, api.TRAINJOBS, NAME, {"spec": {"runtimePatches": [*tj["spec"]["runtimePatches"], bad]}})
        assert isinstance(got, Forbidden), got
        assert "sets pod label dispatch.phpboyscout.uk/admission" in str(got)
    env = foreign_entry("1")
    tmpl = env["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    tmpl["metadata"] = {"finalizers": [POD_FINALIZER]}
    tmpl["spec"]["containers"][0]["env"] = [{"name": "DISPATCH_ADMISSION", "value": "1"}]
    got = patch_as(cluster, api.TRAINJOBS, NAME, {"spec": {"runtimePatches": [*tj["spec"]["runtimePatches"], env]}})
    assert isinstance(got, Forbidden)
    assert "sets dispatch's pod finalizer" in str(got) and "sets variable DISPATCH_ADMISSION" in str(got)
    # an entry that sets the TrainJob's own values (as Kueue's podSetUpdates copy does) passes
    fine = foreign_entry("1")
    assert patch_as(cluster, api.TRAINJOBS, NAME,
                    {"spec": {"runtimePatches": [*tj["spec"]["runtimePatches"], fine]}}) is None


def test_item5_a_stale_entry_listed_after_dispatchs_cannot_start_with_an_a_the_trainjob_does_not_carry(
        writer: Adapter, cluster: FakeCluster, keeper: Any) -> None:
    """The entry carried A=1 legitimately; dispatch's raise to 2 does not rewrite it, and Trainer applies it last:
    the start is judged on the pods Trainer will build from every entry, and refused."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    writer.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    keeper()
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    assert tj is not None
    assert patch_as(cluster, api.TRAINJOBS, NAME,
                    {"spec": {"runtimePatches": [*tj["spec"]["runtimePatches"], foreign_entry("1")]}}) is None
    with pytest.raises(Refused, match=r"Trainer applies every runtime patch entry in order, so the pods of "
                                      r"replicatedJob node would carry dispatch.phpboyscout.uk/admission=1, not 2"):
        writer.release(NAME)
    cluster.settle()
    assert cluster.running_processes(NAME) == []
    cluster.history.check()


# ---------------------------------------------------------------- item 7: enrolment collisions


def enrol_review(name: str, labels: Obj, uid: str) -> Obj:
    obj = {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
           "metadata": {"name": name, "namespace": "default", "labels": labels},
           "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
                    "trainer": {"image": "example.invalid/train", "numNodes": 1}}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "operation": "CREATE", "namespace": "default", "name": name, "object": obj, "oldObject": None,
        "userInfo": {"username": "sdk-user"}}}


def test_item7_enrolment_refuses_a_second_trainjob_taking_a_live_submissions_labels(
        writer: Adapter, cluster: FakeCluster) -> None:
    writer.open(SPEC)

    async def go() -> list[Obj]:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
        guard = g.Guard(kube)
        try:
            return [(await guard.mutate(enrol_review(name, labels, uid), timeout=5))["response"]
                    for name, labels, uid in (
                        ("thief", {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}, "u-1"),
                        ("llama", {LABEL_SUBMISSION: "s1"}, "u-2"),             # job-id taken from the name
                        ("other", {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s2"}, "u-3"))]
        finally:
            await kube.aclose()

    thief, by_name, other = asyncio.run(go())
    assert thief["allowed"] is False and thief["status"]["message"] == (
        "trainjob thief cannot be enrolled in dispatch: submission llama/s1 is held by trainjob llama-s1; one "
        "submission is one object: set another metadata.labels[dispatch.phpboyscout.uk/submission] (or leave it "
        "out: enrolment then takes a fresh one)")
    assert by_name["allowed"] is False and "held by trainjob llama-s1" in by_name["status"]["message"]
    assert other["allowed"] is True and json.loads(__import__("base64").b64decode(other["patch"]))
    # the owner's submission is untouched: she closes and re-opens it
    writer.close(NAME)
    writer.open(SPEC)
