"""``open_manifest`` (``dispatch open -f trainjob.yaml``): a whole TrainJob manifest brought under dispatch
exactly as enrolment brings one (``_enrol.enrol``'s JSONPatch, applied as the API server applies it), then
opened as ``open`` opens a spec; refusals name the field and write nothing. With the shipped writer's
permissions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatch import (
    ANNOTATION_ADMISSION,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    PATCH_MANAGER,
    Adapter,
    InvalidInput,
    JobSpec,
    Refused,
    State,
)
from dispatch._api import Obj
from dispatch._enrol import apply_patch, enrol
from dispatch.testing import FakeCluster

TRAINER = "trainer.kubeflow.org"


def manifest(name: str = "llama", **meta: Any) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, **meta},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"image": "ghcr.io/example/train:1.0", "numNodes": 1,
                        "env": [{"name": "WANDB_MODE", "value": "offline"}]},
        },
    }


def stored(cluster: FakeCluster, name: str = "llama") -> Obj:
    obj = cluster.server.get(TRAINER, "trainjobs", "default", name)
    assert obj is not None
    return obj


def writes(cluster: FakeCluster) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in cluster.server.requests if m in ("POST", "PUT", "PATCH", "DELETE")]


def test_a_manifest_is_created_exactly_as_enrolment_would_bring_it_under_dispatch(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    given = manifest()
    status = adapter.open_manifest(given)
    assert status.state is State.HELD and status.identity.job_id == "llama" and status.identity.admission == 0
    obj = stored(cluster)
    submission = obj["metadata"]["labels"][LABEL_SUBMISSION]
    runtime = cluster.server.get(TRAINER, "clustertrainingruntimes", "", "torch-distributed")
    expected = apply_patch(given, enrol(given, submission, runtime).patch)
    for key in ("labels", "annotations"):
        assert obj["metadata"][key] == expected["metadata"][key]
    assert obj["spec"] == expected["spec"]
    assert obj["metadata"]["labels"][LABEL_JOB_ID] == "llama"
    assert obj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "0"
    assert obj["spec"]["suspend"] is True
    assert [e["manager"] for e in obj["spec"]["runtimePatches"]] == [PATCH_MANAGER]
    assert given == manifest()  # the caller's object is not changed


def test_the_opened_manifest_runs_as_a_dispatch_object(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open_manifest(manifest(labels={LABEL_JOB_ID: "llm", LABEL_SUBMISSION: "s7", "team": "ml"}))
    assert adapter.release("llama").admission == 1
    cluster.settle()
    (pod,) = cluster.pods("llama")
    labels = pod["metadata"]["labels"]
    assert (labels[LABEL_JOB_ID], labels[LABEL_SUBMISSION], labels[LABEL_ADMISSION]) == ("llm", "s7", "1")
    assert stored(cluster)["metadata"]["labels"]["team"] == "ml"
    assert [s.name for s in adapter.find(job_id="llm")] == ["llama"]


def test_no_hold_admits_through_the_check(adapter: Adapter, cluster: FakeCluster) -> None:
    status = adapter.open_manifest(manifest(), hold=False)
    assert status.state is State.RUNNING and status.identity.admission == 1


def test_each_open_of_one_unlabelled_manifest_is_a_new_submission(adapter: Adapter, cluster: FakeCluster) -> None:
    """As enrolment takes each create's request uid: a reused name is a new submission."""
    first = adapter.open_manifest(manifest())
    adapter.close("llama")
    cluster.settle()
    second = adapter.open_manifest(manifest())
    assert first.identity.submission != second.identity.submission


def test_a_manifest_already_dispatchs_is_taken_unchanged(adapter: Adapter, cluster: FakeCluster) -> None:
    body = adapter.open_dry_run(JobSpec(job_id="llama", submission="s1", name="llama"), server=False)
    adapter.open_manifest(body)
    obj = stored(cluster)
    assert obj["spec"] == {**body["spec"]}
    assert obj["metadata"]["labels"] == body["metadata"]["labels"]


def test_dry_run_client_shows_the_enrolled_body_and_writes_nothing(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.server.requests.clear()
    body = adapter.open_manifest_dry_run(manifest(), server=False)
    assert body["metadata"]["labels"][LABEL_JOB_ID] == "llama" and body["spec"]["suspend"] is True
    assert writes(cluster) == []


def _with(change: Any) -> Obj:
    obj = manifest()
    change(obj)
    return obj


REFUSED: list[tuple[Obj, str]] = [
    (_with(lambda o: o.update(kind="Job")), "kind: must be TrainJob (got 'Job')"),
    (_with(lambda o: o.update(apiVersion="trainer.kubeflow.org/v2")),
     "apiVersion: must be trainer.kubeflow.org/v1alpha1"),
    (_with(lambda o: o["metadata"].update(namespace="other")), "metadata.namespace: is 'other', not the namespace"),
    (_with(lambda o: o.update(metadata={"generateName": "llama-"})), "generateName is not taken"),
    (_with(lambda o: o["metadata"].update(resourceVersion="42")), "metadata.resourceVersion: is set by the API server"),
    (_with(lambda o: o["metadata"].update(uid="u")), "metadata.uid: is set by the API server"),
    (_with(lambda o: o.update(status={"conditions": []})), "status: is written by Trainer"),
    (_with(lambda o: o.update(spec=[])), "spec: must be an object"),
    (_with(lambda o: o["metadata"].update(labels={LABEL_JOB_ID: "a b"})),
     "metadata.labels[dispatch.phpboyscout.uk/job-id] 'a b'"),
    (_with(lambda o: o["metadata"].update(annotations={ANNOTATION_ADMISSION: "9"})),
     "metadata.annotations[dispatch.phpboyscout.uk/admission] is dispatch's own"),
    (_with(lambda o: o["spec"]["trainer"]["env"].append({"name": "DISPATCH_ADMISSION", "value": "99"})),
     "spec.trainer.env[1] sets DISPATCH_ADMISSION, which dispatch sets from the pod's label"),
    (_with(lambda o: o["spec"].update(runtimePatches=[{"manager": PATCH_MANAGER}])),
     "has dispatch's manager dispatch.phpboyscout.uk/dispatch but the object lacks"),
    (_with(lambda o: o["spec"].update(runtimePatches=[{"manager": "example.com/tuner", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"metadata": {
            "labels": {"$patch": "replace"}}}}}}]}}}}])),
     "replicatedJobs[node].template.spec.template.metadata.labels.$patch: the entry of manager example.com/tuner "
     "carries the strategic-merge directive $patch: replace"),  # issue 35, item 1
    (_with(lambda o: o["spec"].update(runtimeRef={"name": "nope"})),
     "spec.runtimeRef.name: ClusterTrainingRuntime nope not found"),
    (_with(lambda o: o["spec"].update(runtimeRef={"name": "torch-distributed", "kind": "Runtime"})),
     "spec.runtimeRef names no runtime"),
]


@pytest.mark.parametrize(("obj", "words"), REFUSED)
def test_a_manifest_dispatch_cannot_take_is_refused_naming_the_field_and_nothing_is_written(
    adapter: Adapter, cluster: FakeCluster, obj: Obj, words: str
) -> None:
    cluster.server.requests.clear()
    before = copy.deepcopy(obj)
    with pytest.raises(InvalidInput) as err:
        adapter.open_manifest(obj)
    assert words in str(err.value), str(err.value)
    assert writes(cluster) == []
    assert obj == before


def test_a_manifest_whose_name_is_taken_is_refused_and_its_claim_given_back(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    adapter.open_manifest(manifest(labels={LABEL_SUBMISSION: "s1"}))
    with pytest.raises(Refused, match="trainjob llama already exists"):
        adapter.open_manifest(manifest(labels={LABEL_SUBMISSION: "s2"}))
    # the refused open gave its claim of llama/s2 back: another object may take that submission
    assert adapter.open_manifest(manifest("llama-two", labels={LABEL_SUBMISSION: "s2"})).identity.submission == "s2"
