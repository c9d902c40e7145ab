"""The fake-cluster situations the documentation's examples run in, by the name a marker gives.

A page declares one before a block with ``<!-- example: NAME -->``. Each builds a fresh ``FakeCluster``
in the state the page describes, through dispatch's own library and the fake's controllers (nothing is
written into the fake by hand that a real cluster would not write), so the output a page shows is what
dispatch prints in that state.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

from dispatch import AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch import _names as n
from dispatch._identity import record_name
from dispatch.controller import Metrics, Reconciler
from dispatch.controller._events import EventRecorder
from dispatch.controller.testing import FakeKueue, keeper_pass
from dispatch.testing import FakeCluster

NODES = ("node-0", "node-1", "node-2", "node-3")
WRITER = ("dispatch-writer", "dispatch-node-reader")
"""A user's roles as the install docs bind them: the library in every scenario holds exactly these."""


def fresh(namespace: str = "default") -> FakeCluster:
    """A cluster with Trainer's default runtime, set up as dispatch recommends (its Jobs'
    podReplacementPolicy is Failed, so ``open`` and ``status`` print no warning), and four Ready nodes;
    nothing opened yet."""
    cluster = FakeCluster(namespace)
    cluster.add_runtime(replacement_policy="Failed")
    for node in NODES:
        cluster.add_node(node)
    return cluster


def _run(cluster: FakeCluster, steps: Callable[[AsyncAdapter], object]) -> None:
    async def go() -> None:
        async with AsyncAdapter.connect(cluster.namespace, transport=cluster.transport(roles=WRITER)) as adapter:
            result = steps(adapter)
            if asyncio.iscoroutine(result):
                await result

    asyncio.run(go())


def running() -> FakeCluster:
    """llama-s1 opened and released (A=1); its one pod runs on node-0."""
    cluster = fresh()

    async def steps(d: AsyncAdapter) -> None:
        await d.open(JobSpec(job_id="llama", submission="s1", image="ghcr.io/example/train:1.0"))
        await d.release("llama-s1")

    _run(cluster, steps)
    cluster.settle()
    return cluster


def held_terminating() -> FakeCluster:
    """llama-s1 held while it ran: its pod is Terminating (within its grace period) on a Ready node."""
    cluster = running()
    _run(cluster, lambda d: d.hold("llama-s1"))
    cluster.settle()
    return cluster


def lost_node() -> FakeCluster:
    """llama-s1 ran on node-0, which stopped answering (Ready=Unknown), and was then held."""
    cluster = running()
    cluster.freeze_node("node-0")
    _run(cluster, lambda d: d.hold("llama-s1"))
    cluster.settle()
    return cluster


def force_deleted() -> FakeCluster:
    """lost-node after someone force-deleted the pod (``kubectl delete --force --grace-period=0``): its
    process may run on, and dispatch's finalizer keeps it in the API with a deletionTimestamp."""
    cluster = lost_node()
    cluster.force_delete(cluster.pods("llama-s1")[0]["metadata"]["name"])
    return cluster


def held_gone() -> FakeCluster:
    """held-terminating once its kubelet confirmed the pod's end (Failed, every container terminated);
    with no controller running, dispatch's finalizer still holds the ended pod in the API."""
    cluster = held_terminating()
    cluster.advance(60)
    cluster.settle()
    return cluster


def failure_recovered() -> FakeCluster:
    """llama-s1's container crashed (exit 1, restartPolicy OnFailure), node-0 was cut off from the API
    before its kubelet restarted it, the object was held, Kueue's failure recovery marked the pod Failed
    and force-deleted it (dispatch's controller recorded the mark); the partition has since healed and the
    kubelet stopped the container."""
    cluster = running()
    pod = cluster.pods("llama-s1")[0]["metadata"]["name"]
    cluster.crash(pod, 1)
    cluster.partition("node-0")
    _run(cluster, lambda d: d.hold("llama-s1"))
    cluster.settle()
    cluster.mark_failed(pod, reason="KueueForcefullyDeleted")
    cluster.force_delete(pod)
    keeper_pass(cluster)  # the installed controller sees the mark and records it (the pod's resourceVersion)
    cluster.heal("node-0")
    cluster.settle()
    return cluster


def lost_node_tainted() -> FakeCluster:
    """lost-node after the operator's out-of-service taint, before PodGC has deleted the pod."""
    cluster = lost_node()
    cluster.taint_out_of_service("node-0")
    return cluster


def lost_node_collected() -> FakeCluster:
    """lost-node-tainted after the controller freed the pod (its end proven by the taint) and PodGC deleted it."""
    cluster = lost_node_tainted()
    cluster.settle()
    keeper_pass(cluster)  # the installed controller frees it by itself
    return cluster


def _kueue(after_eviction: Callable[[FakeCluster, FakeKueue, Reconciler, str], object]) -> FakeCluster:
    """llama-s1 under Kueue: admitted by dispatch's check (A=1), running, then preempted."""
    cluster = fresh()
    kueue = FakeKueue(cluster)
    kueue.install()

    async def go() -> None:
        kube = k.Kube.connect(namespace=cluster.namespace, transport=cluster.transport("dispatch-controller"))
        metrics = Metrics.create()
        events = EventRecorder(kube, metrics, instance="docs")
        reconciler = Reconciler(kube, check_names=lambda: {kueue.check}, metrics=metrics, events=events)
        writer = k.Kube.connect(namespace=cluster.namespace, transport=cluster.transport(roles=WRITER))
        try:
            await AsyncAdapter(writer).open(JobSpec(job_id="llama", submission="s1", queue=kueue.queue))
            workload = kueue.workload_for("llama-s1")
            await reconciler.reconcile(cluster.namespace, workload)
            kueue.sync()
            cluster.settle()
            kueue.evict(workload)
            cluster.settle()
            kueue.sync()
            result = after_eviction(cluster, kueue, reconciler, workload)
            if asyncio.iscoroutine(result):
                await result
        finally:
            await events.drain()
            await writer.aclose()
            await kube.aclose()

    asyncio.run(go())
    return cluster


def kueue_waiting() -> FakeCluster:
    """llama-s1 preempted under Kueue and re-reserved while its pod is still Terminating; the
    controller has decided: the check stays Pending, naming the pod."""

    async def decide(cluster: FakeCluster, kueue: FakeKueue, reconciler: Reconciler, workload: str) -> None:
        await reconciler.reconcile(cluster.namespace, workload)

    return _kueue(decide)


def controller_down() -> FakeCluster:
    """llama-s1 preempted under Kueue while no dispatch controller runs; its old pod has gone since."""

    def pods_go(cluster: FakeCluster, kueue: FakeKueue, reconciler: Reconciler, workload: str) -> None:
        cluster.advance(60)
        cluster.settle()
        kueue.sync()

    return _kueue(pods_go)


def readmitted() -> FakeCluster:
    """llama-s1 held, its first pod gone, released again: its second execution (A=2) runs."""
    cluster = held_terminating()
    cluster.advance(60)
    cluster.settle()
    _run(cluster, lambda d: d.release("llama-s1"))
    cluster.settle()
    return cluster


def unmanaged() -> FakeCluster:
    """running, plus a TrainJob the Kubeflow SDK created in the same namespace (no dispatch labels or
    runtime patch; its managedFields name the SDK), held."""
    cluster = running()
    cluster.server.create("trainer.kubeflow.org", "trainjobs", cluster.namespace, {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "uafe94fe6d9a", "managedFields": [{"manager": "kubeflow-sdk", "operation": "Update"}]},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True},
    })
    cluster.settle()
    return cluster


def _delete_record(cluster: FakeCluster) -> None:
    """What an admin's ``kubectl delete submissionrecord`` does (writers may not delete records)."""
    cluster.server.delete(n.DOMAIN, "submissionrecords", cluster.namespace, record_name("llama", "s1"))


def record_missing() -> FakeCluster:
    """llama-s1 ran as A=1 and was held; its pod is gone (the controller freed it); then its identity record
    was deleted."""
    cluster = held_gone()
    keeper_pass(cluster)  # the installed controller frees it by itself
    _delete_record(cluster)
    return cluster


def kueue_record_missing() -> FakeCluster:
    """llama-s1 under Kueue ran as A=1 and was preempted; its pod has gone; its identity record was
    deleted; dispatch's check has decided the re-admission since."""

    async def decide(cluster: FakeCluster, kueue: FakeKueue, reconciler: Reconciler, workload: str) -> None:
        cluster.advance(60)
        cluster.settle()
        kueue.sync()
        _delete_record(cluster)
        await reconciler.reconcile(cluster.namespace, workload)

    return _kueue(decide)


def legacy_ledger() -> FakeCluster:
    """A namespace used by a dispatch version from before identity records: its ConfigMap
    ``dispatch-admissions`` remembers llama/s1 at A=3 and llama/s2 at A=1 (keys ``<len>.<job-id>.<submission>``,
    as that version wrote them); no TrainJob of either exists any more."""
    cluster = fresh()
    cluster.server.create("", "configmaps", cluster.namespace, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dispatch-admissions"},
        "data": {"5.llama.s1": "3", "5.llama.s2": "1"},
    })
    return cluster


def _resolve(entry: dict[str, object], labels: dict[str, str], namespace: str) -> str:
    """One container env entry as the kubelet resolves it: a value, or a fieldRef to one pod label or to the
    pod's namespace."""
    if "value" in entry:
        return str(entry["value"])
    path = entry["valueFrom"]["fieldRef"]["fieldPath"]  # type: ignore[index]
    if path == "metadata.namespace":
        return namespace
    found = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
    assert found, f"{entry['name']}: a fieldRef the page's pod cannot resolve: {path}"
    return labels[found[1]]


def trainer_pod_environment(cluster: FakeCluster, workdir: Path) -> dict[str, str]:
    """What the running trainer pod of llama-s1 gets: the TrainJob's trainer env as dispatch wrote it
    (Trainer puts it on the trainer container; the kubelet resolves each fieldRef against the pod's own
    labels), plus what the runtime on the fencing page adds: the labels file and the checkpoint root."""
    running = [p for p in cluster.pods("llama-s1") if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, running
    labels = running[0]["metadata"]["labels"]
    trainjob = cluster.server.get("trainer.kubeflow.org", "trainjobs", cluster.namespace, "llama-s1")
    assert trainjob is not None
    env = {e["name"]: _resolve(e, labels, running[0]["metadata"]["namespace"])
           for e in trainjob["spec"]["trainer"].get("env", [])}
    podinfo = workdir / "podinfo"
    podinfo.mkdir()
    # the downward API's format: one key="value" per line, values quoted as Go quotes them
    (podinfo / "labels").write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(labels.items())))
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir()
    return {**env, "PODINFO_DIR": str(podinfo), "CHECKPOINT_ROOT": str(checkpoints)}


ENVIRONMENTS: dict[str, Callable[[FakeCluster, Path], dict[str, str]]] = {
    "trainer-pod": trainer_pod_environment,
}
"""Scenarios whose Python examples run *inside* a pod: the process environment that pod would have."""

STEPPING: dict[str, dict[str, bool]] = {
    "prompt-exit": {"honour_grace": False},
}
"""How a scenario's cluster steps under a Python example (``FakeCluster.step`` keywords). In
``prompt-exit`` the trainers exit as soon as they are asked to stop, so a deleted pod is confirmed
gone at the kubelet's next sync instead of at the end of its grace period."""

SCENARIOS: dict[str, Callable[[], FakeCluster]] = {
    "fake": fresh,
    "prompt-exit": fresh,
    "running": running,
    "held-terminating": held_terminating,
    "failure-recovered": failure_recovered,
    "lost-node": lost_node,
    "lost-node-tainted": lost_node_tainted,
    "force-deleted": force_deleted,
    "held-gone": held_gone,
    "lost-node-collected": lost_node_collected,
    "kueue-waiting": kueue_waiting,
    "controller-down": controller_down,
    "readmitted": readmitted,
    "trainer-pod": readmitted,
    "unmanaged": unmanaged,
    "legacy-ledger": legacy_ledger,
    "record-missing": record_missing,
    "kueue-record-missing": kueue_record_missing,
}
