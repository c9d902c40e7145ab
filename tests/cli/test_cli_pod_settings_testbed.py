"""``dispatch open``'s pod settings on the real control plane, run as a user holding exactly the shipped
writer roles: the real Trainer (its webhook and its merge of runtime patches), JobSet and the Job
controller put the checkpoint PVC (mounted at its path in the trainer container), a configMap, tolerations,
the service account and image pull secrets on every pod; a second admission (a raise of A re-applying
dispatch's entry, whose volumes Trainer's API makes immutable) keeps them."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from dispatch import LABEL_ADMISSION, Adapter, PodsRemain, testbed
from dispatch.cli import EXIT_REFUSED, app
from dispatch.testbed.harness import apply_shipped_roles, keeper_pass

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def _kubeconfig(tmp: Path, ns: str, sa: str) -> str:
    token = testbed.kubectl("-n", ns, "create", "token", sa).stdout.strip()
    cluster = yaml.safe_load(testbed.kubeconfig_path().read_text())["clusters"][0]
    path = tmp / f"{ns}-{sa}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
        "current-context": sa}))
    return str(path)


@pytest.fixture
def writer(testbed_kubeconfig: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(namespace, kubeconfig of a user bound to dispatch-writer there and to dispatch-node-reader), with a
    ServiceAccount ``trainer`` for the pods and a PV bound to the PVC ``ckpt`` so the pods can be scheduled."""
    ns = f"pods-{uuid.uuid4().hex[:6]}"
    apply_shipped_roles()
    testbed.kubectl("create", "namespace", ns)
    testbed.kubectl("-n", ns, "create", "serviceaccount", "writer")
    testbed.kubectl("-n", ns, "create", "serviceaccount", "trainer")
    testbed.kubectl("-n", ns, "create", "rolebinding", "writer", "--clusterrole=dispatch-writer",
                    f"--serviceaccount={ns}:writer")
    binding = f"{ns}-writer-nodes"
    testbed.kubectl("create", "clusterrolebinding", binding, "--clusterrole=dispatch-node-reader",
                    f"--serviceaccount={ns}:writer")
    testbed.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": ns},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "hostPath": {"path": "/data/ckpt"},
                  "claimRef": {"namespace": ns, "name": "ckpt"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt", "namespace": ns},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": ns,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]}))
    try:
        yield ns, _kubeconfig(tmp_path, ns, "writer")
    finally:
        testbed.kubectl("delete", "clusterrolebinding", binding, "--wait=false", check=False)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        testbed.kubectl("delete", "pv", ns, "--wait=false", check=False)


def run(kubeconfig: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["--kubeconfig", kubeconfig, *args], env={"COLUMNS": "250", "KUBECONFIG": None},
                              catch_exceptions=False)


def pods(ns: str, name: str) -> list[Obj]:
    items: list[Obj] = json.loads(testbed.kubectl(
        "-n", ns, "get", "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={name}", "-o", "json").stdout)["items"]
    return items


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


def running(ns: str, name: str, admission: str) -> bool:
    found = pods(ns, name)
    return bool(found) and all(p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
                               and p["metadata"]["labels"].get(LABEL_ADMISSION) == admission for p in found)


def settings(pod: Obj) -> Obj:
    spec = pod["spec"]
    (node,) = [c for c in spec["containers"] if c["name"] == "node"]
    return {
        "serviceAccountName": spec.get("serviceAccountName"),
        "imagePullSecrets": spec.get("imagePullSecrets"),
        # as a set: JobSet (v0.12) merges the template's tolerations into the child Job at each resume comparing
        # them by pointer, so one with tolerationSeconds is repeated (docs/findings.md, "Tolerations repeated")
        "tolerations": sorted({json.dumps(t, sort_keys=True) for t in spec.get("tolerations") or []
                               if t.get("key") in ("pool", "nvidia.com/gpu")}),
        "volumes": {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in spec.get("volumes") or []
                    if v["name"] in ("ckpt", "cfg")},
        "mounts": [m for m in node.get("volumeMounts") or [] if m["name"] in ("ckpt", "cfg")],
    }


EXPECTED = {
    "serviceAccountName": "trainer",
    "imagePullSecrets": [{"name": "regcred"}],
    "tolerations": sorted(json.dumps(t, sort_keys=True) for t in (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoExecute", "tolerationSeconds": 300})),
    "volumes": {"ckpt": {"persistentVolumeClaim": {"claimName": "ckpt"}},
                "cfg": {"configMap": {"name": "train-cfg", "defaultMode": 420}}},
    "mounts": [{"name": "ckpt", "mountPath": "/ckpt"},
               {"name": "cfg", "mountPath": "/etc/train", "readOnly": True}],
}


def test_the_real_trainer_puts_the_pod_settings_on_every_pod(writer: tuple[str, str]) -> None:
    ns, kubeconfig = writer
    testbed.kubectl("-n", ns, "create", "configmap", "train-cfg", "--from-literal=a=b")
    opened = run(kubeconfig, "open", "--job-id", "llama", "--submission", "s1", "--nodes", "2", "-r", "cpu=1",
                 "--volume", "name=ckpt,claim=ckpt,mountPath=/ckpt",
                 "--volume", "name=cfg,configMap=train-cfg,mountPath=/etc/train,readOnly",
                 "--toleration", "nvidia.com/gpu:NoSchedule", "--toleration", "pool=a100:NoExecute:300",
                 "--service-account", "trainer", "--image-pull-secret", "regcred", "--no-hold")
    assert opened.exit_code == 0, opened.output
    wait_for("2 pods of A=1 Running", lambda: running(ns, "llama-s1", "1") and len(pods(ns, "llama-s1")) == 2)
    for pod in pods(ns, "llama-s1"):
        assert settings(pod) == EXPECTED

    # a second admission: the raise re-applies dispatch's entry (its volumes immutable in Trainer's API)
    with Adapter.connect(ns, kubeconfig=kubeconfig) as adapter:
        adapter.hold("llama-s1")

        def admitted() -> bool:
            try:
                return adapter.release("llama-s1").admission == 2
            except PodsRemain:
                return False

        wait_for("the release of A=2", admitted)
    # the first execution's pods ended and stay until the controller's keeper frees them (none runs here)
    wait_for("2 pods of A=2 Running", lambda: (keeper_pass(ns), running(ns, "llama-s1", "2")
                                               and len(pods(ns, "llama-s1")) == 2)[1])
    for pod in pods(ns, "llama-s1"):
        assert settings(pod) == EXPECTED


def test_a_volume_the_runtime_already_mounts_there_is_refused_before_anything_is_written(
    writer: tuple[str, str]
) -> None:
    """The real runtime read by a writer: no trainer container named ``node`` in a runtime means no mount."""
    ns, kubeconfig = writer
    testbed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": "other", "namespace": ns},
        "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "spec": {"containers": [{"name": "trainer", "image": "busybox",
                                     "volumeMounts": [{"name": "data", "mountPath": "/ckpt"}]}],
                     "volumes": [{"name": "data", "emptyDir": {}}]}}}}}]}}},
    }))
    refused = run(kubeconfig, "open", "--job-id", "llama", "--submission", "s2", "--runtime", "other",
                  "--runtime-kind", "TrainingRuntime", "--volume", "name=ckpt,claim=ckpt,mountPath=/ckpt")
    assert refused.exit_code == EXIT_REFUSED, refused.output
    assert "has no container named 'node'" in " ".join(refused.stderr.split())
    listed = json.loads(testbed.kubectl("-n", ns, "get", "trainjobs,submissionrecords", "-o", "json").stdout)
    assert listed["items"] == []


MANIFEST = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: kept
  labels: {team: ml}
spec:
  runtimeRef: {name: torch-distributed}
  trainer:
    numNodes: 1
    resourcesPerNode: {requests: {cpu: "1"}}
"""


def test_a_whole_manifest_is_opened_and_runs_as_a_dispatch_object(writer: tuple[str, str], tmp_path: Path) -> None:
    """``open -f trainjob.yaml`` through the real Trainer webhooks, as a writer: its pods carry the identity."""
    ns, kubeconfig = writer
    path = tmp_path / "trainjob.yaml"
    path.write_text(MANIFEST)
    opened = run(kubeconfig, "-o", "json", "open", "-f", str(path), "--no-hold")
    assert opened.exit_code == 0, opened.output
    submission = json.loads(opened.stdout)["identity"]["submission"]
    wait_for("its pod of A=1 Running", lambda: running(ns, "kept", "1"))
    (pod,) = pods(ns, "kept")
    labels = pod["metadata"]["labels"]
    assert (labels["dispatch.phpboyscout.uk/job-id"], labels["dispatch.phpboyscout.uk/submission"]) == (
        "kept", submission)
    env = {e["name"]: e.get("valueFrom") for c in pod["spec"]["containers"] if c["name"] == "node" for e in c["env"]}
    field = "metadata.labels['dispatch.phpboyscout.uk/admission']"
    assert env["DISPATCH_ADMISSION"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": field}}
