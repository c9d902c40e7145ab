"""What differs between the testbed stacks, checked on the real controllers (not on dispatch).

Each test states what the upstream components do on the selected stack, so a run on every stack shows
which behaviour dispatch meets where (docs/findings.md, "Two stacks"). Expectations branch on the
stack's pinned versions, never on timing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatch import testbed

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
GRACE = 7


def _v(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in testbed.versions()[key].lstrip("v").split("."))


def trainer_at_least(*v: int) -> bool:
    return _v("TRAINER_VERSION") >= v


def kueue_at_least(*v: int) -> bool:
    return _v("KUEUE_VERSION") >= v


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    name = f"diff-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def get(*args: str) -> Obj:
    out: Obj = json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)
    return out


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def trainjob(name: str, ns: str, *, suspend: bool, grace: int | None = GRACE,
             labels: dict[str, str] | None = None) -> Obj:
    """A two-node torch TrainJob with a runtime patch (manager ``dispatch.test/probe``) for the trainer node."""
    pod_spec: Obj = {"nodeSelector": {"kubernetes.io/os": "linux"}}
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "suspend": suspend,
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                           "name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            "runtimePatches": [{
                "manager": "dispatch.test/probe",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}},
                ]}}},
            }],
        },
    }


def probe_pod_spec(tj: Obj) -> Obj:
    """The pod spec of our probe's runtime patch as the server stored it."""
    for entry in tj["spec"].get("runtimePatches") or []:
        if entry.get("manager") == "dispatch.test/probe":
            rj = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
            spec: Obj = rj["template"]["spec"]["template"].get("spec") or {}
            return spec
    raise AssertionError(f"probe patch missing: {tj['spec'].get('runtimePatches')}")


def test_grace_period_in_a_runtime_patch(ns: str) -> None:
    """Trainer v2.3 keeps terminationGracePeriodSeconds in a pod-spec patch and puts it on the pods;
    earlier versions prune it silently (the field is unknown to their CRD schema)."""
    body = json.dumps(trainjob("grace", ns, suspend=False))
    strict = testbed.kubectl("create", "--dry-run=server", "-f", "-", input=body, check=False)
    unknown = "unknown field \"spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]" \
              ".template.spec.template.spec.terminationGracePeriodSeconds\""
    # kubectl asks for strict field validation: refused where the schema lacks the field.
    assert (strict.returncode == 0) == trainer_at_least(2, 3), strict.stderr
    if not trainer_at_least(2, 3):
        assert unknown in strict.stderr
    # A client that does not ask (the server default, "Warn") gets it pruned, with only a warning.
    warn = testbed.kubectl("create", "--dry-run=server", "--validate=warn", "-o", "json", "-f", "-", input=body)
    assert probe_pod_spec(json.loads(warn.stdout)).get("terminationGracePeriodSeconds") == (
        GRACE if trainer_at_least(2, 3) else None)
    assert (unknown in warn.stderr) == (not trainer_at_least(2, 3))
    testbed.kubectl("create", "--validate=warn", "-f", "-", input=body)
    sel = "jobset.sigs.k8s.io/jobset-name=grace"
    wait_for("2 pods", lambda: len(get("pods", "-n", ns, "-l", sel)["items"]) == 2)
    graces = {p["spec"].get("terminationGracePeriodSeconds") for p in get("pods", "-n", ns, "-l", sel)["items"]}
    assert graces == {GRACE if trainer_at_least(2, 3) else 30}  # 30: the Pod API's default
    if trainer_at_least(2, 3):
        # Immutable once set (a CEL transition rule), even while suspended.
        testbed.kubectl("patch", "trainjob", "grace", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        tj = get("trainjob", "grace", "-n", ns)
        tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
            "template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = GRACE + 1
        refused = testbed.kubectl("replace", "-f", "-", input=json.dumps(tj), check=False)
        assert refused.returncode != 0
        assert "field is immutable" in refused.stderr


def test_runtime_snapshot_configmap(ns: str) -> None:
    """Trainer v2.3 snapshots the runtime into ConfigMap <trainjob>-runtime-snapshot (owned by the TrainJob)
    on its first reconcile, even while suspended; v2.2 keeps no snapshot."""
    testbed.kubectl("create", "-f", "-", input=json.dumps(trainjob("snap", ns, suspend=True, grace=None)))
    uid = get("trainjob", "snap", "-n", ns)["metadata"]["uid"]
    if trainer_at_least(2, 3):
        wait_for("runtime snapshot", lambda: testbed.kubectl(
            "get", "configmap", "snap-runtime-snapshot", "-n", ns, check=False).returncode == 0)
        cm = get("configmap", "snap-runtime-snapshot", "-n", ns)
        owner = cm["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner.get("controller")) == ("TrainJob", uid, True)
        assert "torch-distributed" in cm["data"]["runtime"]
    else:
        wait_for("JobSet of the suspended TrainJob", lambda: bool(get("jobsets", "-n", ns)["items"]))
        names = [c["metadata"]["name"] for c in get("configmaps", "-n", ns)["items"]]
        assert "snap-runtime-snapshot" not in names


def test_kueue_admission_and_fields_it_does_not_know(testbed_kubeconfig: str) -> None:
    """Kueue admits a queued TrainJob by a full update of it, typed with the Trainer API it was compiled
    against (v2.2.x for Kueue v0.17 and v0.19): a field that Trainer API lacks is dropped from every
    runtime patch, not only Kueue's own. v0.19 also marks the Workload PodsReady (WaitForPodsReady is on)."""
    name = f"kq-{uuid.uuid4().hex[:5]}"
    body = trainjob(name, "default", suspend=False, labels={"kueue.x-k8s.io/queue-name": "lq"})
    testbed.kubectl("create", "--validate=warn", "-f", "-", input=json.dumps(body))
    try:
        before = probe_pod_spec(get("trainjob", name, "-n", "default"))
        assert before.get("terminationGracePeriodSeconds") == (GRACE if trainer_at_least(2, 3) else None)

        def workload() -> Obj | None:
            items: list[Obj] = get("workloads", "-n", "default")["items"]
            return next((wl for wl in items
                         if any(o["name"] == name for o in wl["metadata"].get("ownerReferences", []))), None)

        def cond(wl: Obj | None, kind: str) -> bool:
            return wl is not None and any(
                c["type"] == kind and c["status"] == "True" for c in wl.get("status", {}).get("conditions", []))

        wait_for("Workload admitted", lambda: cond(workload(), "Admitted"))
        wait_for("unsuspended", lambda: get("trainjob", name, "-n", "default")["spec"].get("suspend") is False)
        after = get("trainjob", name, "-n", "default")
        managers = [e["manager"] for e in after["spec"]["runtimePatches"]]
        assert "dispatch.test/probe" in managers and "kueue.x-k8s.io/manager" in managers
        spec = probe_pod_spec(after)
        assert spec.get("nodeSelector") == {"kubernetes.io/os": "linux"}  # a field Kueue's types know: kept
        assert "terminationGracePeriodSeconds" not in spec  # dropped by Kueue's update (or never accepted)
        sel = f"jobset.sigs.k8s.io/jobset-name={name}"
        wait_for("2 pods", lambda: len(get("pods", "-n", "default", "-l", sel)["items"]) == 2)
        graces = {p["spec"].get("terminationGracePeriodSeconds")
                  for p in get("pods", "-n", "default", "-l", sel)["items"]}
        assert graces == {30}  # the Pod API's default: the patch's grace period never reached the pods
        if kueue_at_least(0, 19):
            wait_for("Workload PodsReady", lambda: cond(workload(), "PodsReady"), timeout=90)
        else:
            time.sleep(5)
            wl = workload()
            assert wl is not None
            assert not any(c["type"] == "PodsReady" for c in wl.get("status", {}).get("conditions", []))
    finally:
        testbed.kubectl("delete", "trainjob", name, "-n", "default", "--wait=false", check=False)


def test_kueue_api_versions(testbed_kubeconfig: str) -> None:
    """Kueue v0.17 and v0.19 alike serve v1beta1 (deprecated, with a warning) and v1beta2 (stored and
    preferred): v0.19 changes nothing here; v0.20 is the release that stops serving v1beta1."""
    group = json.loads(testbed.kubectl("get", "--raw", "/apis/kueue.x-k8s.io").stdout)
    assert sorted(v["version"] for v in group["versions"]) == ["v1beta1", "v1beta2"]
    assert group["preferredVersion"]["version"] == "v1beta2"
    crd = get("crd", "workloads.kueue.x-k8s.io")
    assert [v["name"] for v in crd["spec"]["versions"] if v.get("storage")] == ["v1beta2"]
    assert [v["name"] for v in crd["spec"]["versions"] if v.get("deprecated")] == ["v1beta1"]
    listed = testbed.kubectl("get", "workloads.v1beta1.kueue.x-k8s.io", "-A", check=False)
    assert listed.returncode == 0
    assert "deprecated" in listed.stderr.lower()
