"""Enrolment's pure decision (``_enrol.enrol``): what a TrainJob created in an enrolled namespace becomes.

Each patch is applied with a small RFC 6902 applier (add only: the one op enrolment uses) and the result
is read back the way dispatch reads every TrainJob (``TrainJobView``), so "brought under dispatch" is
checked by what dispatch's own verbs will see, and the runtime patch entry against the one ``open`` writes.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, PATCH_MANAGER, POD_FINALIZER, JobSpec, State
from dispatch import _decision as d
from dispatch import _enrol as e
from dispatch import _identity as ident
from dispatch._names import (
    ANNOTATION_ADMISSION,
    ANNOTATION_STARTED,
    ANNOTATION_TOKEN,
    KUEUE_QUEUE_LABEL,
    label_value_problem,
)
from dispatch._trainer import TrainJobView, identity_env, trainjob_body

Obj = dict[str, Any]
UID = "0f6c8a4e-2b1d-4c3a-9e8f-7a6b5c4d3e2f"
RUNTIME: Obj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                "metadata": {"name": "torch-distributed"},
                "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node"}]}}}}
TWO_JOBS: Obj = {"metadata": {"name": "mpi"},
                 "spec": {"template": {"spec": {"replicatedJobs": [{"name": "launcher"}, {"name": "node"}]}}}}


def sdk_trainjob(name: str = "uafe94fe6d9a", **meta: Any) -> Obj:
    """A TrainJob as the Kubeflow SDK's TrainerClient().train() creates it (no dispatch fields)."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "team-a", **meta},
            "spec": {"runtimeRef": {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                    "kind": "ClusterTrainingRuntime"},
                     "trainer": {"image": "pytorch/pytorch:2.7", "command": ["bash", "-c", "python train.py"],
                                 "numNodes": 1}}}


def _token(raw: str) -> str:
    return raw.replace("~1", "/").replace("~0", "~")


def apply(obj: Obj, ops: tuple[Obj, ...]) -> Obj:
    """RFC 6902 ``add`` (a member added or replaced; ``-`` appends to a list), on a copy."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add", op
        *parents, last = [_token(t) for t in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            if last == "-":
                node.append(copy.deepcopy(op["value"]))
            else:
                node.insert(int(last), copy.deepcopy(op["value"]))
        else:
            node[last] = copy.deepcopy(op["value"])
    return out


def enrolled(obj: Obj, uid: str = UID, runtime: Obj | None = RUNTIME) -> tuple[Obj, e.Enrolment]:
    got = e.enrol(obj, uid, runtime)
    assert got.allowed, got.denial
    return apply(obj, got.patch), got


def refused(obj: Obj, uid: str = UID, runtime: Obj | None = RUNTIME) -> str:
    got = e.enrol(obj, uid, runtime)
    assert got.denial is not None and got.patch == () and got.warnings == ()
    return got.denial


# ---------------------------------------------------------------- what an enrolled TrainJob is


def test_an_sdk_trainjob_becomes_a_held_dispatch_object_named_by_its_name_and_the_request() -> None:
    obj, got = enrolled(sdk_trainjob())
    tj = TrainJobView.from_obj(obj)
    assert (got.job_id, got.submission) == ("uafe94fe6d9a", UID)
    assert tj.dispatch_object and tj.labelled and not tj.problems
    assert tj.identity.job_id == "uafe94fe6d9a" and tj.identity.submission == UID and tj.admission == 0
    assert tj.state is State.HELD and tj.patch_targets == ("node",) and tj.patch_admission == 0
    assert obj["metadata"]["labels"] == {LABEL_JOB_ID: "uafe94fe6d9a", LABEL_SUBMISSION: UID}
    assert obj["metadata"]["annotations"] == {ANNOTATION_ADMISSION: "0"}
    # the user's trainer is kept; the identity variables come from the pod's own labels
    assert obj["spec"]["trainer"]["image"] == "pytorch/pytorch:2.7"
    assert obj["spec"]["trainer"]["env"] == identity_env()
    assert got.warnings == (f"dispatch enrolled this TrainJob as uafe94fe6d9a/{UID}, suspended: "
                            "`dispatch release uafe94fe6d9a` starts it",)


def test_the_runtime_patch_entry_is_exactly_the_one_open_writes() -> None:
    obj, got = enrolled(sdk_trainjob())
    opened = trainjob_body(JobSpec(job_id=got.job_id, submission=got.submission), "uafe94fe6d9a", "team-a",
                           ["node"])
    assert obj["spec"]["runtimePatches"] == opened["spec"]["runtimePatches"]
    [entry] = obj["spec"]["runtimePatches"]
    assert entry["manager"] == PATCH_MANAGER
    pod_meta = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["metadata"]
    assert pod_meta["finalizers"] == [POD_FINALIZER]
    assert pod_meta["labels"][ANNOTATION_ADMISSION] == "0"
    # and the env, labels and annotation A=0 too, as open sets them
    assert obj["spec"]["trainer"]["env"] == opened["spec"]["trainer"]["env"]
    assert obj["metadata"]["annotations"] == opened["metadata"]["annotations"]


def test_every_replicated_job_of_the_runtime_is_targeted() -> None:
    obj, _ = enrolled(sdk_trainjob(), runtime=TWO_JOBS)
    assert TrainJobView.from_obj(obj).patch_targets == ("launcher", "node")


def test_a_queued_trainjob_waits_for_kueue_and_dispatchs_check() -> None:
    obj, got = enrolled(sdk_trainjob(labels={KUEUE_QUEUE_LABEL: "lq"}))
    tj = TrainJobView.from_obj(obj)
    assert tj.state is State.QUEUED and tj.queue == "lq" and tj.dispatch_object
    assert obj["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "lq"
    assert got.warnings == ()  # Kueue starts it: nothing for the user to run


def test_it_is_always_created_suspended() -> None:
    """The CRD defaults suspend to false before any webhook runs: false, absent and true all end suspended."""
    obj, got = enrolled(sdk_trainjob())
    assert obj["spec"]["suspend"] is True
    defaulted = sdk_trainjob()
    defaulted["spec"]["suspend"] = False
    obj, got = enrolled(defaulted)
    assert obj["spec"]["suspend"] is True and len(got.warnings) == 1
    already = sdk_trainjob()
    already["spec"]["suspend"] = True
    _, got = enrolled(already)
    assert not [op for op in got.patch if op["path"] == "/spec/suspend"]


def test_what_the_creator_set_is_kept_and_ours_is_added() -> None:
    obj = sdk_trainjob(labels={"team": "vision"}, annotations={"note": "x"})
    obj["spec"]["runtimePatches"] = [{"manager": "kueue.x-k8s.io/manager", "time": "2026-01-01T00:00:00Z"}]
    obj["spec"]["trainer"]["env"] = [{"name": "LR", "value": "0.1"}]
    out, _ = enrolled(obj)
    assert out["metadata"]["labels"] == {"team": "vision", LABEL_JOB_ID: "uafe94fe6d9a", LABEL_SUBMISSION: UID}
    assert out["metadata"]["annotations"] == {"note": "x", ANNOTATION_ADMISSION: "0"}
    assert [p["manager"] for p in out["spec"]["runtimePatches"]] == ["kueue.x-k8s.io/manager", PATCH_MANAGER]
    assert out["spec"]["trainer"]["env"] == [{"name": "LR", "value": "0.1"}, *identity_env()]


def test_a_trainjob_with_no_trainer_gets_one_with_the_identity_variables_only() -> None:
    obj = sdk_trainjob()
    del obj["spec"]["trainer"]
    out, _ = enrolled(obj)
    assert out["spec"]["trainer"] == {"env": identity_env()}
    obj = sdk_trainjob()
    obj["spec"]["trainer"] = {"image": "x"}
    out, _ = enrolled(obj)
    assert out["spec"]["trainer"] == {"image": "x", "env": identity_env()}


def test_identity_variables_already_as_dispatch_sets_them_are_not_added_twice() -> None:
    obj = sdk_trainjob()
    obj["spec"]["trainer"]["env"] = identity_env()[:1]
    out, _ = enrolled(obj)
    assert out["spec"]["trainer"]["env"] == identity_env()


def test_label_keys_are_escaped_as_json_pointers() -> None:
    _, got = enrolled(sdk_trainjob(labels={"team": "vision"}))
    paths = [op["path"] for op in got.patch]
    assert "/metadata/labels/dispatch.phpboyscout.uk~1job-id" in paths
    assert "/metadata/annotations" in paths  # none before: the whole map
    _, got = enrolled(sdk_trainjob(annotations={}))
    assert "/metadata/annotations/dispatch.phpboyscout.uk~1admission" in [op["path"] for op in got.patch]


# ---------------------------------------------------------------- the identity


def test_labels_the_creator_set_are_the_identity() -> None:
    obj, got = enrolled(sdk_trainjob(labels={LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s7"}))
    assert (got.job_id, got.submission) == ("llama", "s7")
    assert TrainJobView.from_obj(obj).identity.job_id == "llama"
    assert not [op for op in got.patch if op["path"].startswith("/metadata/labels/")]


def test_a_job_id_label_alone_keeps_the_job_and_the_request_names_the_submission() -> None:
    _, got = enrolled(sdk_trainjob(labels={LABEL_JOB_ID: "llama"}))
    assert (got.job_id, got.submission) == ("llama", UID)
    _, got = enrolled(sdk_trainjob(labels={LABEL_SUBMISSION: "s2"}))
    assert (got.job_id, got.submission) == ("uafe94fe6d9a", "s2")


def test_generate_name_gives_the_job_id_its_prefix() -> None:
    obj = sdk_trainjob()
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "finetune-"
    out, got = enrolled(obj)
    assert got.job_id == "finetune"
    assert got.warnings[-1].endswith("`dispatch release <name>` starts it")
    assert "name" not in out["metadata"]  # the API server still generates it


def test_a_reused_name_is_a_new_submission() -> None:
    """Two creates of one name (the first deleted by kubectl, say) never share an identity record."""
    first = e.enrol(sdk_trainjob(), str(uuid.uuid4()), RUNTIME)
    second = e.enrol(sdk_trainjob(), str(uuid.uuid4()), RUNTIME)
    assert first.job_id == second.job_id and first.submission != second.submission
    assert ident.record_name(first.job_id, first.submission) != ident.record_name(second.job_id, second.submission)


NAMES = st.from_regex(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@given(name=NAMES, uids=st.lists(st.uuids(), min_size=2, max_size=6, unique=True))
def test_every_derived_identity_is_valid_and_no_two_creates_share_one(name: str, uids: list[uuid.UUID]) -> None:
    pairs = set()
    for uid in uids:
        got = e.enrol(sdk_trainjob(name), str(uid), RUNTIME)
        assert got.allowed, got.denial
        assert label_value_problem(got.job_id) is None and label_value_problem(got.submission) is None
        assert TrainJobView.from_obj(apply(sdk_trainjob(name), got.patch)).dispatch_object
        pairs.add((got.job_id, got.submission))
    assert len(pairs) == len(uids)


# ---------------------------------------------------------------- left as it is


def test_an_object_dispatch_opened_is_left_exactly_as_it_is() -> None:
    body = trainjob_body(JobSpec(job_id="llama", submission="s1"), "llama-s1", "team-a", ["node"])
    got = e.enrol(body, UID, None)  # not even the runtime is needed
    assert got.allowed and got.patch == () and (got.job_id, got.submission) == ("llama", "s1")
    unheld = trainjob_body(JobSpec(job_id="llama", submission="s1"), "llama-s1", "team-a", ["node"], suspend=False)
    assert e.enrol(unheld, UID, RUNTIME).patch == ()  # `open --no-hold`: the validating guard judges that start
    assert e.is_dispatch(body) and not e.is_dispatch(sdk_trainjob())


def test_enrolling_again_changes_nothing() -> None:
    """The webhook invoked again (reinvocationPolicy IfNeeded) finds its own enrolment."""
    obj, _ = enrolled(sdk_trainjob(labels={KUEUE_QUEUE_LABEL: "lq"}))
    again = e.enrol(obj, str(uuid.uuid4()), RUNTIME)
    assert again.allowed and again.patch == () and again.submission == UID


def test_the_validating_guard_lets_the_enrolled_create_through_without_a_read() -> None:
    obj, _ = enrolled(sdk_trainjob())
    tj = TrainJobView.from_obj(obj)
    assert not d.starts_execution("CREATE", None, tj)
    assert d.guard("CREATE", None, tj, None, None) is None  # no verdict read: it starts nothing
    # and the same object unsuspended at creation would be judged, and refused without a read
    started = copy.deepcopy(obj)
    started["spec"]["suspend"] = False
    assert d.guard("CREATE", None, TrainJobView.from_obj(started), None, None) == (
        "trainjob uafe94fe6d9a cannot start: a dispatch TrainJob is created suspended and started by "
        "`dispatch release` (or Kueue through dispatch's admission check)")


# ---------------------------------------------------------------- refused, naming the field


@pytest.mark.parametrize(("key", "value", "says"), [
    (LABEL_JOB_ID, "Bad Value!", "metadata.labels[dispatch.phpboyscout.uk/job-id] 'Bad Value!' must be empty or"),
    (LABEL_JOB_ID, "x" * 64, "metadata.labels[dispatch.phpboyscout.uk/job-id] "),
    (LABEL_JOB_ID, "", "metadata.labels[dispatch.phpboyscout.uk/job-id] is empty"),
    (LABEL_SUBMISSION, "-s1", "metadata.labels[dispatch.phpboyscout.uk/submission] '-s1' must be empty or"),
    (LABEL_SUBMISSION, "", "metadata.labels[dispatch.phpboyscout.uk/submission] is empty"),
])
def test_a_bad_identity_label_is_refused_naming_it(key: str, value: str, says: str) -> None:
    denial = refused(sdk_trainjob(labels={key: value}))
    assert denial.startswith("trainjob uafe94fe6d9a cannot be enrolled in dispatch: ")
    assert says in denial


def test_a_label_that_is_not_text_is_refused() -> None:
    assert "metadata.labels[dispatch.phpboyscout.uk/job-id] is not a string" in refused(
        sdk_trainjob(labels={LABEL_JOB_ID: 7}))


def test_a_64_character_label_says_its_length() -> None:
    assert "must be at most 63 characters (got 64)" in refused(sdk_trainjob(labels={LABEL_SUBMISSION: "s" * 64}))


@pytest.mark.parametrize("key", [ANNOTATION_ADMISSION, ANNOTATION_TOKEN, ANNOTATION_STARTED])
def test_dispatchs_own_annotations_are_refused(key: str) -> None:
    assert f"metadata.annotations[{key}] is dispatch's own" in refused(sdk_trainjob(annotations={key: "3"}))


def test_a_dispatch_entry_without_both_identity_labels_is_refused() -> None:
    body = trainjob_body(JobSpec(job_id="llama", submission="s1"), "llama-s1", "team-a", ["node"])
    del body["metadata"]["labels"][LABEL_SUBMISSION]
    assert ("spec.runtimePatches[0] has dispatch's manager dispatch.phpboyscout.uk/dispatch but the object lacks"
            in refused(body))


@pytest.mark.parametrize(("var", "index"), [("DISPATCH_JOB_ID", 0), ("DISPATCH_ADMISSION", 1)])
def test_an_identity_variable_set_otherwise_is_refused_naming_it(var: str, index: int) -> None:
    obj = sdk_trainjob()
    obj["spec"]["trainer"]["env"] = [{"name": "LR", "value": "1"}, {"name": var, "value": "7"}][-index - 1:]
    denial = refused(obj)
    assert f"spec.trainer.env[{index}] sets {var}, which dispatch sets from the pod's label" in denial


@pytest.mark.parametrize(("mutate", "says"), [
    (lambda o: o["spec"].__setitem__("trainer", "x"), "spec.trainer is not an object"),
    (lambda o: o["spec"]["trainer"].__setitem__("env", {"A": "1"}), "spec.trainer.env is not a list"),
    (lambda o: o.__setitem__("spec", []), "spec is not an object"),
    (lambda o: o["metadata"].__setitem__("labels", ["a"]), "metadata.labels is not an object"),
    (lambda o: o["metadata"].__setitem__("annotations", "a"), "metadata.annotations is not an object"),
    (lambda o: o["spec"]["runtimeRef"].pop("name"), "spec.runtimeRef names no runtime"),
    (lambda o: o["spec"]["runtimeRef"].__setitem__("kind", "Pod"), "spec.runtimeRef names no runtime"),
])
def test_a_malformed_trainjob_is_refused_naming_the_field(mutate: Any, says: str) -> None:
    obj = sdk_trainjob()
    mutate(obj)
    assert says in refused(obj)


def test_a_missing_or_empty_runtime_is_refused_naming_it() -> None:
    assert refused(sdk_trainjob(), runtime=None).endswith(
        "spec.runtimeRef.name: ClusterTrainingRuntime torch-distributed not found")
    empty = {"metadata": {"name": "torch-distributed"}, "spec": {"template": {"spec": {}}}}
    assert refused(sdk_trainjob(), runtime=empty).endswith(
        "spec.runtimeRef.name: ClusterTrainingRuntime torch-distributed has no replicatedJobs")


def test_the_runtime_reference_defaults_as_trainers_api_does() -> None:
    obj = sdk_trainjob()
    obj["spec"]["runtimeRef"] = {"name": "torch-distributed"}
    assert e.runtime_ref(obj) == ("ClusterTrainingRuntime", "torch-distributed")
    obj["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    assert e.runtime_ref(obj) == ("TrainingRuntime", "torch-distributed")


def test_no_name_to_take_the_job_id_from_is_refused() -> None:
    obj = sdk_trainjob()
    del obj["metadata"]["name"]
    assert "neither metadata.name nor metadata.generateName" in refused(obj)
    obj["metadata"]["generateName"] = "-"
    assert "neither metadata.name nor metadata.generateName" in refused(obj)


def test_a_request_without_a_usable_uid_is_refused_unless_the_submission_is_set() -> None:
    assert "the admission request's uid '' is not a usable submission" in refused(sdk_trainjob(), uid="")
    assert e.enrol(sdk_trainjob(labels={LABEL_SUBMISSION: "s1"}), "", RUNTIME).allowed


def test_a_runtime_whose_job_is_nonindexed_and_parallel_is_refused_at_enrolment() -> None:
    """Issue 35 item 6: runtimes come from ClusterTrainingRuntimes any author sets; a NonIndexed Job with more
    than one pod at once (Trainer sizes the node job by numNodes) is refused, naming the replicatedJob and fields."""
    bag: Obj = copy.deepcopy(RUNTIME)
    bag["spec"]["template"]["spec"]["replicatedJobs"][0]["template"] = {"spec": {"completionMode": "NonIndexed"}}
    two = sdk_trainjob()
    two["spec"]["trainer"]["numNodes"] = 2
    denial = refused(two, runtime=bag)
    assert ("spec.runtimeRef.name: ClusterTrainingRuntime torch-distributed: replicatedJob node (completionMode: "
            "NonIndexed, parallelism 2)") in denial, denial
    assert "set completionMode: Indexed" in denial
    enrolled(sdk_trainjob(), runtime=bag)                 # one node: one pod at a time, nothing to tell apart
