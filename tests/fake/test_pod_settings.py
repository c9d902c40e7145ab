"""Plain-mode ``open`` carries the pod settings trainers need (volumes, tolerations, service account,
image pull secrets) to every pod, each refused by name when wrong, before any request; with the shipped
writer's permissions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dispatch import Adapter, InvalidInput, JobSpec, State, Toleration, Volume
from dispatch._api import Obj
from dispatch._trainer import RuntimeShape, TrainJobView, runtime_shape, trainjob_body
from dispatch._validate import runtime_problems
from dispatch.testing import FakeCluster

CHECKPOINT = Volume(name="ckpt", mount_path="/ckpt", claim="llama-ckpt")
SETTINGS: dict[str, Any] = {
    "volumes": [CHECKPOINT,
                Volume(name="cfg", mount_path="/etc/train", config_map="train-cfg", read_only=True),
                Volume(name="token", mount_path="/var/run/hf", secret="hf-token", sub_path="token"),
                Volume(name="scratch", mount_path="/scratch", empty_dir=True)],
    "tolerations": [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
                    Toleration(key="pool", value="a100", effect="NoExecute", seconds=300)],
    "service_account": "trainer",
    "image_pull_secrets": ["regcred"],
}


def _pod_spec(pod: Obj) -> Obj:
    return dict(pod["spec"])


def test_open_carries_every_pod_setting_to_the_pods(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(JobSpec(job_id="llama", submission="s1", **SETTINGS))
    adapter.release("llama-s1")
    cluster.settle()
    (pod,) = cluster.pods("llama-s1")
    spec = _pod_spec(pod)
    assert spec["serviceAccountName"] == "trainer"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoExecute", "tolerationSeconds": 300}]
    assert {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in spec["volumes"]} == {
        "ckpt": {"persistentVolumeClaim": {"claimName": "llama-ckpt"}},
        "cfg": {"configMap": {"name": "train-cfg"}},
        "token": {"secret": {"secretName": "hf-token"}},
        "scratch": {"emptyDir": {}},
    }
    (node,) = [c for c in spec["containers"] if c["name"] == "node"]
    assert node["volumeMounts"] == [
        {"name": "ckpt", "mountPath": "/ckpt"},
        {"name": "cfg", "mountPath": "/etc/train", "readOnly": True},
        {"name": "token", "mountPath": "/var/run/hf", "subPath": "token"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]


def test_a_second_admission_keeps_the_settings(adapter: Adapter, cluster: FakeCluster,
                                               keeper: Callable[[], dict[str, str]]) -> None:
    """The raise of A re-applies dispatch's entry; the settings (immutable in Trainer's API) are unchanged."""
    adapter.open(JobSpec(job_id="llama", submission="s1", **SETTINGS))
    adapter.release("llama-s1")
    cluster.settle()
    adapter.hold("llama-s1")
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    assert adapter.inspect("llama-s1").state is State.HELD
    adapter.release("llama-s1")
    cluster.settle()
    keeper()  # the controller frees the first execution's pod, proven ended (issue 25)
    cluster.settle()
    (pod,) = cluster.pods("llama-s1")
    assert pod["metadata"]["labels"]["dispatch.phpboyscout.uk/admission"] == "2"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["ckpt", "cfg", "token", "scratch"]


def test_volumes_go_only_to_jobs_with_the_trainer_container(cluster: FakeCluster) -> None:
    """An initializer job's pods get the pod-wide settings but not the trainer's mounts."""
    shape = RuntimeShape(("dataset-initializer", "node"),
                         {"dataset-initializer": ("dataset-initializer",), "node": ("node",)})
    body = trainjob_body(JobSpec(job_id="llama", submission="s1", **SETTINGS), "llama-s1", "default", shape.jobs,
                         trainer_jobs=shape.trainer_jobs)
    jobs = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    by_job = {rj["name"]: rj["template"]["spec"]["template"]["spec"] for rj in jobs}
    assert "volumes" not in by_job["dataset-initializer"] and "containers" not in by_job["dataset-initializer"]
    assert by_job["dataset-initializer"]["serviceAccountName"] == "trainer"
    assert [v["name"] for v in by_job["node"]["volumes"]] == ["ckpt", "cfg", "token", "scratch"]
    assert TrainJobView.from_obj(body).patch_targets == ("dataset-initializer", "node")


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"volumes": [Volume(name="ckpt", mount_path="ckpt", claim="c")]}, "volumes[0].mount_path",
     "must be an absolute path"),
    ({"volumes": [Volume(name="ckpt", mount_path="", claim="c")]}, "volumes[0].mount_path", "must not be empty"),
    ({"volumes": [Volume(name="Ckpt", mount_path="/c", claim="c")]}, "volumes[0].name", "not a valid volume name"),
    ({"volumes": [Volume(name="ckpt", mount_path="/c")]}, "volumes[0]", "exactly one source"),
    ({"volumes": [Volume(name="ckpt", mount_path="/c", claim="c", empty_dir=True)]}, "volumes[0]",
     "got claim, empty_dir"),
    ({"volumes": [Volume(name="ckpt", mount_path="/c", claim="Bad_Claim")]}, "volumes[0].claim",
     "not a valid PersistentVolumeClaim name"),
    ({"volumes": [Volume(name="a", mount_path="/c", claim="c"), Volume(name="a", mount_path="/d", claim="d")]},
     "volumes[1].name", "given twice"),
    ({"volumes": [Volume(name="a", mount_path="/c", claim="c"), Volume(name="b", mount_path="/c/", claim="d")]},
     "volumes[1].mount_path", "mounted twice"),
    ({"volumes": [Volume(name="a", mount_path="/c", claim="c", sub_path="../x")]}, "volumes[0].sub_path",
     "must not contain '..'"),
    ({"volumes": [Volume(name="a", mount_path="/c", claim="c", sub_path="/x")]}, "volumes[0].sub_path",
     "relative path"),
    ({"volumes": [Volume(name="a", mount_path="/c\x00", claim="c")]}, "volumes[0].mount_path", "U+0000"),
    ({"volumes": [Volume(name="a", mount_path="/c", claim="c", read_only="yes")]},  # type: ignore[arg-type]
     "volumes[0].read_only", "must be a bool"),
    ({"volumes": CHECKPOINT}, "volumes", "must be a list of dispatch.Volume"),
    ({"volumes": [{"name": "ckpt"}]}, "volumes[0]", "must be a dispatch.Volume (got dict)"),
    ({"tolerations": [Toleration(key="gpu", operator="In")]}, "tolerations[0].operator", "Equal or Exists"),
    ({"tolerations": [Toleration(key="gpu", operator="Exists", value="x")]}, "tolerations[0].value",
     "must be empty when the operator is Exists"),
    ({"tolerations": [Toleration(value="x")]}, "tolerations[0].operator", "must be Exists when the key is empty"),
    ({"tolerations": [Toleration(key="gpu", effect="NoRun")]}, "tolerations[0].effect", "NoSchedule"),
    ({"tolerations": [Toleration(key="gpu", effect="NoSchedule", seconds=5)]}, "tolerations[0].seconds",
     "only with the effect NoExecute"),
    ({"tolerations": [Toleration(key="gpu", effect="NoExecute", seconds=2**63)]}, "tolerations[0].seconds",
     "at most 9223372036854775807"),
    ({"tolerations": [Toleration(key="bad key!", operator="Exists")]}, "tolerations[0].key", "key 'bad key!'"),
    ({"tolerations": [Toleration(key="gpu", value="a b")]}, "tolerations[0].value", "not a valid label value"),
    ({"service_account": "Trainer_SA"}, "service_account", "not a valid ServiceAccount name"),
    ({"service_account": ""}, "service_account", "must not be empty"),
    ({"image_pull_secrets": "regcred"}, "image_pull_secrets", "not one string (pass ['regcred'])"),
    ({"image_pull_secrets": ["regcred", "regcred"]}, "image_pull_secrets[1]", "given twice"),
    ({"image_pull_secrets": ["Reg Cred"]}, "image_pull_secrets[0]", "not a valid Secret name"),
]


@pytest.mark.parametrize(("settings", "field", "words"), BAD)
def test_a_bad_pod_setting_is_refused_by_name_before_any_request(
    adapter: Adapter, cluster: FakeCluster, settings: dict[str, Any], field: str, words: str
) -> None:
    cluster.server.requests.clear()
    with pytest.raises(InvalidInput) as err:
        adapter.open(JobSpec(job_id="llama", submission="s1", **settings))
    assert field in [c.field for c in err.value.causes], err.value.causes
    assert words in str(err.value)
    assert cluster.server.requests == []


def _runtime(volumes: list[Obj], mounts: list[Obj], container: str = "node") -> Obj:
    return {"spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
        "spec": {"volumes": volumes, "containers": [{"name": container, "volumeMounts": mounts}]}}}}}]}}}}


@pytest.mark.parametrize(("runtime", "field", "words"), [
    (_runtime([{"name": "ckpt", "emptyDir": {}}], []), "volumes[0].name", "is a volume of rt's job node already"),
    (_runtime([{"name": "data", "emptyDir": {}}], [{"name": "data", "mountPath": "/ckpt/"}]), "volumes[0].mount_path",
     "is mounted by rt's job node already"),
    (_runtime([], [], container="trainer"), "volumes", "has no container named 'node'"),
])
def test_a_volume_the_runtime_cannot_take_is_refused(runtime: Obj, field: str, words: str) -> None:
    problems = runtime_problems(JobSpec(job_id="llama", submission="s1", volumes=[CHECKPOINT]),
                                runtime_shape(runtime), "rt")
    assert [(p.field, words in p.message) for p in problems] == [(field, True)]


def test_a_volume_the_runtime_cannot_take_is_refused_before_any_write(cluster: FakeCluster, adapter: Adapter) -> None:
    cluster.add_runtime("other", ("trainer",))
    cluster.server.requests.clear()
    with pytest.raises(InvalidInput, match="has no container named 'node'"):
        adapter.open(JobSpec(job_id="llama", submission="s1", runtime="other", volumes=[CHECKPOINT]))
    assert [m for m, _, _ in cluster.server.requests if m != "GET"] == []


def test_dry_run_client_shows_the_settings(adapter: Adapter) -> None:
    body = adapter.open_dry_run(JobSpec(job_id="llama", submission="s1", **SETTINGS), server=False)
    pod = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert pod["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "ckpt", "mountPath": "/ckpt"}, {"name": "cfg", "mountPath": "/etc/train", "readOnly": True},
        {"name": "token", "mountPath": "/var/run/hf", "subPath": "token"},
        {"name": "scratch", "mountPath": "/scratch"}]}]
