"""dispatch's pod finalizer on the real control plane (issue 11, items 3 and 8).

Real Trainer, JobSet, Job controller, PodGC, taint manager and scheduler; KWOK plays the kubelets, and a
frozen KWOK is a node whose kubelet stopped answering. Each test asserts what it observes, and prints
what the control plane wrote, for the findings note.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, POD_FINALIZER, Adapter, JobSpec, PodsRemain, State
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.controller import Config, Controller
from dispatch.testbed.harness import keeper_pass, role_kubeconfig_file

pytestmark = pytest.mark.testbed
Obj = dict[str, Any]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
OOS = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    name = f"fin-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", name)
    yield name
    _unstick(name)
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _unstick(namespace: str) -> None:
    """Test hygiene only: a test that failed half-way must not leave a namespace that never goes."""
    for p in get("pods", "-n", namespace)["items"]:
        if POD_FINALIZER in (p["metadata"].get("finalizers") or []):
            rest = [f for f in p["metadata"]["finalizers"] if f != POD_FINALIZER]
            tb.kubectl("patch", "pod", p["metadata"]["name"], "-n", namespace, "--type=merge",
                       "-p", json.dumps({"metadata": {"finalizers": rest}}), check=False)


@pytest.fixture
def adapter(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a user bound to the shipped dispatch-writer role in ``ns`` (and the node reader)."""
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


@pytest.fixture
def admin(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a cluster admin of dispatch (the shipped dispatch-admin role only, for ``release_pod``),
    an account of ``default``: an admin is nobody of the namespace a test deletes."""
    with role_kubeconfig_file(ns, tmp_path, "dispatch-admin", home="default") as path, \
            Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


def get(*args: str) -> Obj:
    out: Obj = json.loads(tb.kubectl("get", *args, "-o", "json").stdout)
    return out


def pods(ns: str, name: str) -> list[Obj]:
    items: list[Obj] = get("pods", "-n", ns, "-l", f"{JOBSET_LABEL}={name}")["items"]
    return items


def pod_or_none(ns: str, name: str) -> Obj | None:
    found = tb.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def live(ns: str, name: str) -> list[Obj]:
    return [p for p in pods(ns, name)
            if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


def describe(p: Obj) -> str:
    m, st = p["metadata"], p.get("status", {})
    states = [next(iter(c.get("state", {"?": 0}))) for c in st.get("containerStatuses", [])]
    conds = [f"{c['type']}={c['status']}({c.get('reason', '')})" for c in st.get("conditions", [])
             if c["type"] == "DisruptionTarget"]
    return (f"{m['name']} phase={st.get('phase')} containers={states} deletionTimestamp={m.get('deletionTimestamp')} "
            f"grace={m.get('deletionGracePeriodSeconds')} finalizers={m.get('finalizers')} {' '.join(conds)}")


def ready(node: str) -> str:
    for c in get("node", node)["status"].get("conditions", []):
        if c["type"] == "Ready":
            return str(c["status"])
    return "?"


def start(adapter: Adapter, ns: str, job_spec: JobSpec) -> str:
    name = f"{job_spec.job_id}-{job_spec.submission}"
    adapter.open(job_spec)
    assert adapter.release(name).admission == 1
    wait_for("its pod Running", lambda: len(live(ns, name)) == 1)
    return name


def on(node: str, job_id: str, **extra: Any) -> JobSpec:
    return JobSpec(job_id=job_id, submission="s1", num_nodes=1, resources_per_node={"cpu": "1"},
                   node_selector={"kubernetes.io/hostname": node}, **extra)


class RunningController:
    """The real controller (its finalizer keeper included) in a thread, against the testbed, holding the shipped
    controller role."""

    def __init__(self, namespace: str) -> None:
        self.namespace, self.kubeconfig = namespace, ""
        self.roles = contextlib.ExitStack()
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        kube = k.Kube.connect(kubeconfig=self.kubeconfig)
        try:
            await Controller(kube, Config(namespace=self.namespace, events=False, resync_seconds=5)).run(self.stop)
        finally:
            await kube.aclose()

    def __enter__(self) -> RunningController:
        # exactly the shipped controller role, bound as deploy/ binds it
        directory = self.roles.enter_context(tempfile.TemporaryDirectory())
        self.kubeconfig = str(self.roles.enter_context(
            role_kubeconfig_file(self.namespace, Path(directory), "dispatch-controller")))
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)
        self.roles.close()


# ---------------------------------------------------------------- force delete on a frozen node


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
def test_a_force_deleted_pod_on_a_frozen_node_stays_and_blocks_until_the_taint(adapter: Adapter, ns: str) -> None:
    node = tb.freezable_nodes()[0]
    name = start(adapter, ns, on(node, "force"))
    pod = live(ns, name)[0]["metadata"]["name"]
    assert POD_FINALIZER in get("pod", pod, "-n", ns)["metadata"]["finalizers"]
    tb.freeze(node)
    try:
        adapter.hold(name)
        wait_for("Ready=Unknown", lambda: ready(node) == "Unknown")
        wait_for("the pod Terminating", lambda: "deletionTimestamp" in get("pod", pod, "-n", ns)["metadata"])
        forced = tb.kubectl("delete", "pod", pod, "-n", ns, "--force", "--grace-period=0", "--wait=false")
        print("kubectl:", forced.stdout.strip(), forced.stderr.strip())
        time.sleep(25)  # PodGC runs every 20 s: let it (and the Job controller) do what they do
        left = pod_or_none(ns, pod)
        assert left is not None, "a force delete must not remove a pod that carries dispatch's finalizer"
        print("after the force delete:", describe(left))
        assert left["metadata"]["deletionGracePeriodSeconds"] == 0
        assert left["metadata"]["finalizers"] == [POD_FINALIZER]
        with pytest.raises(PodsRemain, match=rf"{pod} on {node} \(Ready=Unknown\)"):
            adapter.release(name)
        cessation = adapter.ceased(name)
        assert not cessation.ceased, cessation.reason
        assert [(e.name, e.proof) for e in cessation.ends] == [(pod, "unproven")]
        status = adapter.inspect(name)
        assert status.state is State.HELD
        assert f"dispatch admin release-pod {pod} --node-confirmed-down" in status.cause.detail

        # Someone other than its kubelet writes Failed (Kueue's FailureRecoveryPolicy does, as PodGC does
        # on out-of-service nodes): that proves nothing.
        tb.kubectl("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge",
                   "-p", json.dumps({"status": {"phase": "Failed"}}))
        assert get("pod", pod, "-n", ns)["status"]["phase"] == "Failed"
        with pytest.raises(PodsRemain, match=pod):
            adapter.release(name)
        assert not adapter.ceased(name).ceased

        tb.kubectl("taint", "node", node, OOS)
        cessation = adapter.ceased(name)
        assert cessation.ceased, cessation.reason
        assert [e.proof for e in cessation.ends] == ["out-of-service"]
        time.sleep(25)
        left = pod_or_none(ns, pod)
        assert left is not None, "PodGC's delete cannot remove it either: only dispatch does"
        print("after the taint and PodGC:", describe(left))
        with pytest.raises(PodsRemain, match="dispatch's controller removes dispatch's finalizer"):
            adapter.release(name)  # proven, but the writer may not free it: the controller's keeper does
        assert keeper_pass(ns) == {f"{ns}/{pod}": "out-of-service"}
        assert adapter.release(name).admission == 2
        wait_for("the freed pod gone", lambda: pod_or_none(ns, pod) is None, timeout=30)
    finally:
        tb.kubectl("taint", "node", node, "node.kubernetes.io/out-of-service-", check=False)
        tb.thaw(node)
        wait_for("node Ready again", lambda: ready(node) == "True", timeout=90)
        adapter.hold(name)


# ---------------------------------------------------------------- the finalizer's lifecycle


def test_the_finalizer_lifecycle_pod_terminal_then_finalizer_removed_then_pod_gone(
    adapter: Adapter, ns: str, testbed_kubeconfig: str
) -> None:
    node = tb.regular_nodes()[0]
    name = start(adapter, ns, on(node, "life", pod_annotations={tb.ANN_DELETE_DELAY: "2s"}))
    pod = live(ns, name)[0]["metadata"]["name"]
    seen: list[str] = []
    adapter.hold(name)

    def terminal_and_held() -> bool:
        p = pod_or_none(ns, pod)
        if p is None:
            return False
        if not seen or describe(p) != seen[-1]:
            seen.append(describe(p))
        return bool(p["status"].get("phase") == "Failed" and p["metadata"]["finalizers"] == [POD_FINALIZER])

    wait_for("the pod Failed, held only by dispatch's finalizer", terminal_and_held, timeout=60)
    print("the pod's way:", *seen, sep="\n  ")
    left = get("pod", pod, "-n", ns)
    assert all("terminated" in c["state"] for c in left["status"]["containerStatuses"])
    assert [e.proof for e in adapter.ceased(name).ends] == ["kubelet-confirmed"]
    with RunningController(ns):
        wait_for("the controller releasing it: the pod gone", lambda: pod_or_none(ns, pod) is None, timeout=60)
    assert adapter.release(name).admission == 2
    wait_for("the new pod Running", lambda: len(live(ns, name)) == 1)
    new = live(ns, name)[0]
    assert new["metadata"]["labels"][LABEL_ADMISSION] == "2"
    assert POD_FINALIZER in new["metadata"]["finalizers"], "the raise keeps dispatch's finalizer"
    adapter.hold(name)
    with RunningController(ns):
        wait_for("the second pod gone too", lambda: not pods(ns, name), timeout=60)


def test_namespace_deletion_with_no_dispatch_process_running(
        adapter: Adapter, admin: Adapter, testbed_kubeconfig: str) -> None:
    """Deleting a namespace deletes its pods; they end, and dispatch's finalizer keeps them (and the
    namespace Terminating) until something of dispatch releases them: the documented release-pod loop."""
    ns = adapter.namespace
    name = start(adapter, ns, on(tb.regular_nodes()[0], "nsdel", pod_annotations={tb.ANN_DELETE_DELAY: "2s"}))
    pod = live(ns, name)[0]["metadata"]["name"]
    tb.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for("the pod ended as its kubelet reports",
             lambda: (get("pod", pod, "-n", ns)["status"].get("phase") == "Failed"
                      and get("pod", pod, "-n", ns)["metadata"]["finalizers"] == [POD_FINALIZER]), timeout=90)
    namespace = get("namespace", ns)
    print("namespace while held:", namespace["status"])
    assert namespace["status"]["phase"] == "Terminating"
    # The README's command, as a library call: every pod still held by dispatch's finalizer.
    for p in get("pods", "-n", ns)["items"]:
        if POD_FINALIZER in p["metadata"].get("finalizers", []):
            assert admin.release_pod(p["metadata"]["name"]).proof == "kubelet-confirmed"
    wait_for("the namespace gone", lambda: tb.kubectl("get", "namespace", ns, check=False).returncode != 0,
             timeout=120)


# ---------------------------------------------------------------- item 8: podReplacementPolicy


def _runtime_with_failed_policy(name: str) -> None:
    runtime = get("clustertrainingruntime", "torch-distributed")
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation", "annotations"):
        runtime["metadata"].pop(key, None)
    runtime["metadata"]["name"] = name
    runtime.pop("status", None)
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["podReplacementPolicy"] = "Failed"
    tb.kubectl("apply", "-f", "-", input=json.dumps(runtime))


@pytest.mark.parametrize("policy", ["default", "Failed"])
def test_a_force_deleted_pod_of_a_running_job_is_replaced_at_once_unless_the_runtime_sets_failed(
    adapter: Adapter, ns: str, policy: str
) -> None:
    node = tb.freezable_nodes()[-1]
    runtime = "torch-distributed"
    if policy == "Failed":
        runtime = f"torch-failed-{uuid.uuid4().hex[:4]}"
        _runtime_with_failed_policy(runtime)
    try:
        job = on(node, f"repl{policy[0].lower()}", runtime=runtime)
        status = adapter.open(job)
        print("open warnings:", status.warnings)
        assert bool(status.warnings) is (policy == "default")
        name = f"{job.job_id}-{job.submission}"
        assert adapter.release(name).admission == 1
        wait_for("its pod Running", lambda: len(live(ns, name)) == 1)
        job_obj = get("jobs", "-n", ns, "-l", f"{JOBSET_LABEL}={name}")["items"][0]
        print("child Job podReplacementPolicy:", job_obj["spec"].get("podReplacementPolicy"))
        assert job_obj["spec"]["podReplacementPolicy"] == ("Failed" if policy == "Failed" else "TerminatingOrFailed")
        pod = live(ns, name)[0]["metadata"]["name"]
        tb.freeze(node)
        try:
            wait_for("Ready=Unknown", lambda: ready(node) == "Unknown")
            tb.kubectl("delete", "pod", pod, "-n", ns, "--force", "--grace-period=0", "--wait=false")
            time.sleep(15)
            others = [p["metadata"]["name"] for p in pods(ns, name) if p["metadata"]["name"] != pod]
            print(f"{policy}: pods beside the force-deleted one after 15 s: {others}")
            if policy == "default":
                assert others, "TerminatingOrFailed: the Job controller replaces a deleting pod at once"
                assert any("TerminatingOrFailed" in w for w in adapter.inspect(name).warnings)
            else:
                assert not others, "Failed: no replacement while the old pod may still run"
                assert adapter.inspect(name).warnings == ()
        finally:
            tb.thaw(node)
            wait_for("node Ready again", lambda: ready(node) == "True", timeout=90)
            adapter.hold(name)
    finally:
        if policy == "Failed":
            tb.kubectl("delete", "clustertrainingruntime", runtime, "--wait=false", check=False)
