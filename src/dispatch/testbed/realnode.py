"""What scenario tests need to run real processes on the testbed's real node and read what they did.

The real node (``dispatch.testbed.real_node()``) carries a NoSchedule taint and a label of its own, so a
pod lands there only when it asks; :func:`on_real_node` makes any pod template ask, and run the workload
image, which appends its life to a file in a host directory (the process oracle, :mod:`.oracle`). The
pods share the host's pid namespace (``hostPID``), so the pids in that file are host pids and
:func:`.oracle.pid_alive` can tell whether a process without an EXIT line still runs.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dispatch._api import Obj
from dispatch.testbed import _cluster, _pyimage
from dispatch.testbed._node import LABEL, NODE, PAUSE_IMAGE, TAINT, WORKLOAD_IMAGE, WORKLOAD_PATH
from dispatch.testbed.oracle import pid_alive

ORACLE_MOUNT = "/oracle"
"""Where the oracle directory is mounted in the workload's container."""
ORACLE_FILE = f"{ORACLE_MOUNT}/oracle.log"
ORACLE_VOLUME = "dispatch-oracle"
PYTHON_IMAGE = _pyimage.IMAGE
"""The real node's Python image (:func:`python_image`): the fenced training process of ``dispatch.fence``."""
CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "dispatch-checkpoints"
FENCE_REPORT = f"{ORACLE_MOUNT}/fence.jsonl"

__all__ = [
    "LABEL",
    "NODE",
    "ORACLE_FILE",
    "ORACLE_MOUNT",
    "PAUSE_IMAGE",
    "PYTHON_IMAGE",
    "WORKLOAD_IMAGE",
    "fence_report",
    "fenced_runtime",
    "node_name",
    "on_real_node",
    "oracle_file",
    "pid_alive",
    "problem",
    "python_image",
    "training_runtime",
    "workload_pod",
]


def node_name() -> str:
    """The running real node's name; ``RuntimeError`` saying why when there is none."""
    name = _cluster.real_node()
    if name is None:
        raise RuntimeError(f"the testbed has no real node: {_cluster.real_node_problem()}")
    return name


def problem() -> str | None:
    """Why the testbed has no real node (None when it has one)."""
    return _cluster.real_node_problem()


def oracle_file(oracle_dir: Path | str) -> Path:
    """The host path of the oracle file the workload writes in ``oracle_dir``."""
    return Path(oracle_dir) / Path(ORACLE_FILE).name


def _knobs(tick: str | None, grace: str | None, linger: bool, exit_code: int | None,
           lifetime: str | None) -> dict[str, str]:
    env = {"TICK": tick, "GRACE": grace, "LIFETIME": lifetime,
           "EXIT_CODE": None if exit_code is None else str(exit_code), "LINGER": "1" if linger else None}
    return {k: v for k, v in env.items() if v is not None}


def on_real_node(
    template: Obj,
    oracle_dir: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    containers: Sequence[str] | None = None,
    tick: str | None = None,
    grace: str | None = None,
    linger: bool = False,
    exit_code: int | None = None,
    lifetime: str | None = None,
    keep_command: bool = False,
) -> Obj:
    """A copy of a pod template (``{"metadata", "spec"}``) or a bare pod spec whose containers (all, or
    those named in ``containers``) run the workload on the real node, writing to ``oracle_dir`` on the host.

    Adds the real node's toleration and node selector, ``hostPID`` (host pids in the oracle), the
    oracle's hostPath volume and mount, ``POD_NAME`` from the pod's name, the workload's knobs (``tick``,
    ``grace``: Go durations or seconds; ``linger``: ignore SIGTERM; ``exit_code``; ``lifetime``) and
    ``env``. The container's command becomes the workload's (``keep_command`` keeps it: the image also
    answers to the usual interpreters' names). Variables already set (``DISPATCH_*`` from dispatch's
    downward API) are kept.
    """
    out = copy.deepcopy(template)
    spec: Obj = out["spec"] if "spec" in out and isinstance(out["spec"], dict) else out
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), LABEL: "true"}
    tolerations = list(spec.get("tolerations") or [])
    if not any(t.get("key") == LABEL for t in tolerations):
        tolerations.append({"key": LABEL, "operator": "Equal", "value": TAINT["value"], "effect": TAINT["effect"]})
    spec["tolerations"] = tolerations
    spec["hostPID"] = True
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != ORACLE_VOLUME]
    volumes.append({"name": ORACLE_VOLUME, "hostPath": {"path": str(Path(oracle_dir).resolve()),
                                                        "type": "DirectoryOrCreate"}})
    spec["volumes"] = volumes
    wanted = set(containers) if containers is not None else None
    knobs = {**_knobs(tick, grace, linger, exit_code, lifetime), **dict(env or {})}
    for c in spec.get("containers") or []:
        if wanted is not None and c.get("name") not in wanted:
            continue
        c["image"] = WORKLOAD_IMAGE
        c["imagePullPolicy"] = "Never"  # imported into the node's containerd; there is no registry
        if not keep_command:
            c["command"] = [WORKLOAD_PATH]
            c.pop("args", None)
        mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") != ORACLE_VOLUME]
        mounts.append({"name": ORACLE_VOLUME, "mountPath": ORACLE_MOUNT})
        c["volumeMounts"] = mounts
        have = {e.get("name") for e in c.get("env") or []}
        extra: list[Obj] = []
        if "POD_NAME" not in have:
            extra.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        if "ORACLE_FILE" not in have:
            extra.append({"name": "ORACLE_FILE", "value": ORACLE_FILE})
        for k, v in knobs.items():
            if k not in have:
                extra.append({"name": k, "value": v})
        c["env"] = [*(c.get("env") or []), *extra]
    return out


def workload_pod(
    name: str,
    namespace: str,
    oracle_dir: Path | str,
    *,
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    grace_period_seconds: int | None = None,
    restart_policy: str = "Never",
    **knobs: Any,
) -> Obj:
    """A plain pod running the workload on the real node (``knobs``: those of :func:`on_real_node`)."""
    # No cluster DNS in the testbed: "Default" (the node's resolv.conf) spares the kubelet's warning per pod.
    spec: Obj = {"restartPolicy": restart_policy, "automountServiceAccountToken": False, "dnsPolicy": "Default",
                 "containers": [{"name": "workload", "image": WORKLOAD_IMAGE}]}
    if grace_period_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_period_seconds
    pod: Obj = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})}, "spec": spec}
    return on_real_node(pod, oracle_dir, env=env, **knobs)


def training_runtime(
    name: str,
    oracle_dir: Path | str,
    *,
    namespace: str | None = None,
    grace_period_seconds: int | None = None,
    **knobs: Any,
) -> Obj:
    """A Trainer runtime shaped like the testbed's ``torch-distributed`` (one replicated job ``node``, its
    container ``node``) whose pods run the workload on the real node. With ``namespace`` a
    ``TrainingRuntime`` there (use ``JobSpec(runtime=name, runtime_kind="TrainingRuntime")``), else a
    ``ClusterTrainingRuntime``. ``knobs`` are those of :func:`on_real_node`."""
    pod_spec: Obj = {"containers": [{"name": "node", "image": WORKLOAD_IMAGE}]}
    if grace_period_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace_period_seconds
    template = on_real_node({"spec": pod_spec}, oracle_dir, **knobs)
    meta: Obj = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}}
    if namespace is not None:
        meta["namespace"] = namespace
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime",
        "metadata": meta,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": template},
                },
            }]}},
        },
    }




def python_image() -> dict[str, str]:
    """Build the Python image from the sources this process runs (cached while they are unchanged) and
    import it into the real node's containerd; returns what it cost (sizes, seconds), for reports."""
    from dispatch.testbed import _node

    node_name()
    t0 = time.monotonic()
    content = _pyimage.files()
    key = hashlib.sha256("\n".join(f"{k}\0{v}\0{v.stat().st_size}\0{v.stat().st_mtime_ns}"
                                   for k, v in sorted(content.items())).encode()).hexdigest()[:16]
    images = _node._dirs().images
    tar = images / f"python-{key}.tar"
    built = False
    if not tar.exists():
        for old in images.glob("python-*.tar"):
            old.unlink()
        _pyimage.archive(tar, _node._arch(), content)
        built = True
    t1 = time.monotonic()
    _node.ctr("images", "import", str(tar), timeout=120)
    return {"files": str(len(content)), "bytes": str(sum(p.stat().st_size for p in set(content.values()))),
            "archive-bytes": str(tar.stat().st_size), "built": str(built),
            "build-seconds": f"{t1 - t0:.1f}", "import-seconds": f"{time.monotonic() - t1:.1f}"}


def fence_report(oracle_dir: Path | str) -> Path:
    """The host path of the JSON lines the fenced process writes in ``oracle_dir`` (one per fence event)."""
    return Path(oracle_dir) / Path(FENCE_REPORT).name


def fenced_runtime(
    name: str,
    oracle_dir: Path | str,
    checkpoint_dir: Path | str,
    *,
    namespace: str,
    commit_every: float = 0.1,
    fenced_tries: int = 0,
    tolerations: Sequence[Obj] = (),
    grace_period_seconds: int | None = None,
    linger: bool = False,
) -> Obj:
    """A namespaced ``TrainingRuntime`` like :func:`training_runtime` whose process is the fenced training
    loop (``dispatch.testbed._fence_workload`` in :data:`PYTHON_IMAGE`, which :func:`python_image` must have
    imported): it fences ``checkpoint_dir`` (a hostPath, so the test reads the same files) on its A, commits
    every ``commit_every`` seconds, and writes the process oracle and :func:`fence_report` to ``oracle_dir``."""
    rt = training_runtime(name, oracle_dir, namespace=namespace, grace_period_seconds=grace_period_seconds,
                          linger=linger)
    spec = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    spec["tolerations"] = [*spec["tolerations"], *tolerations]
    spec["volumes"].append({"name": CHECKPOINT_VOLUME, "hostPath": {"path": str(Path(checkpoint_dir).resolve()),
                                                                   "type": "DirectoryOrCreate"}})
    container = spec["containers"][0]
    container["image"] = PYTHON_IMAGE
    container["command"] = _pyimage.entrypoint()
    container["volumeMounts"].append({"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT})
    container["env"] += [{"name": "CHECKPOINT_ROOT", "value": CHECKPOINT_MOUNT},
                         {"name": "FENCE_REPORT", "value": FENCE_REPORT},
                         {"name": "COMMIT_EVERY", "value": str(commit_every)},
                         {"name": "FENCED_TRIES", "value": str(fenced_tries)}]
    return rt
