"""A submission closed and opened again under its own name while the garbage collector lags (issues 35 and 34).

``close`` deletes the TrainJob in the background; the collector removes its JobSet but not that JobSet's
(suspended) Job; the submission is opened again under the same name and released (A=2: the rule waits for a
closed object's layers to be gone or suspended, and this one is suspended). Trainer builds a new JobSet of that
name, whose Job of that name JobSet cannot create: the old one holds the name, and JobSet never adopts it (it
finds its Jobs by their controller owner's uid, v0.11 and v0.12; the fake once took it over by name, and with it
resumed the old Job's pods as A=2). The execution never starts until that Job goes: the object's status names it
and the delete that ends the wait (seen on the real control plane in the two-hour campaign, issue 34: the
collector had not removed such a Job 4 minutes after kube-apiserver restarts). ``tests/contract`` holds the fake's
JobSet to the real one's refusal."""

from __future__ import annotations

from collections.abc import Iterator

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


def reopened_beside_the_old_job(c: FakeCluster, writer: Adapter) -> str:
    """Run A=1, hold it, close, let the collector take the JobSet and the snapshot only (it never learns of the
    JobSet's deletion), open again and release: A=2 is admitted. Returns the old Job's name."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    c.settle()
    writer.hold(NAME)
    c.settle()   # the Job controller deletes the pods; their kubelets end them after the grace period
    c.advance(31)
    c.settle()
    keeper_pass(c, settle=False)
    assert c.pods(NAME) == [], [p["metadata"]["name"] for p in c.pods(NAME)]
    [old_job] = c.server.objects("batch", "jobs", "default")
    assert old_job["spec"]["suspend"]
    writer.close(NAME)
    c.server.collect_garbage()   # one pass: the TrainJob's JobSet and snapshot go; the Job waits for the next
    assert c.server.miss_garbage() >= 1   # ... which never comes: the collector missed the JobSet's deletion
    writer.open(SPEC)
    assert writer.release(NAME).admission == 2
    c.settle()
    return str(old_job["metadata"]["name"])


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "no-pod-webhook"])
def test_the_earlier_jobsets_job_keeps_the_execution_from_starting_and_status_names_its_delete(
        lagging: FakeCluster, writer: Adapter, guarded: bool) -> None:
    """The new JobSet makes no Job while the old one holds the name; status says so and how to end it; once
    the operator deletes it, JobSet creates its own and A=2 runs, each rank once. Without the guard's pod
    webhook too: nothing resumes the old Job's pods (the fake's take-over by name was the guard-less limit's
    only path here)."""
    guard = FakeGuard(lagging) if guarded else FakeGuard(lagging, enforce=lambda: False)
    guard.install()
    old = reopened_beside_the_old_job(lagging, writer)
    assert lagging.pods(NAME) == []
    [job] = lagging.server.objects("batch", "jobs", "default")
    assert job["metadata"]["name"] == old and job["spec"]["suspend"], "not adopted, not resumed"
    events = [e for e in lagging.server.objects("", "events", "default") if e.get("reason") == "JobCreationFailed"]
    assert events and f'jobs.batch "{old}" already exists' in events[0]["message"], events
    status = writer.inspect(NAME)
    assert status.state.value == "Running" and status.identity.admission == 2, status
    detail = status.cause.detail
    assert f"job {old} belongs to an earlier JobSet of this name" in detail, detail
    assert f"`kubectl delete job/{old}`" in detail, detail
    lagging.server.delete("batch", "jobs", "default", old)   # the operator, as status says
    lagging.settle()
    pods = lagging.pods(NAME)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" and p["metadata"]["labels"][LABEL_ADMISSION]
                                  == "2" for p in pods), [(p["metadata"]["name"], p["status"]) for p in pods]
    assert "belongs to an earlier JobSet" not in writer.inspect(NAME).cause.detail
    lagging.history.check()   # each rank ran once at a time, A=2 throughout


def test_the_earlier_trainjobs_snapshot_keeps_trainer_from_building_and_status_names_its_delete(
        lagging: FakeCluster, writer: Adapter) -> None:
    """The other half of what the two-hour campaign left (issue 34, p0): the earlier TrainJob's JobSet is gone
    but Trainer's runtime snapshot ConfigMap of the name is not; Trainer v2.3 builds nothing for the new
    TrainJob and says so only in a Warning Event. status reads that Event (the shipped roles may list Events)
    and names the ConfigMap and its delete; once deleted, Trainer builds and A=2 runs."""
    FakeGuard(lagging).install()
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    lagging.settle()
    writer.hold(NAME)
    lagging.settle()
    lagging.advance(31)
    lagging.settle()
    keeper_pass(lagging, settle=False)
    writer.close(NAME)
    assert lagging.server.miss_garbage() >= 1   # the collector never learns of the TrainJob's deletion
    lagging.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)   # the JobSet goes, the snapshot stays
    lagging.server.collect_garbage()   # and the JobSet's Job with it
    snapshot = lagging.server.get("", "configmaps", "default", f"{NAME}-runtime-snapshot")
    assert snapshot is not None
    lagging.server.gc_lag = False
    writer.open(SPEC)
    lagging.settle()
    held = writer.inspect(NAME)
    assert f"configmap {NAME}-runtime-snapshot belongs to an earlier TrainJob" in held.cause.detail, held.cause
    assert writer.release(NAME).admission == 2   # nothing of A=1 may run: admitted, and still nothing is built
    lagging.settle()
    assert lagging.pods(NAME) == [] and lagging.server.get("jobset.x-k8s.io", "jobsets", "default", NAME) is None
    detail = writer.inspect(NAME).cause.detail
    assert "Trainer has built no JobSet for trainjob llama-s1" in detail, detail
    assert "TrainJobResourcesCreationFailed" in detail and f"configmap/{NAME}-runtime-snapshot" in detail, detail
    lagging.server.delete("", "configmaps", "default", f"{NAME}-runtime-snapshot")   # the operator
    lagging.settle()
    running = lagging.running_processes(NAME)
    assert len(running) == 2 and {p.admission for p in running} == {2}, [p.describe() for p in running]
    assert "Trainer has built no JobSet" not in writer.inspect(NAME).cause.detail
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
