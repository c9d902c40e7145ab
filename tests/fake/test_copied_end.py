"""A submission re-opened under its name beside its earlier TrainJob's finished JobSet (issue 34).

A1 runs to its end (its JobSet Completed, and Trainer copies that into the TrainJob: Succeeded, its own). The
object is closed and the garbage collector misses the TrainJob's deletion (seen after a kube-apiserver restart):
its JobSet and snapshot ConfigMap stay. Opened again under the same name, the new TrainJob is built from nothing
(Trainer refuses while the old snapshot exists), yet reports Complete: Trainer v2.3 copies the Completed of the
JobSet of the TrainJob's name, whoever owns it, with that JobSet's time, and never takes Complete back; under
Kueue its Workload is declared finished. Nothing ran, but the object reads Succeeded for good. status and
release say the end is not the TrainJob's own, name the layers to delete and the close and re-open; done, A=2
runs. ``tests/contract/test_trainer_status.py`` holds the fake's Trainer and Kueue to the real ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatch import Adapter, JobSpec, Refused, State
from dispatch import _decision as d
from dispatch.controller.testing import keeper_pass
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1", num_nodes=1)
WRITER = ("dispatch-writer", "dispatch-node-reader")


@pytest.fixture
def lagging() -> FakeCluster:
    c = FakeCluster()
    c.server.gc_lag = True  # the collector acts only when the test says
    c.add_runtime()
    c.add_node("node-0")
    return c


@pytest.fixture
def writer(lagging: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=lagging.transport(roles=WRITER)) as a:
        a.core.settle_seconds = 0
        yield a


def run_to_its_end(c: FakeCluster, writer: Adapter) -> None:
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    c.settle()
    [pod] = c.pods(NAME)
    c.finish_pod(pod["metadata"]["name"])
    c.settle()
    keeper_pass(c)


def test_an_end_of_its_own_is_not_called_copied(lagging: FakeCluster, writer: Adapter) -> None:
    run_to_its_end(lagging, writer)
    status = writer.inspect(NAME)
    assert status.state is State.SUCCEEDED
    assert d.COPIED_END not in status.cause.detail
    with pytest.raises(Refused) as refused:
        writer.release(NAME)
    assert d.COPIED_END not in str(refused.value) and "open a new submission" in str(refused.value)


def test_a_reopened_object_that_reads_succeeded_before_it_ran_says_so_and_the_named_way_out_runs_it(
        lagging: FakeCluster, writer: Adapter) -> None:
    c = lagging
    run_to_its_end(c, writer)
    c.advance(60)
    writer.close(NAME)
    assert c.server.miss_garbage() >= 1      # the JobSet and the snapshot stay, their owner gone
    writer.open(SPEC)
    c.settle()
    status = writer.inspect(NAME)
    assert status.state is State.SUCCEEDED, status    # Trainer's copy: nothing of it ran
    assert c.running_processes(NAME) == []
    said = status.cause.detail
    assert d.COPIED_END in said and d.ORPHANED in said, said
    assert f"kubectl delete jobset/{NAME} configmap/{NAME}-runtime-snapshot" in said
    assert f"`dispatch close {NAME}` and open it again" in said
    with pytest.raises(Refused) as refused:
        writer.release(NAME)
    assert d.COPIED_END in str(refused.value)

    # The operator deletes the earlier layers as named: Complete stays (Trainer never takes it back), and the
    # end of a TrainJob that carries no A is still called copied.
    c.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)
    c.server.delete("", "configmaps", "default", f"{NAME}-runtime-snapshot")
    c.settle()
    status = writer.inspect(NAME)
    assert status.state is State.SUCCEEDED
    assert d.COPIED_END in status.cause.detail and "carries no A" in status.cause.detail, status.cause.detail
    assert d.ORPHANED not in status.cause.detail

    writer.close(NAME)
    c.server.collect_garbage()
    writer.open(SPEC)
    assert writer.release(NAME).admission == 2
    c.settle()
    [proc] = c.running_processes(NAME)
    assert proc.admission == 2, proc.describe()
    assert writer.inspect(NAME).state is State.RUNNING
