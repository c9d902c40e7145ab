"""Render the manifests the testbed applies, from the upstream YAML in the Go module cache.

Reading the upstream CRDs and webhook lists at run time (instead of keeping copies) keeps the testbed in
step with the pinned controller versions; only the wiring (URLs, CA bundle, names) is changed here, the
same way the upstream kustomizations would.
"""

from __future__ import annotations

import base64
import copy
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .._api import Obj
from . import _paths

# Port plan; all listeners are on 127.0.0.1 only. DISPATCH_TESTBED_PORT_OFFSET shifts them all, so a second
# testbed (with its own DISPATCH_TESTBED_DIR) can run beside the first.
_BASE_PORTS: dict[str, int] = {
    "etcd": 12379,
    "etcd-peer": 12380,
    "apiserver": 16443,
    "controller-manager": 10257,
    "scheduler": 10259,
    "kwok": 10247,
    "jobset-webhook": 19443,
    "jobset-probe": 18091,
    "trainer-webhook": 19444,
    "trainer-probe": 18092,
    "kueue-webhook": 19445,
    "kueue-probe": 18093,
    # the real node's kubelet (loopback only); its containerd listens on a unix socket only
    "kubelet": 10250,
    "kubelet-healthz": 10248,
}
PORT_OFFSET = int(os.environ.get("DISPATCH_TESTBED_PORT_OFFSET", "0"))
PORTS: dict[str, int] = {k: v + PORT_OFFSET for k, v in _BASE_PORTS.items()}
REAL_NODE_PORTS = ("kubelet", "kubelet-healthz")
"""Checked only when the real node starts: a host's own kubelet on them means no real node, not no testbed."""

# Annotations understood by the KWOK stages below (documented for test authors).
ANN_DELETE_DELAY = "dispatch.test/delete-delay"  # seconds ("5") or a Go duration ("500ms"); default 1s
ANN_HOLD_DELETE = "dispatch.test/hold-delete"  # while present, a deleted pod stays Terminating
ANN_COMPLETE = "dispatch.test/complete"  # set on a Running pod: it Succeeds
ANN_FAIL = "dispatch.test/fail"  # set on a Running pod: it Fails (exit code 1)

# Kueue webhooks that matter for batch/job, JobSet, TrainJob and Kueue's own API; the rest are for
# integrations the testbed does not enable (Kueue serves them as no-ops).
KUEUE_WEBHOOKS_KEPT = {
    "mclusterqueue.kb.io",
    "vclusterqueue.kb.io",
    "vcohort.kb.io",
    "mresourceflavor.kb.io",
    "vresourceflavor.kb.io",
    "mworkload.kb.io",
    "vworkload.kb.io",
    "mjob.kb.io",
    "vjob.kb.io",
    "mjobset.kb.io",
    "vjobset.kb.io",
    "mtrainjob.kb.io",
    "vtrainjob.kb.io",
}


def load_all(path: Path) -> list[Obj]:
    """Load every non-empty YAML document of ``path``."""
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def dump_all(objs: Iterable[Obj]) -> str:
    """Serialise objects as one multi-document YAML stream."""
    return yaml.safe_dump_all(list(objs), sort_keys=False)


def _json_patch(obj: Obj, ops: list[Obj]) -> None:
    """Apply the subset of RFC 6902 the upstream webhook patches use (replace/add on a plain path)."""
    for op in ops:
        if op.get("op") not in ("replace", "add"):
            raise ValueError(f"unsupported patch op {op!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op["path"]).split("/")[1:]]
        target: Any = obj
        for p in parts[:-1]:
            target = target[int(p)] if isinstance(target, list) else target[p]
        last = parts[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            target[last] = op["value"]


def _wire_webhooks(cfgs: list[Obj], prefix: str, port: int, ca_bundle: str) -> list[Obj]:
    """Name every configuration of ``cfgs`` ``prefix`` + its upstream name (dropping the rest of its metadata)
    and point its webhooks at a controller serving on 127.0.0.1:``port``."""
    for cfg in cfgs:
        cfg["metadata"] = {"name": prefix + cfg["metadata"]["name"]}
        for wh in cfg.get("webhooks", []):
            path = wh["clientConfig"]["service"].get("path", "/")
            wh["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
    return cfgs


def ca_bundle(pki: Path) -> str:
    """Base64 CA certificate as webhook configurations want it."""
    return base64.b64encode((pki / "ca.crt").read_bytes()).decode()


def _json_patched_webhooks(base: Path) -> list[Obj]:
    """The webhook configurations of ``base`` with its kustomization's JSON patches applied; a target without
    a name patches every configuration of its kind, as kustomize does."""
    cfgs = load_all(base / "manifests.yaml")
    kust = load_all(base / "kustomization.yaml")[0]
    for p in kust.get("patches", []):
        tgt = p["target"]
        ops = yaml.safe_load((base / p["path"]).read_text())
        for cfg in cfgs:
            if cfg["kind"] == tgt["kind"] and ("name" not in tgt or cfg["metadata"]["name"] == tgt["name"]):
                _json_patch(cfg, ops)
    return cfgs


def jobset_webhooks(mod: Path, bundle: str) -> list[Obj]:
    """JobSet webhook configurations as its kustomize base renders them (prefix ``jobset-``)."""
    cfgs = _json_patched_webhooks(mod / "config/components/webhook")
    return _wire_webhooks(cfgs, "jobset-", PORTS["jobset-webhook"], bundle)


def trainer_webhooks(mod: Path, bundle: str) -> list[Obj]:
    """Trainer webhook configurations with the upstream names (defaulter/validator.trainer.kubeflow.org)."""
    cfgs = _json_patched_webhooks(mod / "manifests/base/webhook")
    return _wire_webhooks(cfgs, "", PORTS["trainer-webhook"], bundle)


def kueue_webhooks(mod: Path, bundle: str) -> list[Obj]:
    """Kueue webhook configurations (prefix ``kueue-``), trimmed to the integrations the testbed enables."""
    base = mod / "config/components/webhook"
    cfgs = load_all(base / "manifests.yaml")
    kust = load_all(base / "kustomization.yaml")[0]
    for p in kust.get("patches", []):
        if "patch" not in p:
            continue
        patch = yaml.safe_load(p["patch"])
        for cfg in cfgs:
            if cfg["kind"] != patch["kind"] or cfg["metadata"]["name"] != patch["metadata"]["name"]:
                continue
            by_name = {w["name"]: w for w in cfg["webhooks"]}
            for pw in patch.get("webhooks", []):
                if pw["name"] in by_name:
                    by_name[pw["name"]].update({k: v for k, v in pw.items() if k != "name"})
    for cfg in cfgs:
        cfg["webhooks"] = [w for w in cfg["webhooks"] if w["name"] in KUEUE_WEBHOOKS_KEPT]
    return _wire_webhooks(cfgs, "kueue-", PORTS["kueue-webhook"], bundle)


def crds(jobset: Path, trainer: Path, kueue: Path, bundle: str) -> list[Obj]:
    """All CRDs; Kueue's multi-version CRDs get their conversion webhook wired to the local Kueue."""
    out: list[Obj] = []
    out += [d for f in sorted((jobset / "config/components/crd/bases").glob("*.yaml")) for d in load_all(f)]
    out += [d for f in sorted((trainer / "manifests/base/crds").glob("*.yaml")) for d in load_all(f)]
    # Follow Kueue's CRD kustomization: which CRDs it installs and which get a conversion webhook.
    kdir = kueue / "config/components/crd"
    kust = load_all(kdir / "kustomization.yaml")[0]
    conv: set[str] = set()
    for p in kust.get("patches", []):
        if "webhook_in_" in str(p.get("path", "")):
            for d in load_all(kdir / p["path"]):
                conv.add(d["metadata"]["name"])
    for r in kust.get("resources", []):
        for d in load_all(kdir / r):
            if d["metadata"]["name"] in conv:
                d["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{PORTS['kueue-webhook']}/convert",
                            "caBundle": bundle,
                        },
                    },
                }
            out.append(d)
    out += load_all(_paths.source_dir().parent / "deploy" / "base" / "crd.yaml")  # dispatch's identity records
    return [d for d in out if d.get("kind") == "CustomResourceDefinition"]


def training_runtimes(trainer: Path) -> list[Obj]:
    """The upstream default ClusterTrainingRuntimes (plain YAML files of the runtimes kustomization)."""
    base = trainer / "manifests/base/runtimes"
    kust = load_all(base / "kustomization.yaml")[0]
    out: list[Obj] = []
    for r in kust.get("resources", []):
        p = base / r
        if p.is_file():
            out += load_all(p)
    return out


def kwok_stages(kwok: Path) -> list[Obj]:
    """KWOK stages: upstream node lifecycle and pod-ready; our own completion and deletion stages.

    Pods go Running and stay Running (no automatic completion, unlike KWOK's "fast" set), so a training
    pod behaves like a long job. Tests drive the rest with the ``dispatch.test/*`` annotations.
    """
    stage_dir = kwok / "kustomize/stage"
    stages = load_all(stage_dir / "node/fast/node-initialize.yaml")
    stages += load_all(stage_dir / "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
    stages += load_all(stage_dir / "pod/fast/pod-ready.yaml")

    def terminated(phase: str, exit_code: int, reason: str) -> str:
        return (
            "{{ $now := Now }}\n"
            "containerStatuses:\n"
            "{{ range .spec.containers }}\n"
            "- image: {{ .image | Quote }}\n"
            "  name: {{ .name | Quote }}\n"
            "  ready: false\n"
            "  restartCount: 0\n"
            "  started: false\n"
            "  state:\n"
            "    terminated:\n"
            f"      exitCode: {exit_code}\n"
            "      finishedAt: {{ $now | Quote }}\n"
            f"      reason: {reason}\n"
            "      startedAt: {{ $now | Quote }}\n"
            "{{ end }}\n"
            f"phase: {phase}\n"
        )

    def pod_stage(name: str, exprs: list[Obj], nxt: Obj, delay: Obj | None = None) -> Obj:
        spec: Obj = {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": exprs},
            "next": nxt,
        }
        if delay is not None:
            spec["delay"] = delay
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": name},
            "spec": spec,
        }

    def ann(key: str) -> str:
        return f'.metadata.annotations["{key}"]'

    alive = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    stages.append(
        pod_stage(
            "dispatch-pod-complete",
            [alive, running, {"key": ann(ANN_COMPLETE), "operator": "Exists"}],
            {"statusTemplate": terminated("Succeeded", 0, "Completed")},
        )
    )
    stages.append(
        pod_stage(
            "dispatch-pod-fail",
            [
                alive,
                running,
                {"key": ann(ANN_FAIL), "operator": "Exists"},
                {"key": ann(ANN_COMPLETE), "operator": "DoesNotExist"},
            ],
            {"statusTemplate": terminated("Failed", 1, "Error")},
        )
    )
    deleting = {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
    not_held = {"key": ann(ANN_HOLD_DELETE), "operator": "DoesNotExist"}
    # Bare numbers are seconds; anything else must be a Go duration ("500ms", "2m"); unset/invalid -> 1 s.
    delay_expr = ann(ANN_DELETE_DELAY) + ' | tostring | if test("^[0-9]+([.][0-9]+)?$") then . + "s" else . end'
    delay = {"durationMilliseconds": 1000, "durationFrom": {"expressionFrom": delay_expr}}

    def deleted(name: str, exprs: list[Obj], nxt: Obj) -> Obj:
        """A stage that removes a deleted pod no annotation holds, once its delete delay is over."""
        return pod_stage(name, [deleting, not_held, *exprs], {**nxt, "delete": True}, delay)

    ended = {"key": ".status.phase", "operator": "In", "values": ["Succeeded", "Failed"]}
    started = ".status.containerStatuses.[].state.running.startedAt"
    # Like a kubelet: a running pod that is deleted is killed (exit 137 -> Failed), then removed. Owners'
    # finalizers (e.g. the Job controller's) are left for their owners to remove.
    stages.append(
        deleted(
            "dispatch-pod-delete",
            [{"key": ".status.phase", "operator": "NotIn", "values": ["Succeeded", "Failed"]}],
            {"statusTemplate": terminated("Failed", 137, "Error")},
        )
    )
    stages.append(
        deleted("dispatch-pod-delete-terminal", [ended, {"key": started, "operator": "DoesNotExist"}], {})
    )
    # Like a kubelet that comes back to a pod someone else marked Failed (PodGC, Kueue) while its node was
    # unreachable: it stops the containers and reports them terminated (the phase stays), then removes it.
    stages.append(
        deleted(
            "dispatch-pod-delete-terminal-running",
            [ended, {"key": started, "operator": "Exists"}],
            {"statusTemplate": terminated("{{ .status.phase }}", 137, "Error")},
        )
    )
    return stages


def controller_configs(certdir: Path, multikueue: Obj | None = None) -> dict[str, Obj]:
    """Controller Configuration objects: cert management and leader election off, 127.0.0.1 ports.

    ``multikueue`` (a fleet's manager only) is Kueue's ``multiKueue:`` block (gcInterval, origin,
    workerLostTimeout); ``{}`` keeps Kueue's defaults but still says the block is the manager's.
    """
    jobset: Obj = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": PORTS["jobset-webhook"], "host": "127.0.0.1", "certDir": str(certdir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{PORTS['jobset-probe']}"},
        "metrics": {"bindAddress": "0"},
    }
    trainer: Obj = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{PORTS['trainer-probe']}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": PORTS["trainer-webhook"], "host": "127.0.0.1"},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    }
    kueue: Obj = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{PORTS['kueue-probe']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": PORTS["kueue-webhook"], "host": "127.0.0.1", "certDir": str(certdir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]},
    }
    if multikueue is not None:
        kueue["multiKueue"] = dict(multikueue)
    return {"jobset": jobset, "trainer": trainer, "kueue": kueue}


def nodes(regular: list[str], freezable: list[str]) -> list[Obj]:
    """Fake nodes; freezable ones carry a different kwok annotation so the main kwok ignores them."""
    out: list[Obj] = []
    for i, name in enumerate(regular + freezable):
        frozen_kind = name in freezable
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "single" if frozen_kind else "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/hostname": name,
                        "type": "kwok",
                        "dispatch.test/freezable": "true" if frozen_kind else "false",
                    },
                },
                "spec": {"podCIDR": f"10.244.{i}.0/24", "podCIDRs": [f"10.244.{i}.0/24"]},
                "status": {
                    "addresses": [
                        {"address": f"192.0.2.{i + 10}", "type": "InternalIP"},
                        {"address": name, "type": "Hostname"},
                    ],
                    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
                },
            }
        )
    return out


def _cluster_queue(name: str, quota: Mapping[str, str], checks: Sequence[str] = ()) -> Obj:
    """ClusterQueue ``name`` for every namespace: flavor ``default`` with ``quota`` (resource -> nominal quota;
    the resources it covers) and ``checks`` as its admission checks (none: no admission-check strategy)."""
    spec: Obj = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never"},
        "resourceGroups": [{"coveredResources": list(quota), "flavors": [{
            "name": "default", "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}]}],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def kueue_fixtures() -> list[Obj]:
    """Kueue objects the tests rely on: a plain queue and one gated by the ``dispatch`` admission check."""
    api = "kueue.x-k8s.io/v1beta2"

    def cq(name: str, checks: list[str]) -> Obj:
        quota = {"cpu": "8", "memory": "32Gi"}
        if checks:
            # Kueue v0.19 runs a ClusterQueue's admission checks only for the flavors a Workload is assigned;
            # a Workload whose pods request none of the covered resources gets no flavor and is admitted
            # without any check. Covering `pods` (which every pod counts against) assigns a flavor always.
            quota["pods"] = "1000"
        return _cluster_queue(name, quota, checks)

    def lq(name: str, cluster_queue: str) -> Obj:
        return {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterQueue": cluster_queue},
        }

    return [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": "default"}, "spec": {}},
        {
            "apiVersion": api,
            "kind": "AdmissionCheck",
            "metadata": {"name": "dispatch"},
            "spec": {"controllerName": "dispatch.phpboyscout.uk/admission"},
        },
        cq("cq", []),
        cq("cq-dispatch", ["dispatch"]),
        lq("lq", "cq"),
        lq("lq-dispatch", "cq-dispatch"),
    ]


MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
MULTIKUEUE_SECRET_KEY = "kubeconfig"  # the key MultiKueue reads a worker's kubeconfig from
_FLEET_QUOTA = {"cpu": "32", "memory": "128Gi", "pods": "1000"}
"""A fleet's ClusterQueues' quota unless the caller gives one."""


def embedded_kubeconfig(server: str, pki: Path, name: str) -> str:
    """A kubeconfig for ``server`` with the CA and the admin client pair inline: MultiKueue refuses file
    paths (``certificate-authority``) in a worker's kubeconfig, and Kueue runs elsewhere than the files."""

    def b64(f: str) -> str:
        return base64.b64encode((pki / f).read_bytes()).decode()

    cfg: Obj = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                              "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }
    return yaml.safe_dump(cfg, sort_keys=False)


def multikueue_fixtures(workers: dict[str, str], quota: dict[str, str] | None = None) -> list[Obj]:
    """The manager's MultiKueue wiring for ``workers`` (name -> kubeconfig text): one Secret per worker in
    kueue-system (key ``kubeconfig``), a MultiKueueCluster each, MultiKueueConfig ``multikueue`` listing them,
    AdmissionCheck ``multikueue`` and ClusterQueue ``cq-multikueue`` using it (flavor ``default``; the flavor
    itself is in :func:`kueue_fixtures`). Also ``cq-multikueue-dispatch``: the same with dispatch's check
    beside MultiKueue's (inactive until that check is Active)."""
    api = "kueue.x-k8s.io/v1beta2"
    out: list[Obj] = []
    for name, text in workers.items():
        out.append({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-kubeconfig", "namespace": "kueue-system"},
            "type": "Opaque",
            "data": {MULTIKUEUE_SECRET_KEY: base64.b64encode(text.encode()).decode()},
        })
        out.append({
            "apiVersion": api,
            "kind": "MultiKueueCluster",
            "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": f"{name}-kubeconfig"}}},
        })
    out.append({"apiVersion": api, "kind": "MultiKueueConfig", "metadata": {"name": "multikueue"},
                "spec": {"clusters": list(workers)}})
    out.append({
        "apiVersion": api,
        "kind": "AdmissionCheck",
        "metadata": {"name": "multikueue"},
        "spec": {
            "controllerName": MULTIKUEUE_CONTROLLER,
            "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "multikueue"},
        },
    })
    q = quota or _FLEET_QUOTA
    return [*out, _cluster_queue("cq-multikueue", q, ["multikueue"]),
            _cluster_queue("cq-multikueue-dispatch", q, ["dispatch", "multikueue"])]


def worker_queue(quota: dict[str, str] | None = None) -> Obj:
    """A fleet worker's ClusterQueue ``cq-fleet`` (no checks: the manager already admitted what comes)."""
    return _cluster_queue("cq-fleet", quota or _FLEET_QUOTA)


def deepcopy(objs: list[Obj]) -> list[Obj]:
    """Deep copy helper so callers can mutate rendered objects safely."""
    return copy.deepcopy(objs)
