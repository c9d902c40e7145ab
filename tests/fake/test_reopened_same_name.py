"""A submission closed and opened again under its own name while the garbage collector lags (issue 35).

The schedule the every-writer walk found once the fake's Job controller counted a Job's pods by the Job's uid, as
the real one does (``tests/contract/test_job_controller.py``), shrunk: ``close`` deletes the TrainJob in the
background; the collector removes its JobSet but not yet that JobSet's (suspended) Job; the submission is opened
again under the same name and released (A=2: the rule waits for a closed object's layers to be gone or
suspended, and this one is suspended). Trainer builds a new JobSet of that name, and JobSet takes the old Job as
its own (it selects its Jobs by their owner's *name*, ``getChildJobs``) and resumes it: its pods run with A=2.
Then the collector reaches that Job (its owner's uid is gone) and deletes it, with its pods left Running for
their grace period; JobSet re-creates it at once, and the new Job, which does not count the old Job's pods,
makes a pod of every rank. Every step is what the real controllers do.

With the guard's pod webhook (as deployed) each new pod is refused while the old pod of its rank may run, and
created once that pod's end is proven. Without it (``guard.enabled=false``) two processes of one rank of A=2
run at once: the guard-less limit ``docs/concepts/limits.md`` names."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dispatch import LABEL_ADMISSION, Adapter, JobSpec
from dispatch.controller.testing import FakeGuard, keeper_pass
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1", num_nodes=2)
WRITER = ("dispatch-writer", "dispatch-node-reader")


@pytest.fixture
def lagging() -> FakeCluster:
    c = FakeCluster()
    c.server.gc_lag = True  # the collector acts only when the test says
    c.add_runtime(replacement_policy="Failed")
    for name in ("node-0", "node-1", "node-2"):
        c.add_node(name)
    return c


@pytest.fixture
def writer(lagging: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=lagging.transport(roles=WRITER)) as a:
        a.core.settle_seconds = 0
        yield a


def reopened_and_taken_over(c: FakeCluster, writer: Adapter, keeper: Callable[[], object]) -> set[str]:
    """Run A=1, stop it, close, let the collector take the JobSet only, open again and release: A=2 runs in the
    old Job's pods. Returns their names."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    c.settle()
    writer.hold(NAME)
    c.settle()   # the Job controller deletes the pods; their kubelets end them after the grace period
    c.advance(31)
    c.settle()
    keeper()
    assert c.pods(NAME) == [], [p["metadata"]["name"] for p in c.pods(NAME)]
    [old_job] = c.server.objects("batch", "jobs", "default")
    assert old_job["spec"]["suspend"]
    writer.close(NAME)
    c.server.collect_garbage()   # one pass: the TrainJob's JobSet goes; its Job waits for the next pass
    assert c.server.get("batch", "jobs", "default", old_job["metadata"]["name"]) is not None
    writer.open(SPEC)
    assert writer.release(NAME).admission == 2
    c.settle()
    pods = c.pods(NAME)
    assert {o["uid"] for p in pods for o in p["metadata"]["ownerReferences"]} == {old_job["metadata"]["uid"]}, (
        "the new JobSet took the old Job over and resumed it")
    assert len(pods) == 2 and all(p["metadata"]["labels"][LABEL_ADMISSION] == "2" for p in pods)
    c.server.collect_garbage()   # the next pass: the old Job goes (its owner's uid is gone); its pods wait
    c.settle()   # JobSet re-creates it; the new Job makes a pod of each rank beside the old ones
    return {p["metadata"]["name"] for p in pods}


def test_the_re_created_jobs_pods_wait_for_the_taken_over_ones(lagging: FakeCluster, writer: Adapter) -> None:
    guard = FakeGuard(lagging)
    guard.install()
    old = reopened_and_taken_over(lagging, writer, lambda: keeper_pass(lagging, settle=False))
    lagging.history.check()
    assert {p["metadata"]["name"] for p in lagging.pods(NAME)} == old, "no pod beside the old ones"
    denied = [d for d in guard.pod_denied if "(A=2, replicatedJob node, job 0, index" in d]
    assert denied and all("cannot start while a pod of the same rank of the same execution may still run" in d
                          for d in denied), guard.pod_denied
    lagging.server.collect_garbage()   # the old Job's pods are deleted in their turn; their kubelets end them
    lagging.advance(31)
    lagging.settle()
    keeper_pass(lagging, settle=False)
    lagging.settle()
    pods = lagging.pods(NAME)
    assert not old & {p["metadata"]["name"] for p in pods}
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" and p["metadata"]["labels"][LABEL_ADMISSION]
                                  == "2" for p in pods), [(p["metadata"]["name"], p["status"]) for p in pods]
    lagging.history.check()   # each rank ran once at a time, A=2 throughout


def test_without_the_pod_webhook_two_processes_of_one_rank_run(lagging: FakeCluster, writer: Adapter) -> None:
    """The limit of ``guard.enabled=false``: nothing else refuses the Job controller's create."""
    guard = FakeGuard(lagging, enforce=lambda: False)
    guard.install()
    reopened_and_taken_over(lagging, writer, lambda: keeper_pass(lagging, settle=False))
    assert guard.pod_unenforced
    with pytest.raises(AssertionError, match="two processes of one rank of one execution"):
        lagging.history.check()


def test_a_resume_trainer_could_not_build_then_held_and_released_between_its_passes_runs_the_last_a(
    lagging: FakeCluster, writer: Adapter
) -> None:
    """The every-writer walk's seed 1, shrunk (issue 34): a re-opened object's first release (A=2) is seen by
    Trainer, which builds nothing while the earlier TrainJob's JobSet is still there (its collector lags); the
    object is held and released again (A=3) before Trainer's next pass, so Trainer, which reconciles the
    TrainJob's latest state and not each write, never sees it suspended. Once the collector removes the old
    JobSet, Trainer builds from what it reads then: every pod carries A=3, the A the release reported, and no
    process ever carried 2. The checker must take as reported the A Trainer built the resume from; it took the A
    of the resume it first saw (2), and failed a history with one execution and one A."""
    guard = FakeGuard(lagging)
    guard.install()
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    lagging.settle()
    writer.hold(NAME)
    lagging.settle()
    lagging.advance(31)
    lagging.settle()
    keeper_pass(lagging, settle=False)
    assert lagging.pods(NAME) == []
    writer.close(NAME)           # the collector has not reached the TrainJob's JobSet yet
    writer.open(SPEC)
    assert writer.release(NAME).admission == 2
    lagging.trainer_sync()       # Trainer sees the resume, and refuses to build beside the old JobSet
    assert lagging.pods(NAME) == []
    writer.hold(NAME)
    assert writer.release(NAME).admission == 3   # before Trainer's next pass: it never sees the hold
    lagging.server.collect_garbage()
    lagging.server.collect_garbage()
    lagging.settle()
    running = lagging.running_processes(NAME)
    assert len(running) == 2 and {p.admission for p in running} == {3}, [p.describe() for p in running]
    assert {p.reported for p in running} == {3}
    lagging.history.check()
