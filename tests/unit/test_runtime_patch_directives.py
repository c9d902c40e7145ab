"""Issue 35, item 1, in the pure decisions: a strategic-merge directive in a runtime patch entry is refused
wherever a TrainJob write is judged (the guard, the CEL policy's mirror, enrolment, ``open -f``), and a start
is judged on the labels the real merge leaves."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _decision as d
from dispatch import _enrol as e
from dispatch._names import ANNOTATION_ADMISSION, PATCH_MANAGER
from dispatch._trainer import TrainJobView, effective_pod_labels, entry_directives

NAME = "llama-s1"
IDENT = {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}
Obj = dict[str, Any]


def own_entry(a: int = 1) -> Obj:
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {
        "metadata": {"labels": dict(IDENT)},
        "spec": {"replicatedJobs": [{"name": "node", "template": {
            "metadata": {"labels": dict(IDENT)},
            "spec": {"template": {"metadata": {"labels": {**IDENT, LABEL_ADMISSION: str(a)}}}}}}]}}}}


def other(pod: Obj | None = None, *, manager: str = "example.com/tuner", job: Obj | None = None,
          jobset: Obj | None = None) -> Obj:
    rj: Obj = {"name": "node", "template": {"spec": {"template": pod or {}}}}
    if job is not None:
        rj["template"]["metadata"] = {"labels": job}
    template: Obj = {"spec": {"replicatedJobs": [rj]}}
    if jobset is not None:
        template["metadata"] = {"labels": jobset}
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


def view(*entries: Obj, a: int = 1, suspend: bool = True) -> TrainJobView:
    return TrainJobView.from_obj({"metadata": {"name": NAME, "namespace": "ns", "uid": "u", "labels": dict(IDENT),
                                               "annotations": {ANNOTATION_ADMISSION: str(a)}},
                                  "spec": {"suspend": suspend, "runtimePatches": [own_entry(a), *entries]}})


REPLACE = other({"metadata": {"labels": {"$patch": "replace", "team": "a"}}})
DEEP = other({"spec": {"$retainKeys": ["containers"], "containers": [{"name": "node", "$patch": "delete"}]}})


def test_a_directive_is_found_where_it_sits_and_the_shallow_search_keeps_only_what_reaches_the_merge() -> None:
    assert entry_directives(REPLACE) == [
        ("trainingRuntimeSpec.template.spec.replicatedJobs[node].template.spec.template.metadata.labels", "$patch",
         "replace")]
    assert [k for _, k, _ in entry_directives(DEEP)] == ["$retainKeys", "$patch"]
    assert entry_directives(DEEP, deep=False) == []  # the CRD prunes them there; Trainer never sees them
    for e_ in (other(job={"$patch": "replace"}), other(jobset={"$patch": "delete"}),
               other({"spec": {"nodeSelector": {"$patch": "delete"}}}),
               other({"metadata": {"annotations": {"$retainKeys": "x"}}})):
        assert len(entry_directives(e_, deep=False)) == 1, e_


@pytest.mark.parametrize("bad", [REPLACE, DEEP, other({"metadata": {"labels": {"$patch": "delete"}}}),
                                 other({"metadata": {"labels": {"$patch": "replace"}}}, manager="kueue.x-k8s.io/m")])
def test_the_guard_refuses_an_entry_with_a_directive_naming_its_manager_and_the_directive(bad: Obj) -> None:
    old, new = view(), view(bad)
    denial = d.guard("UPDATE", old, new, None, None)
    assert denial is not None and f"(manager {bad['manager']}) carries the strategic-merge directive $" in denial
    assert "no runtime patch entry of a dispatch TrainJob carries a key starting with $" in denial
    created = d.guard("CREATE", None, new, None, None)
    assert created is not None and "strategic-merge directive" in created


def test_the_cel_policys_mirror_refuses_what_reaches_the_merge_and_leaves_what_the_crd_prunes() -> None:
    assert "strategic-merge directive $patch: replace" in (d.identity_policy("UPDATE", view(), view(REPLACE)) or "")
    assert "strategic-merge directive" in (d.identity_policy("CREATE", None, view(REPLACE)) or "")
    assert d.identity_policy("UPDATE", view(), view(DEEP)) is None


def test_an_entry_left_as_it_was_is_not_judged_again() -> None:
    """An object that carries one already (written before this release) is not stuck: a hold or another
    write passes; its start is refused on the labels the pods would carry (below)."""
    assert d.guard("UPDATE", view(REPLACE), view(REPLACE, suspend=True), None, None) is None
    assert d.identity_policy("UPDATE", view(REPLACE), view(REPLACE)) is None


def test_another_managers_entry_may_not_set_dispatchs_labels_on_the_jobset_or_a_job() -> None:
    for bad in (other(job={LABEL_SUBMISSION: "s2"}), other(jobset={LABEL_JOB_ID: "other"})):
        for denial in (d.guard("UPDATE", view(), view(bad), None, None),
                       d.identity_policy("UPDATE", view(), view(bad))):
            assert denial is not None and "on the JobSet or a Job" in denial, denial
    fine = other(job=dict(IDENT), jobset=dict(IDENT))
    assert d.guard("UPDATE", view(), view(fine), None, None) is None


def test_a_start_is_judged_on_the_labels_the_real_merge_leaves() -> None:
    assert effective_pod_labels(view(REPLACE)) == {"node": {}}
    assert effective_pod_labels(view(other({"metadata": {"labels": {"$patch": "delete"}}}))) == {"node": {}}
    kept = other({"metadata": {"labels": {"$patch": "replace", **IDENT, LABEL_ADMISSION: "1"}}})
    assert effective_pod_labels(view(kept)) == {"node": {**IDENT, LABEL_ADMISSION: "1"}}
    problem = d.effective_problem(view(REPLACE))
    assert problem is not None and f"would carry {LABEL_JOB_ID}=(none), not llama" in problem


def manifest(*entries: Obj) -> Obj:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tune", "namespace": "ns"},
            "spec": {"runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
                     "runtimePatches": list(entries)}}


RUNTIME = {"spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
    "spec": {"containers": [{"name": "node"}]}}}}}]}}}}


def test_enrolment_and_open_f_refuse_a_directive_naming_the_field_and_the_manager() -> None:
    got = e.enrol(manifest(copy.deepcopy(DEEP)), "a1b2", RUNTIME)
    assert got.denial is not None and "cannot be enrolled in dispatch" in got.denial
    assert ("spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[node].template.spec.template"
            ".spec.$retainKeys") in got.denial
    assert "the entry of manager example.com/tuner carries the strategic-merge directive $retainKeys" in got.denial
    problems = e.manifest_problems(manifest(copy.deepcopy(REPLACE)), "ns")
    assert [f for f, _ in problems] == [
        "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[node].template.spec.template"
        ".metadata.labels.$patch"]
    assert "strategic-merge directive $patch: replace" in problems[0][1]
    assert e.enrol(manifest(other({"metadata": {"labels": {"team": "a"}}})), "a1b2", RUNTIME).denial is None
