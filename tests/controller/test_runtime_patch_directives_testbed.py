"""Issue 35, item 1, on the real control plane: what the real CRD keeps of a runtime patch entry's
strategic-merge directives, what the real Trainer's merge makes of them, and the shipped policy refusing them.

The first test writes no dispatch object (no guard, no policy): a TrainJob of its own namespace with an entry
that sets a label and a later entry whose pod-template labels are ``{"$patch": "replace", ...}``, plus the
directives the CRD's schema should prune (on an object's metadata, and a ``$deleteFromPrimitiveList`` of its
finalizers); Trainer builds the JobSet while it stays suspended. The second installs the guard scoped to its
namespace (``test_guard_testbed.installed``: the webhook, the ``dispatch-identity`` CEL policy) and writes the
issue's entry onto a held dispatch object as any writer would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, JobSpec
from dispatch import _kube as k
from dispatch.testbed.harness import controller_env, is_running, pods_of, running_testbed_kubeconfig, until

from .test_guard_testbed import Guarded, guard_on, kubectl, release

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
MARK = "example.com/marker"


def entry(manager: str, pod_metadata: Obj) -> Obj:
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"metadata": pod_metadata}}}}]}}}}


async def test_the_real_trainer_merges_a_labels_directive_and_the_crd_prunes_the_others(
        testbed_kubeconfig: str) -> None:
    path = running_testbed_kubeconfig()
    assert path is not None
    async with controller_env(path) as (kube, ns, _):
        name = "merged"
        await kube.create(k.TRAINJOBS, {
            "apiVersion": k.TRAINJOBS.api_version, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                    "kind": "ClusterTrainingRuntime"},
                     "suspend": True,
                     "runtimePatches": [
                         entry("example.com/first", {"labels": {MARK: "first", "kept": "no"},
                                                     "finalizers": ["example.com/first"]}),
                         entry("example.com/second", {"labels": {"$patch": "replace", "team": "a"},
                                                      "$patch": "replace",
                                                      "$deleteFromPrimitiveList/finalizers": ["example.com/first"]}),
                     ]}})
        stored = await kube.get(k.TRAINJOBS, name)
        second = stored["spec"]["runtimePatches"][1]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        meta = second["template"]["spec"]["template"]["metadata"]
        print("STORED second entry's pod metadata:", json.dumps(meta, sort_keys=True))
        # the CRD keeps a directive only as a key of a string map
        assert meta["labels"] == {"$patch": "replace", "team": "a"}
        assert "$patch" not in meta and "$deleteFromPrimitiveList/finalizers" not in meta

        async def built() -> bool:
            return await kube.get_or_none(k.JOBSETS, name) is not None
        await until(built, what="Trainer's JobSet")
        jobset = await kube.get(k.JOBSETS, name)
        [node] = [rj for rj in jobset["spec"]["replicatedJobs"] if rj["name"] == "node"]
        pod_meta = node["template"]["spec"]["template"]["metadata"]
        print("JOBSET pod template metadata:", json.dumps(pod_meta, sort_keys=True))
        assert pod_meta["labels"].get("team") == "a"
        assert MARK not in pod_meta["labels"] and "kept" not in pod_meta["labels"]  # replaced by the later entry
        assert "example.com/first" in pod_meta.get("finalizers", [])  # the pruned delete-list never reached it
        await kube.delete(k.TRAINJOBS, name)


@pytest.fixture
async def g(testbed_kubeconfig: str, tmp_path: Path) -> AsyncIterator[Guarded]:
    async with guard_on(tmp_path) as got:
        yield got


async def test_the_shipped_policy_refuses_an_entry_whose_directive_would_strip_dispatchs_labels(g: Guarded) -> None:
    name = "strip-s1"
    await g.adapter.open(JobSpec(job_id="strip", submission="s1"))
    assert await release(g, name) == 1
    await until(lambda: is_running(g.kube, name), what="running as A=1")
    await g.adapter.hold(name)

    async def no_pods() -> bool:
        return not await pods_of(g.kube, name)
    await until(no_pods, what="its pods gone")
    patches = (await g.kube.get(k.TRAINJOBS, name))["spec"]["runtimePatches"]
    for manager in ("example.com/tuner", "kueue.x-k8s.io/manager"):
        bad = entry(manager, {"labels": {"$patch": "replace", "team": "a"}})
        others = [p for p in patches if p["manager"] != manager]  # Kueue's own (empty) entry, when it keeps one
        got = kubectl(g.ns, "patch", "trainjob", name, "--type=merge", "-p",
                      json.dumps({"spec": {"runtimePatches": [*others, bad]}}))
        print(f"DENIED ({manager}):", got.stderr.strip())
        assert got.returncode != 0
        assert "ValidatingAdmissionPolicy 'dispatch-" in got.stderr  # the policy scoped to this namespace
        assert f"a runtime patch entry carries a strategic-merge directive (manager {manager}: $patch)" in got.stderr
    assert [p["manager"] for p in (await g.kube.get(k.TRAINJOBS, name))["spec"]["runtimePatches"]] == [
        p["manager"] for p in patches]
    assert await release(g, name) == 2
    await until(lambda: is_running(g.kube, name), what="running as A=2")
    pods = await pods_of(g.kube, name)
    assert pods and all(p["metadata"]["labels"].get(LABEL_JOB_ID) == "strip" for p in pods)
