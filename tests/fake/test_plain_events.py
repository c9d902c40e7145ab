"""Plain mode's Events on the TrainJob, under the writer's shipped role: open, release (admitted with A, or
refused naming the pods), hold and close each tell ``kubectl describe trainjob`` what happened; an Event
that cannot be written never fails the verb."""

from __future__ import annotations

from typing import Any

from dispatch import Adapter, JobSpec, PodsRemain
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")


def events(cluster: FakeCluster) -> list[dict[str, Any]]:
    got = cluster.server.objects("", "events", "default")
    return sorted(got, key=lambda e: int(e["metadata"]["resourceVersion"]))


def told(cluster: FakeCluster) -> list[tuple[str, str, str]]:
    return [(e["reason"], e["type"], e["message"]) for e in events(cluster)]


def test_each_verb_records_an_event_on_the_trainjob(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC)
    uid = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)["metadata"]["uid"]  # type: ignore[index]
    adapter.release(NAME)
    cluster.settle()
    pod = cluster.pods(NAME)[0]["metadata"]["name"]
    node = cluster.pods(NAME)[0]["spec"]["nodeName"]
    adapter.hold(NAME)
    cluster.settle()                                        # the pod stays Terminating: the grace period
    try:
        adapter.release(NAME)
        raise AssertionError("admitted while the pod terminates")
    except PodsRemain:
        pass
    cluster.advance(60)
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    adapter.close(NAME)

    got = told(cluster)
    assert [(r, t) for r, t, _ in got] == [
        ("Opened", "Normal"), ("AdmissionProceeds", "Normal"), ("Held", "Normal"), ("AdmissionDelayed", "Warning"),
        ("AdmissionProceeds", "Normal"), ("Closed", "Normal")]
    assert got[0][2] == "opened as llama/s1, held: `dispatch release` admits it"
    assert got[1][2] == "no pod of the previous execution remains; admitted as llama/s1#1 (A=1)"
    assert got[3][2].startswith(f"release refused, nothing written: remaining pods: {pod} on {node} (Ready=True)")
    assert got[3][2].endswith("; the previous execution may still run")
    assert got[4][2] == "no pod of the previous execution remains; admitted as llama/s1#2 (A=2)"
    assert got[5][2].startswith("closed: deleted, its A kept in the identity record")
    for e in events(cluster):
        assert e["involvedObject"] == {**e["involvedObject"], "kind": "TrainJob", "name": NAME, "namespace": "default",
                                       "uid": uid}
        assert e["source"] == {"component": "dispatch"}


def test_an_event_that_cannot_be_written_fails_no_verb(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.server.inject(method="POST", path="/events$", status=403, times=10**6)
    adapter.open(SPEC)
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    adapter.hold(NAME)
    adapter.close(NAME)
    assert told(cluster) == []
    assert cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME) is None


def test_a_read_only_adapter_records_nothing(reader: Adapter, adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(SPEC)
    before = told(cluster)
    reader.inspect(NAME)
    reader.find(job_id="llama")
    assert told(cluster) == before
