"""The seed's scenarios on the real control plane (plain mode): real Trainer, JobSet, Job controller,
scheduler, KWOK kubelets, node lifecycle, taint eviction and PodGC. Each asserts what it observes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, Adapter, JobSpec, PodsRemain, Refused, State
from dispatch import testbed as tb
from dispatch._views import PodView
from dispatch.testbed.harness import role_kubeconfig_file, scoped_pods

pytestmark = pytest.mark.testbed
Obj = dict[str, Any]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    name = f"seed-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", name)
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def adapter(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a user bound to the shipped dispatch-writer role in ``ns`` (and the node reader)."""
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


@pytest.fixture
def admin(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a cluster admin of dispatch: the shipped dispatch-admin role only (``release_pod``)."""
    with role_kubeconfig_file(ns, tmp_path, "dispatch-admin") as path, Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


def get(*args: str) -> Obj:
    out: Obj = json.loads(tb.kubectl("get", *args, "-o", "json").stdout)
    return out


def pods(ns: str, name: str) -> list[Obj]:
    items: list[Obj] = get("pods", "-n", ns, "-l", f"{JOBSET_LABEL}={name}")["items"]
    return items


def live(ns: str, name: str) -> list[Obj]:
    return [
        p for p in pods(ns, name) if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
    ]


def admitted(adapter: Adapter, name: str, expect: int) -> bool:
    """One release attempt: True once it admits (as ``expect``), False while pods remain."""
    try:
        got = adapter.release(name).admission
    except PodsRemain:
        return False
    assert got == expect
    return True


def ended(ns: str, name: str) -> bool:
    """Every pod of the object ended as its kubelet reports (terminal phase, containers terminated)."""
    return all(PodView.from_obj(p).kubelet_confirmed for p in pods(ns, name))


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


def spec(job_id: str, **extra: Any) -> JobSpec:
    return JobSpec(job_id=job_id, submission="s1", num_nodes=1, resources_per_node={"cpu": "1"}, **extra)


def admissions_running(ns: str, name: str) -> set[str]:
    return {
        p["metadata"]["labels"].get(LABEL_ADMISSION, "?")
        for p in pods(ns, name)
        if p["status"].get("phase") not in ("Succeeded", "Failed")
    }


def start(adapter: Adapter, ns: str, job_spec: JobSpec, expect: int = 1) -> str:
    name = f"{job_spec.job_id}-{job_spec.submission}"
    adapter.open(job_spec)
    assert adapter.release(name).admission == expect
    wait_for("its pod Running", lambda: len(live(ns, name)) == (job_spec.num_nodes or 1))
    assert admissions_running(ns, name) == {str(expect)}
    return name


def test_suspended_pods_stay_terminating_while_jobset_active_is_already_zero(adapter: Adapter, ns: str) -> None:
    name = start(adapter, ns, spec("grace", pod_annotations={tb.ANN_DELETE_DELAY: "25s"}))
    pod = live(ns, name)[0]["metadata"]["name"]
    adapter.hold(name)
    wait_for("the pod Terminating", lambda: "deletionTimestamp" in get("pod", pod, "-n", ns)["metadata"])
    wait_for(
        "JobSet active == 0",
        lambda: all(
            r.get("active", 0) == 0
            for r in get("jobset", name, "-n", ns).get("status", {}).get("replicatedJobsStatus", [])
        ),
    )
    assert pods(ns, name), "the pod should still be Terminating"
    # The seed's broken assumption, kept as a test of upstream behaviour: Trainer's webhook accepts a
    # runtime-patch change now, although the previous execution's pod still runs.
    probe = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "runtimePatches": [
                {
                    "manager": "example.com/probe",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {"template": {"metadata": {"labels": {"example.com/probe": "1"}}}}
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ]
        },
    }
    accepted = tb.kubectl(
        "apply", "--server-side", "--field-manager=probe", "-f", "-", input=json.dumps(probe), check=False
    )
    assert accepted.returncode == 0, accepted.stderr
    with pytest.raises(PodsRemain) as err:
        adapter.release(name)
    assert f"{pod} on " in str(err.value)
    assert adapter.inspect(name).state is State.HELD
    # Changed with dispatch's pod finalizer: the pod no longer goes by itself; it ends (its kubelet reports
    # Failed, containers terminated) and dispatch's finalizer holds it until release frees it.
    wait_for("the pod ended as its kubelet reports", lambda: ended(ns, name), timeout=90)
    assert adapter.release(name).admission == 2
    wait_for("the new pod Running", lambda: len(live(ns, name)) == 1)
    assert admissions_running(ns, name) == {"2"}


def test_a_freshly_held_object_is_refused_until_every_layer_has_stopped(adapter: Adapter, ns: str) -> None:
    """Is a suspended TrainJob suspended all the way down at once? Whatever the lag, release refuses.

    Its pod takes 10 s to end once deleted (KWOK's delay; a real one is its grace period): on a busy
    machine KWOK once ended it before the first release after hold was even sent, so nothing was refused."""
    name = start(adapter, ns, spec("lag", pod_annotations={tb.ANN_DELETE_DELAY: "10s"}))
    adapter.hold(name)
    observed: list[str] = []
    while True:
        try:
            adapter.release(name)
            break
        except PodsRemain as err:
            if not observed or observed[-1] != err.detail:
                observed.append(err.detail)
            time.sleep(0.2)
    print("release refusals while the layers caught up:", *observed, sep="\n  ")
    assert observed, "the release right after hold must be refused"
    wait_for("the new pod Running", lambda: len(live(ns, name)) == 1)
    assert admissions_running(ns, name) == {"2"}


@pytest.fixture
def pods_policy(ns: str) -> Iterator[None]:
    """The shipped ``dispatch-pods`` policy of this tree, narrowed to ``ns`` (``scoped_pods``): the test holds on
    its own, whether or not an earlier test left the cluster-wide one installed."""
    name = f"dispatch-pods-{ns}"
    for doc in scoped_pods(ns, name):
        tb.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    yield
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        tb.kubectl("delete", kind, name, "--ignore-not-found", check=False)


def test_a_pod_without_dispatch_labels_still_blocks_through_jobset_name(
        adapter: Adapter, ns: str, pods_policy: None) -> None:
    name = start(adapter, ns, spec("relabel"))
    pod = live(ns, name)[0]["metadata"]["name"]
    # The labels that say whose a pod is are kept by the dispatch-pods policy, even against the cluster's admin
    # (a policy reaches admission a second or so after its creation: probe with a server-side dry run first).
    whose = ("dispatch.phpboyscout.uk/job-id-", "dispatch.phpboyscout.uk/submission-",
             "dispatch.phpboyscout.uk/admission-")
    wait_for("the dispatch-pods policy in force", lambda: "dispatch-pods" in tb.kubectl(
        "label", "--dry-run=server", "pod", pod, "-n", ns, *whose, check=False).stderr)
    refused = tb.kubectl("label", "pod", pod, "-n", ns, *whose, check=False)
    assert refused.returncode != 0 and "dispatch-pods" in refused.stderr, refused.stderr
    # A pod that carries only JobSet's label (made by hand, or by a JobSet that lost dispatch's entry) is
    # still found by the second selection, and blocks while it may run (unscheduled, not deleted).
    adapter.hold(name)
    wait_for("the object's own pods ended", lambda: ended(ns, name))
    stray = f"{name}-stray"
    tb.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": stray, "namespace": ns, "labels": {"jobset.sigs.k8s.io/jobset-name": name}},
        "spec": {"nodeSelector": {"dispatch.example/nowhere": "true"},
                 "containers": [{"name": "c", "image": "registry.invalid/none"}]}}))
    with pytest.raises(PodsRemain, match=stray):
        adapter.release(name)
    tb.kubectl("delete", "pod", stray, "-n", ns, "--wait=true")
    assert adapter.release(name).admission == 2


def test_a_succeeded_pod_waiting_for_deletion_does_not_block(adapter: Adapter, ns: str) -> None:
    name = start(adapter, ns, JobSpec(job_id="rank", submission="s1", num_nodes=2, resources_per_node={"cpu": "1"}))
    first, second = sorted(p["metadata"]["name"] for p in live(ns, name))
    tb.kubectl("annotate", "pod", first, "-n", ns, f"{tb.ANN_COMPLETE}=true")
    wait_for("one rank Succeeded", lambda: get("pod", first, "-n", ns)["status"]["phase"] == "Succeeded")
    adapter.hold(name)
    # Changed with dispatch's pod finalizer: the other rank no longer goes by itself; it ends as its kubelet
    # reports and dispatch's finalizer holds it until release frees it.
    wait_for("the other rank ended", lambda: PodView.from_obj(get("pod", second, "-n", ns)).kubelet_confirmed)
    assert get("pod", first, "-n", ns)["status"]["phase"] == "Succeeded"  # kept across the suspend
    assert adapter.release(name).admission == 2


def _ready(node: str) -> str:
    for c in get("node", node)["status"].get("conditions", []):
        if c["type"] == "Ready":
            return str(c["status"])
    return "?"


def test_frozen_node_then_out_of_service_taint(adapter: Adapter, admin: Adapter, ns: str) -> None:
    node = tb.freezable_nodes()[0]
    name = start(adapter, ns, spec("frozen", node_selector={"kubernetes.io/hostname": node}))
    pod = live(ns, name)[0]["metadata"]["name"]
    tb.freeze(node)
    try:
        adapter.hold(name)
        wait_for("Ready=Unknown", lambda: _ready(node) == "Unknown", timeout=90)
        wait_for("the pod Terminating", lambda: "deletionTimestamp" in get("pod", pod, "-n", ns)["metadata"])
        status = adapter.inspect(name)
        assert status.cause.detail == f"remaining pods: {pod} on {node} (Ready=Unknown)", status.cause
        with pytest.raises(PodsRemain, match=rf"{pod} on {node} \(Ready=Unknown\)"):
            adapter.release(name)
        assert not adapter.ceased(name).ceased
        time.sleep(5)
        assert pods(ns, name), "a pod on a frozen node must stay Terminating"
        tb.kubectl("taint", "node", node, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
        cessation = adapter.ceased(name)
        assert cessation.ceased, cessation.reason
        assert adapter.inspect(name).cause.detail.startswith(
            f"remaining pods: {pod} on {node} (Ready=Unknown, out-of-service)")
        # Changed with dispatch's pod finalizer: PodGC can no longer remove the pod by itself. Its end is proven
        # by the taint; freeing it is the controller keeper's (no controller runs here), or, as the status says,
        # the admin's `dispatch admin release-pod`. The pod then goes once PodGC has marked it Failed and the
        # Job controller dropped its own finalizer, and release admits.
        assert admin.release_pod(pod).proof == "out-of-service"
        wait_for("the pod to go and release to admit", lambda: admitted(adapter, name, 2), timeout=150)
        assert pod not in [p["metadata"]["name"] for p in pods(ns, name)]
    finally:
        tb.kubectl("taint", "node", node, "node.kubernetes.io/out-of-service-", check=False)
        tb.thaw(node)
        wait_for("node Ready again", lambda: _ready(node) == "True", timeout=90)
        adapter.hold(name)


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
def test_deleted_node_shows_gone_then_admission(adapter: Adapter, admin: Adapter, ns: str) -> None:
    node = tb.freezable_nodes()[-1]
    saved = get("node", node)
    name = start(adapter, ns, spec("gone", node_selector={"kubernetes.io/hostname": node}))
    pod = live(ns, name)[0]["metadata"]["name"]
    tb.freeze(node)
    try:
        adapter.hold(name)
        wait_for("the pod Terminating", lambda: "deletionTimestamp" in get("pod", pod, "-n", ns)["metadata"])
        tb.kubectl("delete", "node", node)
        status = adapter.inspect(name)
        assert status.cause.detail.startswith(f"remaining pods: {pod} on {node} (gone)"), status.cause
        # Changed with issue 40: a deletion alone proves nothing to a plain read (a live kubelet runs on after
        # it); only the controller's keeper, which saw this Node Ready=Unknown when it was deleted, takes it as
        # proof (none runs here). The operator's word, as status names it, frees the pod: this machine is "down"
        # (its KWOK kubelet frozen). Once PodGC marked it Failed and the Job controller dropped its own finalizer,
        # it goes and release admits.
        cessation = adapter.ceased(name)
        assert not cessation.ceased and "was deleted, which proves nothing by itself" in cessation.reason
        with pytest.raises(Refused):
            admin.release_pod(pod)
        assert admin.release_pod(pod, node_confirmed_down=True).proof == "operator-confirmed"
        wait_for("the pod to go and release to admit", lambda: admitted(adapter, name, 2), timeout=150)
        assert pod not in [p["metadata"]["name"] for p in pods(ns, name)]
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            saved["metadata"].pop(key, None)
        saved.pop("status", None)
        saved["spec"].pop("taints", None)
        tb.kubectl("apply", "-f", "-", input=json.dumps(saved), check=False)
        tb.thaw(node)
        wait_for("node Ready again", lambda: _ready(node) == "True", timeout=90)
        adapter.hold(name)


def test_grace_period_in_runtime_patch_is_refused_where_trainer_would_drop_it(adapter: Adapter, ns: str) -> None:
    """Trainer v2.2 prunes terminationGracePeriodSeconds from runtime patches: open says so, writes nothing."""
    from dispatch import InvalidInput

    version = tb.versions()["TRAINER_VERSION"]
    if not version.startswith("v2.2"):
        pytest.skip(f"Trainer {version} keeps the field")
    with pytest.raises(InvalidInput, match="termination_grace_period_seconds"):
        adapter.open(spec("grace2", termination_grace_period_seconds=5))
    assert get("trainjobs", "-n", ns)["items"] == []
