"""Every JobSpec field is checked (types, quantities, names, keys) before any request: a bad one raises
InvalidInput naming it, and nothing reaches the fake API server."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, Adapter, InvalidInput, JobSpec
from dispatch._validate import env_name_problem, parse_quantity, qualified_name_problem, spec_problems
from dispatch.testing import FakeCluster


def spec(**fields: Any) -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", **fields)


# (JobSpec, the field named, words in the message)
BAD: list[tuple[JobSpec, str, str]] = [
    (spec(command="python train.py"), "command", "not one string"),
    (spec(args="--epochs 3"), "args", "one character per element"),
    (spec(command=["python", 3]), "command[1]", "must be a string (got int 3)"),
    (spec(args=b"x"), "args", "must be a list of strings"),
    (spec(command=42), "command", "must be a list of strings (got int)"),
    (spec(num_nodes="2"), "num_nodes", "must be an int (got str '2')"),
    (spec(num_nodes=True), "num_nodes", "must be an int (got bool True)"),
    (spec(num_nodes=2.0), "num_nodes", "must be an int"),
    (spec(termination_grace_period_seconds="30"), "termination_grace_period_seconds", "must be an int"),
    (spec(image=""), "image", "must not be empty"),
    (spec(image="train :1"), "image", "whitespace"),
    (spec(image=5), "image", "must be a string"),
    (JobSpec(job_id=7, submission="s1"), "job_id", "must be a string (got int 7)"),  # type: ignore[arg-type]
    (spec(name=5), "name", "must be a string"),
    (spec(runtime=None), "runtime", "must be a string"),
    (spec(queue="a" * 64), "queue", "at most 63"),
    (spec(priority_class="High!"), "priority_class", "lower case"),
    (spec(env={"A": 1}), "env[A]", "must be a string (got int 1); pass '1'"),
    (spec(env={"A": True}), "env[A]", "got bool True"),
    (spec(env={"A": None}), "env[A]", "got NoneType None"),
    (spec(env={1: "x"}), "env[1]", "keys must be strings"),
    (spec(env=[("A", "1")]), "env", "must be a mapping"),
    (spec(env={"MY VAR": "1"}), "env[MY VAR]", "not an environment variable name"),
    (spec(env={"1ABC": "1"}), "env[1ABC]", "must not start with a digit"),
    (spec(env={"A=B": "1"}), "env[A=B]", "not an environment variable name"),
    (spec(env={"": "1"}), "env[]", "must not be empty"),
    (spec(resources_per_node={"cpu": "abc"}), "resources_per_node[cpu]", "'abc' is not a quantity"),
    (spec(resources_per_node={"cpu": "1.5.2"}), "resources_per_node[cpu]", "is not a quantity"),
    (spec(resources_per_node={"memory": "4GB"}), "resources_per_node[memory]", "is not a quantity"),
    (spec(resources_per_node={"memory": "4 Gi"}), "resources_per_node[memory]", "is not a quantity"),
    (spec(resources_per_node={"memory": ""}), "resources_per_node[memory]", "is not a quantity"),
    (spec(resources_per_node={"cpu": "-1"}), "resources_per_node[cpu]", "must not be negative"),
    (spec(resources_per_node={"cpu": 2}), "resources_per_node[cpu]", "must be a string (got int 2)"),
    (spec(resources_per_node={"gpu": "1"}), "resources_per_node[gpu]", "not a standard resource"),
    (spec(resources_per_node={"": "1"}), "resources_per_node[]", "not a standard resource"),
    (spec(resources_per_node={"nvidia.com/gpu": "0.5"}), "resources_per_node[nvidia.com/gpu]", "whole number"),
    (spec(resources_per_node={"Nvidia_com/gpu": "1"}), "resources_per_node[Nvidia_com/gpu]", "prefix"),
    (spec(labels={"team": 1}), "labels[team]", "must be a string"),
    (spec(labels={"bad key": "x"}), "labels[bad key]", "key 'bad key'"),
    (spec(labels={"example.com/": "x"}), "labels[example.com/]", "empty name after '/'"),
    (spec(labels={"/x": "x"}), "labels[/x]", "empty prefix"),
    (spec(labels={"Example.COM/x": "x"}), "labels[Example.COM/x]", "prefix 'Example.COM'"),
    (spec(labels={"k" * 64: "x"}), "labels[" + "k" * 64 + "]", "at most 63"),
    (spec(labels={"team": "x" * 64}), "labels[team]", "at most 63 characters"),
    (spec(labels={"kueue.x-k8s.io/queue-name": "q"}), "labels[kueue.x-k8s.io/queue-name]", "set queue= instead"),
    (spec(labels={"jobset.sigs.k8s.io/jobset-name": "q"}), "labels[jobset.sigs.k8s.io/jobset-name]", "JobSet"),
    (spec(pod_annotations={"a b": "x"}), "pod_annotations[a b]", "key 'a b'"),
    (spec(pod_annotations={"a": 1}), "pod_annotations[a]", "must be a string"),
    (spec(pod_annotations={ANNOTATION_ADMISSION: "9"}),
     "pod_annotations[dispatch.phpboyscout.uk/admission]", "reserved"),
    (spec(pod_annotations={"a": "x" * (256 * 1024)}), "pod_annotations", "more than the API's 262144"),
    (spec(node_selector={"zone": "a b"}), "node_selector[zone]", "not a valid label value"),
    (spec(node_selector={"bad key": "a"}), "node_selector[bad key]", "key 'bad key'"),
    (spec(node_selector={"zone": 1}), "node_selector[zone]", "must be a string"),
    (spec(node_selector="zone=a"), "node_selector", "must be a mapping"),
]


@pytest.fixture
def fake() -> FakeCluster:
    c = FakeCluster()
    c.add_runtime()
    return c


@pytest.mark.parametrize(("bad", "field", "words"), BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_each_bad_field_is_refused_by_name_before_any_request(
    fake: FakeCluster, bad: JobSpec, field: str, words: str
) -> None:
    fake.server.requests.clear()
    with Adapter.connect("default", transport=fake.transport()) as adapter, pytest.raises(InvalidInput) as err:
        adapter.open(bad)
    assert [c.field for c in err.value.causes] == [field]
    assert words in str(err.value)
    assert fake.server.requests == []


def test_not_a_jobspec_at_all(fake: FakeCluster) -> None:
    with Adapter.connect("default", transport=fake.transport()) as adapter, \
            pytest.raises(InvalidInput, match="JobSpec"):
        adapter.open({"job_id": "llama", "submission": "s1"})  # type: ignore[arg-type]
    assert fake.server.requests == []


def test_every_bad_field_is_named_in_one_error() -> None:
    _, problems = spec_problems(spec(command="python x.py", num_nodes="2", env={"A": 1, "B C": "x"},
                                     image="", resources_per_node={"cpu": "abc"}, labels={"a b": "c"}))
    assert [p.field for p in problems] == [
        "image", "command", "num_nodes", "resources_per_node[cpu]", "env[A]", "env[B C]", "labels[a b]",
    ]


def test_good_values_pass_and_reach_the_trainjob_as_given(fake: FakeCluster) -> None:
    good = spec(
        image="ghcr.io/example/train@sha256:" + "a" * 64, command=("python", "train.py"), args=["--lr", "1e-4"],
        num_nodes=1, resources_per_node={"cpu": "1.10", "memory": "4Gi", "nvidia.com/gpu": "1",
                                         "ephemeral-storage": "1e9", "hugepages-2Mi": "2Mi"},
        env={"CUDA_VISIBLE_DEVICES": "0,1", "URLS": "http://a,B=c", "EMPTY": "", "my.var-1": "x"},
        labels={"example.com/team": "ml", "tier": ""}, pod_annotations={"example.com/note": "a, b = c"},
        node_selector={"kubernetes.io/hostname": "node-0"}, termination_grace_period_seconds=0,
    )
    with Adapter.connect("default", transport=fake.transport()) as adapter:
        adapter.open(good)
    tj = fake.server.get("trainer.kubeflow.org", "trainjobs", "default", "llama-s1")
    assert tj is not None
    trainer = tj["spec"]["trainer"]
    assert trainer["command"] == ["python", "train.py"]
    assert trainer["resourcesPerNode"]["limits"]["cpu"] == "1.10"
    assert {e["name"]: e["value"] for e in trainer["env"] if "value" in e} == dict(good.env)


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", Decimal(2)), ("500m", Decimal("0.5")), ("1.10", Decimal("1.10")), ("4Gi", Decimal(4 * 2**30)),
     ("1e3", Decimal(1000)), ("1E-3", Decimal("0.001")), ("1E", Decimal(10) ** 18), (".5", Decimal("0.5")),
     ("5.", Decimal(5)), ("+1k", Decimal(1000)), ("-1", Decimal(-1)), ("0", Decimal(0))],
)
def test_quantities_follow_the_kubernetes_grammar(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.5.2", "4GB", "4 Gi", "1Ki2", "1e", "e3", ".", "--1", "1ki", "0x10"])
def test_not_quantities(text: str) -> None:
    assert parse_quantity(text) is None


@pytest.mark.parametrize("key", ["a", "a.b-c_d", "example.com/a", "k8s.io/x.y", "A1"])
def test_qualified_names(key: str) -> None:
    assert qualified_name_problem(key) is None


@pytest.mark.parametrize("name", ["A", "_a", "a.b", "a-b", "A_1"])
def test_env_names(name: str) -> None:
    assert env_name_problem(name) is None
