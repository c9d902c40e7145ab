"""The fake's namespace lifecycle and JobSet's update rule, as the real cluster has them (issue 25).

``terminate_namespace`` and ``namespace_controller_pass`` play ``kubectl delete namespace`` and the namespace
controller: the namespace is Terminating until its content is gone (its pods first, deleted gracefully,
dispatch's finalizer holding a pod whose end is unproven; the rest once they are gone), nothing new may be
created in it meanwhile, and it can be created again only once it is gone. ``jobset_update_problem`` is
JobSet's webhook on an update.
"""

from __future__ import annotations

import copy

import pytest

from dispatch import Adapter, DispatchError, JobSpec
from dispatch import _names as n
from dispatch._identity import record_name
from dispatch.controller.testing import keeper_pass
from dispatch.testing import ApiFailure, FakeCluster
from dispatch.testing._cluster import jobset_update_problem

NS = "default"
WRITER = ("dispatch-writer", "dispatch-node-reader")
SPEC = JobSpec(job_id="llama", submission="s1", num_nodes=2)


def test_a_namespace_stays_terminating_while_dispatch_holds_a_pod_and_refuses_new_content(
    cluster: FakeCluster,
) -> None:
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as writer:
        writer.core.settle_seconds = 0
        assert writer.open(SPEC, hold=False).identity.admission == 1
        cluster.settle()
        assert len(cluster.running_processes()) == 2

        cluster.server.terminate_namespace(NS)
        ns = cluster.server.get("", "namespaces", "", NS)
        assert ns is not None and ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
        with pytest.raises(DispatchError, match="unable to create new content in namespace default because it "
                                                "is being terminated"):
            writer.open(JobSpec(job_id="llama", submission="s2"))

        assert cluster.server.namespace_controller_pass(NS) > 0
        pods = cluster.pods()
        assert pods and all(p["metadata"]["deletionGracePeriodSeconds"] == 30 for p in pods)  # gracefully
        # the pods first: nothing else is deleted while one remains (tests/contract/test_namespace_contract.py)
        assert cluster.server.get(n.TRAINER_GROUP, "trainjobs", NS, "llama-s1") is not None
        assert cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name("llama", "s1")) is not None
        cluster.settle()  # the Job controller's replacements are refused, not made
        assert len(cluster.running_processes()) == 2

        cluster.advance(60)
        cluster.settle()  # kubelets confirm; dispatch's finalizer keeps the pods until the keeper frees them
        assert not cluster.running_processes() and cluster.pods()
        assert cluster.server.namespace_controller_pass(NS) > 0
        keeper_pass(cluster, NS, settle=False)
        assert cluster.server.namespace_controller_pass(NS) == 0  # the pods gone, the rest goes with them
        assert cluster.server.get(n.TRAINER_GROUP, "trainjobs", NS, "llama-s1") is None
        assert cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name("llama", "s1")) is None
        assert cluster.server.get("", "namespaces", "", NS) is None
        with pytest.raises(ApiFailure, match='namespaces "default" not found'):
            cluster.server.create("", "configmaps", NS, {"metadata": {"name": "x"}})

    cluster.server.create("", "namespaces", "", {"metadata": {"name": NS}})
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as writer:
        assert writer.open(SPEC, hold=False).identity.admission == 2  # the floor outlived the namespace
    cluster.settle()
    cluster.history.check()


def test_a_namespace_is_created_again_only_once_it_is_gone(cluster: FakeCluster) -> None:
    cluster.server.terminate_namespace(NS)
    with pytest.raises(ApiFailure, match="already exists"):
        cluster.server.create("", "namespaces", "", {"metadata": {"name": NS}})
    assert cluster.server.namespace_controller_pass(NS) == 0
    cluster.server.create("", "namespaces", "", {"metadata": {"name": NS}})
    cluster.server.create("", "configmaps", NS, {"metadata": {"name": "x"}})


def _jobset(suspend: bool, jobs: tuple[str, ...] = ("node",), labels: dict[str, str] | None = None,
            finalizers: tuple[str, ...] = ()) -> dict[str, object]:
    pod_meta: dict[str, object] = {"labels": dict(labels or {})}
    if finalizers:
        pod_meta["finalizers"] = list(finalizers)
    return {"spec": {"suspend": suspend, "replicatedJobs": [
        {"name": job, "replicas": 1, "template": {"spec": {"parallelism": 2, "template": {
            "metadata": copy.deepcopy(pod_meta), "spec": {"containers": [{"name": "node"}]}}}}} for job in jobs]}}


def test_jobsets_replicated_jobs_change_only_in_the_pod_template_fields_kueue_sets_while_suspended() -> None:
    a2 = {n.LABEL_ADMISSION: "2"}
    assert jobset_update_problem(_jobset(True), _jobset(True, labels=a2)) is None
    assert jobset_update_problem(_jobset(False), _jobset(True, labels=a2)) is None  # being suspended
    assert jobset_update_problem(_jobset(True), _jobset(False)) is None
    immutable = 'spec.replicatedJobs: Invalid value: "array": field is immutable'
    assert jobset_update_problem(_jobset(False), _jobset(False, labels=a2)) == immutable
    assert jobset_update_problem(_jobset(True), _jobset(True, ("node", "launcher"))) == immutable
    assert jobset_update_problem(_jobset(True, ("node", "launcher")), _jobset(True)) == immutable
    assert jobset_update_problem(_jobset(True), _jobset(True, finalizers=("x",))) == immutable
