"""The history checker sees every way two executions of one submission can overlap.

The checker used to skip pairs of processes with equal A and to group processes by TrainJob name, so two
processes of one rank with one A (a direct unsuspend, a Job's replacement pod beside a pod on a lost node)
and two TrainJobs of one submission passed it. Each blind spot is built here twice: on hand-made records,
and as the schedule on the fake cluster that produces it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, Adapter, JobSpec
from dispatch.testing import FakeCluster, History, Process

Obj = dict[str, Any]
TRAINER = "trainer.kubeflow.org"


def proc(pod: str, started: int, ended: int | None, *, admission: int | None = 1, run: int | None = 1,
         rank: str = "j-node-0#0", obj: str = "llama-s1", uid: str = "tj-1", job_id: str = "llama",
         submission: str = "s1", reported: int | None = -1) -> Process:
    return Process(pod=pod, uid=f"uid-{pod}", namespace="default", node=f"node-{pod}", obj_name=obj, job_id=job_id,
                   submission=submission, admission=admission, started=started, ended=ended, rank=rank,
                   trainjob_uid=uid, run=run, reported=admission if reported == -1 else reported)


def check(*processes: Process) -> None:
    History(clock=100, processes=list(processes)).check()


# ---------------------------------------------------------------- the rules, on hand-made records


def test_a_clean_history_passes() -> None:
    check(
        proc("a0", 1, 10, rank="j-node-0#0"), proc("a1", 2, 11, rank="j-node-0#1"),   # one execution, two ranks
        proc("b0", 12, 20, admission=2, run=2, rank="j-node-0#0"),                     # the next, after both ended
        proc("c0", 21, None, admission=3, run=1, uid="tj-2", obj="llama-s1-again"),  # a re-open of the submission
        proc("x0", 1, None, job_id="other", submission="s1", obj="other-s1", uid="tj-3"),  # another submission
    )


def test_two_executions_of_one_rank_with_equal_a_overlap() -> None:
    with pytest.raises(AssertionError, match="two executions of submission llama/s1 in default overlap") as err:
        check(proc("old", 1, 10), proc("new", 5, None, run=2))
    assert "old of llama-s1" in str(err.value) and "new of llama-s1" in str(err.value)


def test_two_processes_of_one_rank_of_one_execution_overlap() -> None:
    with pytest.raises(AssertionError, match="two processes of one rank of one execution") as err:
        check(proc("evicted", 1, None), proc("replacement", 3, None))
    assert "evicted of llama-s1" in str(err.value) and "replacement of llama-s1" in str(err.value)


def test_two_trainjobs_of_one_submission_overlap_whatever_their_names_and_a() -> None:
    for second_a in (1, 2):
        with pytest.raises(AssertionError, match="two executions of submission llama/s1") as err:
            check(proc("a", 1, None, obj="llama-s1-a", uid="tj-a"),
                  proc("b", 2, None, obj="llama-s1-b", uid="tj-b", admission=second_a, rank="j-b-node-0#0"))
        assert "a of llama-s1-a" in str(err.value) and "b of llama-s1-b" in str(err.value)


def test_a_must_strictly_rise_from_execution_to_execution_across_incarnations() -> None:
    for first, then in ((1, 1), (2, 1)):
        with pytest.raises(AssertionError, match="did not strictly rise") as err:
            check(proc("first", 1, 5, admission=first), proc("reopened", 6, None, admission=then, uid="tj-2"))
        assert "first of" in str(err.value) and "reopened of" in str(err.value)
    with pytest.raises(AssertionError, match="did not strictly rise"):
        check(proc("first", 1, 5), proc("unnumbered", 6, None, admission=None, run=2))


def test_each_execution_has_exactly_one_a_the_one_its_trainjob_reported() -> None:
    with pytest.raises(AssertionError, match="one execution of submission llama/s1 in default runs with two "
                                             "admission numbers") as err:
        check(proc("r0", 1, None, rank="j-node-0#0"), proc("r1", 2, None, admission=2, rank="j-node-0#1",
                                                           reported=1))
    assert "r0 of" in str(err.value) and "r1 of" in str(err.value)
    with pytest.raises(AssertionError, match="carries A=1 but its TrainJob reported A=2 at admission"):
        check(proc("r0", 1, None, admission=1, reported=2))


def test_trainjobs_without_dispatch_labels_are_grouped_by_name() -> None:
    check(proc("a", 1, None, job_id="", submission="", obj="plain", admission=None),
          proc("b", 2, None, job_id="", submission="", obj="plain-too", uid="tj-2", admission=None))
    with pytest.raises(AssertionError, match="two executions of TrainJob plain in default overlap"):
        check(proc("a", 1, None, job_id="", submission="", obj="plain", admission=None),
              proc("b", 2, None, job_id="", submission="", obj="plain", admission=None, run=2))


# ---------------------------------------------------------------- the schedules that produce them


def running_on_a_frozen_node(adapter: Adapter, cluster: FakeCluster) -> str:
    """One execution (A=1) whose only pod runs on a node that then stops answering."""
    adapter.open(JobSpec(job_id="llama", submission="s1", node_selector={}), hold=False)
    cluster.settle()
    (pod,) = cluster.pods("llama-s1")
    cluster.freeze_node(pod["spec"]["nodeName"])
    return str(pod["metadata"]["name"])


def unsuspend_directly(cluster: FakeCluster, name: str) -> None:
    """What ``kubectl patch trainjob --type merge -p '{"spec":{"suspend":false}}'`` does: no new A."""
    def mutate(obj: Obj) -> None:
        obj["spec"]["suspend"] = False
    cluster.server.update(TRAINER, "trainjobs", "default", name, mutate, status=False)


def test_a_direct_unsuspend_beside_a_pod_on_a_lost_node_is_caught(adapter: Adapter, cluster: FakeCluster) -> None:
    old = running_on_a_frozen_node(adapter, cluster)
    adapter.hold("llama-s1")
    cluster.settle()
    cluster.history.check()  # held: the old process may run on, nothing else does
    unsuspend_directly(cluster, "llama-s1")
    cluster.settle()
    running = cluster.running_processes("llama-s1")
    assert [p.admission for p in running] == [1, 1]  # equal A: the old checker skipped this pair
    with pytest.raises(AssertionError, match="two executions of submission llama/s1 in default overlap") as err:
        cluster.history.check()
    new = next(p.pod for p in running if p.pod != old)
    assert old in str(err.value) and new in str(err.value)


def test_a_replacement_pod_beside_an_evicted_pod_on_a_lost_node_is_caught(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    old = running_on_a_frozen_node(adapter, cluster)
    cluster.server.delete("", "pods", "default", old)  # an eviction: graceful, the frozen kubelet never confirms
    cluster.settle()  # the Job controller (TerminatingOrFailed) starts a replacement at once
    running = cluster.running_processes("llama-s1")
    assert len(running) == 2 and {p.rank for p in running} == {"llama-s1-node-0#0"}
    with pytest.raises(AssertionError, match="two processes of one rank of one execution of submission "
                                             "llama/s1") as err:
        cluster.history.check()
    assert all(p.pod in str(err.value) for p in running)


def test_two_trainjobs_of_one_submission_running_at_once_are_caught(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-a"), hold=False)
    cluster.settle()
    first = cluster.server.get(TRAINER, "trainjobs", "default", "llama-s1-a")
    assert first is not None
    second = {"apiVersion": first["apiVersion"], "kind": first["kind"],
              "metadata": {"name": "llama-s1-b", "labels": copy.deepcopy(first["metadata"]["labels"]),
                           "annotations": copy.deepcopy(first["metadata"].get("annotations") or {})},
              "spec": copy.deepcopy(first["spec"])}
    cluster.server.create(TRAINER, "trainjobs", "default", second)  # e.g. the loser of a racing open
    cluster.settle()
    assert {p.obj_name for p in cluster.running_processes()} == {"llama-s1-a", "llama-s1-b"}
    with pytest.raises(AssertionError, match="two executions of submission llama/s1 in default overlap") as err:
        cluster.history.check()
    assert "of llama-s1-a" in str(err.value) and "of llama-s1-b" in str(err.value)


def test_a_clean_schedule_passes_and_records_what_the_checker_needs(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=2))
    for expected in (1, 2, 3):
        assert adapter.release("llama-s1").admission == expected
        cluster.settle()
        running = cluster.running_processes("llama-s1")
        assert len(running) == 2 and {p.admission for p in running} == {expected}
        assert {p.reported for p in running} == {expected} and len({p.run for p in running}) == 1
        assert len({p.rank for p in running}) == 2
        adapter.hold("llama-s1")
        cluster.settle(honour_grace=False)
    adapter.close("llama-s1")
    cluster.settle()
    adapter.open(JobSpec(job_id="llama", submission="s1", name="llama-s1-again"), hold=False)
    cluster.settle()
    assert {p.admission for p in cluster.running_processes()} == {4}
    cluster.history.check()
    assert len({p.execution for p in cluster.history.processes}) == 4


def test_pods_built_from_a_trainjob_whose_annotation_is_not_its_entrys_a_are_caught(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """The reported A is the one Trainer built the resume from (issue 34), read from the TrainJob's annotation,
    while the pods' A comes from dispatch's runtime patch entry: a writer that sets the annotation alone (here
    straight to the store, past every policy) and unsuspends makes pods whose A the TrainJob does not report."""
    adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=2))
    cluster.settle()

    def forge(obj: Obj) -> None:
        obj["metadata"].setdefault("annotations", {})[ANNOTATION_ADMISSION] = "5"
        obj["spec"]["suspend"] = False
    cluster.server.update(TRAINER, "trainjobs", "default", "llama-s1", forge, status=False)
    cluster.settle()
    running = cluster.running_processes("llama-s1")
    assert len(running) == 2 and {(p.admission, p.reported) for p in running} == {(0, 5)}
    with pytest.raises(AssertionError, match="carries A=0 but its TrainJob reported A=5 at admission"):
        cluster.history.check()
