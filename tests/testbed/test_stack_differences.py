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
from pathlib import Path
from typing import Any

import pytest

from dispatch import testbed
from dispatch.testbed.harness import role_kubeconfig_file

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
        path = ("/spec/runtimePatches/0/trainingRuntimeSpec/template/spec/replicatedJobs/0/template/spec/template"
                "/spec/terminationGracePeriodSeconds")
        refused = testbed.kubectl("patch", "trainjob", "grace", "-n", ns, "--type=json", "-p",
                                  json.dumps([{"op": "replace", "path": path, "value": GRACE + 1}]), check=False)
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


def _workload_of(name: str, ns: str) -> Obj | None:
    items: list[Obj] = get("workloads", "-n", ns)["items"]
    return next((wl for wl in items if any(o["name"] == name for o in wl["metadata"].get("ownerReferences", []))),
                None)


def _cond(obj: Obj | None, kind: str) -> bool:
    return obj is not None and any(
        c["type"] == kind and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def test_kueue_admission_drops_fields_its_trainer_api_lacks(ns: str) -> None:
    """Kueue admits a queued TrainJob by a full update of it, typed with the Trainer API it was compiled
    against (v2.2.x for Kueue v0.17 and v0.19): a field that API lacks is dropped from every runtime patch,
    not only Kueue's own. With Trainer v2.3 what follows depends on who acts first: if Trainer made the
    (suspended) JobSet before Kueue's update, the JobSet carries the grace period, Trainer's update removing
    it is refused (a JobSet's pod template is immutable there) and the TrainJob never starts; if Kueue's
    update came first, the pods start without the grace period. Either way the field is lost, which is why
    ``open`` refuses a grace period together with a queue."""
    testbed.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
        "spec": {"clusterQueue": "cq"}}))
    name = "kq"
    body = trainjob(name, ns, suspend=False, labels={"kueue.x-k8s.io/queue-name": "lq"})
    # What the API server stored at creation (read back later, Kueue may already have rewritten it).
    created = json.loads(testbed.kubectl("create", "--validate=warn", "-o", "json", "-f", "-",
                                         input=json.dumps(body)).stdout)
    before = probe_pod_spec(created)
    assert before.get("terminationGracePeriodSeconds") == (GRACE if trainer_at_least(2, 3) else None)
    wait_for("Workload admitted", lambda: _cond(_workload_of(name, ns), "Admitted"))
    wait_for("unsuspended", lambda: get("trainjob", name, "-n", ns)["spec"].get("suspend") is False)
    after = get("trainjob", name, "-n", ns)
    managers = [e["manager"] for e in after["spec"]["runtimePatches"]]
    assert "dispatch.test/probe" in managers and "kueue.x-k8s.io/manager" in managers
    spec = probe_pod_spec(after)
    assert spec.get("nodeSelector") == {"kubernetes.io/os": "linux"}  # a field Kueue's types know: kept
    assert "terminationGracePeriodSeconds" not in spec  # dropped by Kueue's update (or never accepted)
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    js = get("jobset", name, "-n", ns)
    node = next(rj for rj in js["spec"]["replicatedJobs"] if rj["name"] == "node")
    if trainer_at_least(2, 3) and node["template"]["spec"]["template"]["spec"].get(
            "terminationGracePeriodSeconds") == GRACE:
        def refused() -> bool:
            # (the event's message is cut short before the webhook's reason, "field is immutable")
            return any(e["reason"] == "TrainJobResourcesCreationFailed" and "denied the request" in e["message"]
                       for e in get("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"])

        wait_for("Trainer's JobSet update refused", refused)
        assert js["spec"].get("suspend") is True
        path = "/spec/replicatedJobs/0/template/spec/template/spec/terminationGracePeriodSeconds"
        update = testbed.kubectl("patch", "jobset", name, "-n", ns, "--dry-run=server", "--type=json", "-p",
                                 json.dumps([{"op": "replace", "path": path, "value": 30}]), check=False)
        assert update.returncode != 0 and "field is immutable" in update.stderr  # what Trainer's update meets
        time.sleep(5)
        assert get("pods", "-n", ns, "-l", sel)["items"] == []  # stuck: admitted by Kueue, never started
        assert get("jobset", name, "-n", ns)["spec"].get("suspend") is True
    else:
        wait_for("2 pods", lambda: len(get("pods", "-n", ns, "-l", sel)["items"]) == 2)
        graces = {p["spec"].get("terminationGracePeriodSeconds") for p in get("pods", "-n", ns, "-l", sel)["items"]}
        assert graces == {30}  # the Pod API's default: the patch's grace period never reached the pods


def test_kueue_marks_pods_ready(ns: str) -> None:
    """WaitForPodsReady is on by default from Kueue v0.19 (a Workload whose pods are not all Ready within
    30 minutes is evicted): the Workload gains a PodsReady condition; v0.17 (off by default) never writes it."""
    testbed.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
        "spec": {"clusterQueue": "cq"}}))
    body = trainjob("ready", ns, suspend=False, grace=None, labels={"kueue.x-k8s.io/queue-name": "lq"})
    testbed.kubectl("create", "-f", "-", input=json.dumps(body))
    sel = "jobset.sigs.k8s.io/jobset-name=ready"
    wait_for("2 Running pods", lambda: [p["status"].get("phase") for p in get("pods", "-n", ns, "-l", sel)["items"]]
             == ["Running", "Running"])
    if kueue_at_least(0, 19):
        wait_for("Workload PodsReady", lambda: _cond(_workload_of("ready", ns), "PodsReady"), timeout=90)
    else:
        time.sleep(5)
        wl = _workload_of("ready", ns)
        assert wl is not None
        assert not any(c["type"] == "PodsReady" for c in wl.get("status", {}).get("conditions", []))


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


@pytest.mark.parametrize("cover_pods", [False, True])
def test_admission_checks_of_a_workload_that_requests_nothing(ns: str, cover_pods: bool) -> None:
    """Kueue v0.19 applies a ClusterQueue's admission checks per assigned flavor: a Workload whose pods
    request none of the covered resources gets no flavor, and is admitted at once with no check at all.
    v0.17 attached the check regardless. Covering `pods` gives every Workload a flavor, so the check holds."""
    check = f"probe-{ns}"
    covered = ["cpu", "memory"] + (["pods"] if cover_pods else [])
    quota = [{"name": "cpu", "nominalQuota": "8"}, {"name": "memory", "nominalQuota": "32Gi"}]
    quota += [{"name": "pods", "nominalQuota": "100"}] if cover_pods else []
    api = "kueue.x-k8s.io/v1beta2"
    objs = [
        {"apiVersion": api, "kind": "AdmissionCheck", "metadata": {"name": check},
         "spec": {"controllerName": f"dispatch.test/{check}"}},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": check},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [{"coveredResources": covered,
                                      "flavors": [{"name": "default", "resources": quota}]}],
                  "admissionChecksStrategy": {"admissionChecks": [{"name": check}]}}},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
         "spec": {"clusterQueue": check}},
    ]
    testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    try:
        # The check's controller (this test) says it is there: the ClusterQueue turns Active.
        status = {"status": {"conditions": [{"type": "Active", "status": "True", "reason": "Probe", "message": "",
                                             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        testbed.kubectl("patch", "admissioncheck", check, "--subresource=status", "--type=merge",
                        "-p", json.dumps(status))
        wait_for("ClusterQueue Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in get("clusterqueue", check).get("status", {}).get("conditions", [])))
        body = trainjob("bare", ns, suspend=False, grace=None, labels={"kueue.x-k8s.io/queue-name": "lq"})
        del body["spec"]["trainer"]["resourcesPerNode"]  # pods that request nothing
        testbed.kubectl("create", "-f", "-", input=json.dumps(body))

        def workload() -> Obj | None:
            items: list[Obj] = get("workloads", "-n", ns)["items"]
            return items[0] if items else None

        def reserved() -> bool:
            wl = workload()
            return wl is not None and any(c["type"] == "QuotaReserved" and c["status"] == "True"
                                          for c in wl.get("status", {}).get("conditions", []))

        wait_for("quota reserved", reserved)
        time.sleep(3)  # what Kueue does next happens within its own reconcile, not later
        wl = workload()
        assert wl is not None
        st = wl.get("status", {})
        admitted = any(c["type"] == "Admitted" and c["status"] == "True" for c in st.get("conditions", []))
        checks = [(c["name"], c["state"]) for c in st.get("admissionChecks") or []]
        if kueue_at_least(0, 19) and not cover_pods:
            assert (admitted, checks) == (True, [])  # the check was skipped
            assert get("trainjob", "bare", "-n", ns)["spec"].get("suspend") is False
        else:
            assert (admitted, checks) == (False, [(check, "Pending")])
            assert get("trainjob", "bare", "-n", ns)["spec"].get("suspend") is True
    finally:
        testbed.kubectl("delete", "trainjob", "bare", "-n", ns, "--ignore-not-found", "--wait=true", check=False)
        testbed.kubectl("delete", "localqueue", "lq", "-n", ns, "--ignore-not-found", check=False)
        testbed.kubectl("delete", "clusterqueue", check, "--ignore-not-found", "--wait=false", check=False)
        testbed.kubectl("delete", "admissioncheck", check, "--ignore-not-found", "--wait=false", check=False)


def _grace_spec(job_id: str, **extra: Any) -> Any:
    from dispatch import JobSpec

    return JobSpec(job_id=job_id, submission="s1", num_nodes=1, resources_per_node={"cpu": "1"},
                   termination_grace_period_seconds=5, **extra)


@pytest.mark.skipif(not trainer_at_least(2, 3), reason="Trainer before v2.3 drops the field: open refuses it "
                    "(test_seed_scenarios.py::test_grace_period_in_runtime_patch_is_refused_where_trainer_would_drop_it)")
def test_open_with_a_grace_period_reaches_the_pods_on_trainer_2_3(ns: str, tmp_path: Path) -> None:
    """Where Trainer keeps the field, dispatch's own patch carries the grace period to every pod."""
    from dispatch import Adapter

    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as adapter:
        adapter.open(_grace_spec("grace"), hold=False)
    sel = "jobset.sigs.k8s.io/jobset-name=grace-s1"
    wait_for("pod", lambda: bool(get("pods", "-n", ns, "-l", sel)["items"]))
    assert {p["spec"]["terminationGracePeriodSeconds"] for p in get("pods", "-n", ns, "-l", sel)["items"]} == {5}


def test_open_refuses_a_grace_period_that_kueue_would_drop(ns: str, tmp_path: Path) -> None:
    from dispatch import Adapter, InvalidInput

    testbed.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": ns},
        "spec": {"clusterQueue": "cq"}}))
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as adapter, \
            pytest.raises(InvalidInput, match="termination_grace_period_seconds") as err:
        adapter.open(_grace_spec("kgrace", queue="lq"))
    assert "Kueue admits a TrainJob with a whole-object update" in str(err.value)
    assert get("trainjobs", "-n", ns)["items"] == []
