"""Issue 35, item 1: a strategic-merge directive in a runtime patch entry must not strip dispatch's identity.

Trainer merges each ``spec.runtimePatches`` entry into every Job and pod template as a strategic merge patch
(v2.3 ``mergeRuntimePatches``), so an entry whose pod-template labels are ``{"$patch": "replace", ...}`` (or
``delete``) leaves the pods with none of dispatch's labels (``tests/contract/data/strategic-merge.json``, the
real merge's answer): the pod guard's objectSelector never sees their creates, and a re-open of the submission
under another name, reading pods by dispatch's labels, misses them. The fake's Trainer now merges as the real
one does (``dispatch.testing._smp``), the history attributes a process to its TrainJob's submission whatever
its pod's labels, and every client holds exactly the shipped roles with the guard installed as
``deploy/base/guard.yaml`` installs it. Each test fails on the code before the fix.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, Adapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.controller.testing import FakeGuard
from dispatch.errors import DispatchError, Forbidden, Refused
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")
WRITER = ("dispatch-writer", "dispatch-node-reader")
TUNER = "example.com/tuner"
Obj = dict[str, Any]


def entry(manager: str = TUNER, *, pod_labels: Obj | None = None, job_labels: Obj | None = None,
          jobset_labels: Obj | None = None, node_selector: Obj | None = None) -> Obj:
    """A runtime patch entry of ``manager`` for replicatedJob ``node``."""
    pod: Obj = {}
    if pod_labels is not None:
        pod["metadata"] = {"labels": pod_labels}
    if node_selector is not None:
        pod["spec"] = {"nodeSelector": node_selector}
    job: Obj = {"spec": {"template": pod}}
    if job_labels is not None:
        job["metadata"] = {"labels": job_labels}
    template: Obj = {"spec": {"replicatedJobs": [{"name": "node", "template": job}]}}
    if jobset_labels is not None:
        template["metadata"] = {"labels": jobset_labels}
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


STRIPPING = {
    "labels-replace": entry(pod_labels={"$patch": "replace", "team": "a"}),
    "labels-delete": entry(pod_labels={"$patch": "delete"}),
    "forged-kueue-manager": entry("kueue.x-k8s.io/manager", pod_labels={"$patch": "replace"}),
    "job-labels-replace": entry(job_labels={"$patch": "replace"}),
    "jobset-labels": entry(jobset_labels={"$patch": "replace"}),
    "node-selector": entry(node_selector={"$patch": "delete"}),
}
"""Entries with a directive where the CRD keeps it and Trainer's merge reads it (a key of a string map)."""


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


def patch_as(cluster: FakeCluster, name: str, body: Obj) -> DispatchError | None:
    """``kubectl patch --type=merge`` of a TrainJob as a user holding the shipped writer role."""
    async def go() -> DispatchError | None:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER))
        try:
            await kube.merge_patch(api.TRAINJOBS, name, body)
            return None
        except DispatchError as exc:
            return exc
        finally:
            await kube.aclose()
    return asyncio.run(go())


def trainjob(cluster: FakeCluster, name: str = NAME) -> Obj:
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", name)
    assert tj is not None
    return tj


def ran_once_and_held(writer: Adapter, cluster: FakeCluster) -> None:
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    writer.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()  # Trainer's webhook takes runtime patch changes only once nothing is active


@pytest.mark.parametrize("case", list(STRIPPING))
def test_a_writer_cannot_add_an_entry_whose_directive_would_strip_dispatchs_labels(
        case: str, writer: Adapter, cluster: FakeCluster, guard: FakeGuard) -> None:
    ran_once_and_held(writer, cluster)
    bad = STRIPPING[case]
    got = patch_as(cluster, NAME, {"spec": {"runtimePatches": [*trainjob(cluster)["spec"]["runtimePatches"], bad]}})
    assert isinstance(got, Forbidden), got
    assert f"(manager {bad['manager']}) carries the strategic-merge directive $patch" in str(got)
    assert [e["manager"] for e in trainjob(cluster)["spec"]["runtimePatches"]] == [n.PATCH_MANAGER]
    # so the next execution's pods carry dispatch's identity, and the pod guard sees their creates
    assert writer.release(NAME).admission == 2
    cluster.settle()
    pods = [p for p in cluster.pods(NAME) if not p["metadata"].get("deletionTimestamp")]
    assert pods and all(p["metadata"]["labels"].get(LABEL_JOB_ID) == "llama"
                        and p["metadata"]["labels"].get(LABEL_SUBMISSION) == "s1"
                        and p["metadata"]["labels"].get(LABEL_ADMISSION) == "2" for p in pods), pods
    cluster.history.check()


def test_the_identity_policy_alone_refuses_it_with_the_webhook_off(cluster: FakeCluster) -> None:
    """The ``dispatch-identity`` CEL policy holds with the webhook removed (or not sent the write): it names the
    entry's manager and the directive."""
    fg = FakeGuard(cluster, enforce=lambda: False)
    fg.install()
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as writer:
        writer.core.settle_seconds = 0
        writer.open(SPEC)
        bad = STRIPPING["labels-replace"]
        got = patch_as(cluster, NAME, {"spec": {"runtimePatches": [*trainjob(cluster)["spec"]["runtimePatches"],
                                                                   bad]}})
        assert isinstance(got, Forbidden), got
        assert "ValidatingAdmissionPolicy" not in str(got) or "dispatch-identity" in str(got)
        assert f"(manager {TUNER}) carries the strategic-merge directive $patch: replace" in str(got)
        assert any("strategic-merge directive" in d for d in fg.denied), fg.denied


def test_an_entry_written_before_the_fix_cannot_start_and_says_why(
        writer: Adapter, cluster: FakeCluster, guard: FakeGuard) -> None:
    """An object that already carries such an entry (written before this release): dispatch's release judges
    the pods Trainer would build with the real merge, and refuses to start them without dispatch's labels."""
    writer.open(SPEC)

    def inject(obj: Obj) -> None:
        obj["spec"]["runtimePatches"].append(copy.deepcopy(STRIPPING["labels-replace"]))
    cluster.server.update(n.TRAINER_GROUP, "trainjobs", "default", NAME, inject, status=False, admit=False)
    with pytest.raises(Refused, match=r"the pods of replicatedJob node would carry "
                                      r"dispatch.phpboyscout.uk/job-id=\(none\), not llama"):
        writer.release(NAME)
    cluster.settle()
    assert cluster.running_processes(NAME) == []


def test_without_the_refusal_the_real_merge_strips_the_pods_and_the_history_still_sees_the_submission(
        cluster: FakeCluster) -> None:
    """What the refusal prevents, on the fake's Trainer (the real merge): a started object whose entry list
    holds such an entry runs pods with none of dispatch's labels (they keep the finalizer); the history still
    counts them as the submission's, so an overlap under another name would not go unseen."""
    tj = {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
          "metadata": {"name": NAME, "namespace": "default", "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"},
                       "annotations": {n.ANNOTATION_ADMISSION: "1"}},
          "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}, "suspend": False,
                   "runtimePatches": [
                       {"manager": n.PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                           {"name": "node", "template": {"spec": {"template": {"metadata": {
                               "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1", LABEL_ADMISSION: "1"},
                               "finalizers": [n.DOMAIN + "/execution"]}}}}}]}}}},
                       STRIPPING["labels-replace"]]}}
    cluster.server.create(n.TRAINER_GROUP, "trainjobs", "default", tj)
    cluster.settle()
    [pod] = cluster.pods(NAME)
    assert not [key for key in pod["metadata"]["labels"] if key.startswith(n.DOMAIN + "/")], pod["metadata"]
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["finalizers"] == [n.DOMAIN + "/execution"]
    [proc] = cluster.running_processes(NAME)
    assert (proc.job_id, proc.submission) == ("llama", "s1")
