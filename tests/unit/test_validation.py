"""Bad input is refused with a message naming the field, and nothing is written."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, Adapter, InvalidInput, JobSpec
from dispatch.testing import FakeCluster

CASES = [
    (JobSpec(job_id="", submission="s1"), "job_id", "must not be empty"),
    (JobSpec(job_id="has space", submission="s1"), "job_id", "not a valid label value"),
    (JobSpec(job_id="x" * 64, submission="s1"), "job_id", "at most 63 characters"),
    (JobSpec(job_id="-lead", submission="s1"), "job_id", "not a valid label value"),
    (JobSpec(job_id="llama", submission="s/1"), "submission", "not a valid label value"),
    (JobSpec(job_id="llama", submission=""), "submission", "must not be empty"),
    (JobSpec(job_id="Llama", submission="s1"), "name", "derived as <job_id>-<submission>"),
    (JobSpec(job_id="9lives", submission="s1"), "name", "start with a letter"),
    (JobSpec(job_id="a" * 40, submission="b" * 30), "name", "at most 63 characters"),
    (JobSpec(job_id="llama", submission="s1", name="Bad_Name"), "name", "not a valid TrainJob name"),
    (JobSpec(job_id="llama", submission="s1", runtime="Torch!"), "runtime", "lower case"),
    (JobSpec(job_id="llama", submission="s1", runtime_kind="Runtime"), "runtime_kind", "ClusterTrainingRuntime"),
    (JobSpec(job_id="llama", submission="s1", num_nodes=0), "num_nodes", "at least 1"),
    (JobSpec(job_id="llama", submission="s1", queue="Q!"), "queue", "lower case"),
    (JobSpec(job_id="llama", submission="s1", termination_grace_period_seconds=-1),
     "termination_grace_period_seconds", "negative"),
    (JobSpec(job_id="llama", submission="s1", queue="lq", termination_grace_period_seconds=5),
     "termination_grace_period_seconds", "not kept under a queue: Kueue admits a TrainJob with a whole-object"),
    (JobSpec(job_id="llama", submission="s1", labels={LABEL_ADMISSION: "9"}),
     "labels[dispatch.phpboyscout.uk/admission]", "reserved"),
    (JobSpec(job_id="llama", submission="s1", labels={"team": "a b"}), "labels[team]", "label value"),
    # refused, never reshaped: what the API would cap, round, drop or duplicate
    (JobSpec(job_id="llama", submission="s1", env={"DISPATCH_ADMISSION": "99"}), "env[DISPATCH_ADMISSION]",
     "is set by dispatch from the pod's label dispatch.phpboyscout.uk/admission"),
    (JobSpec(job_id="llama", submission="s1", env={"DISPATCH_OWN": "x"}), "env[DISPATCH_OWN]",
     "is reserved for dispatch (variables starting DISPATCH_)"),
    (JobSpec(job_id="llama", submission="s1", num_nodes=2**31), "num_nodes", "at most 2147483647"),
    (JobSpec(job_id="llama", submission="s1", termination_grace_period_seconds=2**63),
     "termination_grace_period_seconds", "at most 9223372036854775807"),
    (JobSpec(job_id="llama", submission="s1", resources_per_node={"memory": "9Ei"}), "resources_per_node[memory]",
     "more than 9223372036854775807"),
    (JobSpec(job_id="llama", submission="s1", resources_per_node={"cpu": "1.0001"}), "resources_per_node[cpu]",
     "finer than a thousandth"),
    (JobSpec(job_id="llama", submission="s1", command=["python", "a\x00b"]), "command[1]",
     "contains the control character U+0000 at offset 1"),
    (JobSpec(job_id="llama", submission="s1", image="img\x00"), "image", "U+0000"),
    (JobSpec(job_id="llama", submission="s1", env={"A": "\x9b31m"}), "env[A]", "U+009B"),
    (JobSpec(job_id="llama", submission="s1", pod_annotations={"a": "\r"}), "pod_annotations[a]", "U+000D"),
    (JobSpec(job_id="llama", submission="s1", args=["x" * 1024] * 4096), "spec",
     "its text is more than 1572864 bytes, the most the API server can store as one object"),
]


@pytest.fixture
def fake() -> FakeCluster:
    c = FakeCluster()
    c.add_runtime()
    return c


@pytest.mark.parametrize(("spec", "field", "words"), CASES)
def test_bad_spec_is_refused_naming_the_field_and_nothing_is_sent(
    fake: FakeCluster, spec: JobSpec, field: str, words: str
) -> None:
    fake.server.requests.clear()
    with Adapter.connect("default", transport=fake.transport()) as adapter, pytest.raises(InvalidInput) as err:
        adapter.open(spec)
    assert field in [c.field for c in err.value.causes]
    assert words in str(err.value)
    assert field in str(err.value)
    assert fake.server.requests == []


@pytest.mark.parametrize("name", ["", "Upper", "a_b", "x" * 64, "1abc", "ends-"])
def test_bad_names_are_refused_before_any_request(fake: FakeCluster, name: str) -> None:
    fake.server.requests.clear()
    with Adapter.connect("default", transport=fake.transport()) as adapter:
        for call in (adapter.release, adapter.hold, adapter.inspect, adapter.ceased, adapter.close):
            with pytest.raises(InvalidInput, match="name"):
                call(name)
    assert fake.server.requests == []


def test_bad_namespace_is_refused() -> None:
    with pytest.raises(InvalidInput, match="namespace"):
        Adapter.connect("Not_A_Namespace", transport=FakeCluster().transport())


def test_bad_find_filter_is_refused(fake: FakeCluster) -> None:
    with Adapter.connect("default", transport=fake.transport()) as adapter, pytest.raises(InvalidInput, match="job_id"):
        adapter.find(job_id="no spaces allowed")


def test_every_bad_field_is_named_at_once(fake: FakeCluster) -> None:
    with Adapter.connect("default", transport=fake.transport()) as adapter, pytest.raises(InvalidInput) as err:
        adapter.open(JobSpec(job_id="a b", submission="c d", num_nodes=0))
    assert {c.field for c in err.value.causes} == {"job_id", "submission", "num_nodes"}


def test_unknown_runtime_is_refused_before_the_trainjob_is_written(fake: FakeCluster) -> None:
    from dispatch import NotFound

    with Adapter.connect("default", transport=fake.transport()) as adapter, pytest.raises(NotFound, match="nope"):
        adapter.open(JobSpec(job_id="llama", submission="s1", runtime="nope"))
    assert not [m for m, _, _ in fake.server.requests if m == "POST"]


def test_duplicate_submission_is_refused(fake: FakeCluster) -> None:
    from dispatch import Refused

    with Adapter.connect("default", transport=fake.transport()) as adapter:
        adapter.open(JobSpec(job_id="llama", submission="s1"))
        with pytest.raises(Refused, match="already exists"):
            adapter.open(JobSpec(job_id="llama", submission="s1", name="other-name"))


def _drop_grace(body: dict[str, Any]) -> dict[str, Any]:
    """Trainer v2.2's schema: runtime-patch pod specs have no terminationGracePeriodSeconds."""
    import copy

    out = copy.deepcopy(body)
    for entry in out.get("spec", {}).get("runtimePatches", []):
        for rj in entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["template"].get("spec", {}).pop("terminationGracePeriodSeconds", None)
    return out


def test_a_grace_period_the_cluster_would_drop_is_refused_and_nothing_is_written(fake: FakeCluster) -> None:
    fake.server.prune["trainjobs"] = _drop_grace
    with Adapter.connect("default", transport=fake.transport()) as adapter:
        with pytest.raises(InvalidInput, match="termination_grace_period_seconds") as err:
            adapter.open(JobSpec(job_id="llama", submission="s1", termination_grace_period_seconds=5))
        assert "Trainer v2.3" in str(err.value)
        assert fake.server.objects("trainer.kubeflow.org", "trainjobs") == []
        del fake.server.prune["trainjobs"]
        adapter.open(JobSpec(job_id="llama", submission="s1", termination_grace_period_seconds=5))


def test_tab_and_newline_are_text_and_the_largest_api_values_pass(fake: FakeCluster) -> None:
    spec = JobSpec(job_id="llama", submission="s1", env={"SCRIPT": "a\tb\nc"}, num_nodes=2**31 - 1,
                   resources_per_node={"cpu": "1.001", "memory": "7Ei"}, args=["x" * 1024] * 1500)
    with Adapter.connect("default", transport=fake.transport()) as adapter:
        adapter.open(spec)
