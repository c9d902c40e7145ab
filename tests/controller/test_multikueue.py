"""The rule across clusters, on fake clusters: a MultiKueue manager and two workers (``FakeMultiKueue``).

The controller runs on the manager with the shipped manager roles (``deploy/base`` and ``deploy/multikueue``)
and reads each worker as the shipped worker reader (``deploy/worker``). An independent observer (the
workers' own API servers, read directly) checks that no two pods of the submission ever run at once in
the whole fleet, and that every worker pod carries the A the manager issued.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_ADMISSION, AsyncAdapter, JobSpec, _fleet
from dispatch import _kube as k
from dispatch._fleet import WORKER_DOWN, Fleet
from dispatch.controller import Config, Controller
from dispatch.controller.testing import MANAGER_ROLES, FakeMultiKueue, manager_policy
from dispatch.errors import Refused
from dispatch.testing import FakeCluster

from .conftest import until

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1", queue="lq-dispatch")


def fleet(*, release_lost: bool = False) -> tuple[FakeCluster, dict[str, FakeCluster], FakeMultiKueue]:
    manager = FakeCluster()
    manager.add_runtime()
    workers = {}
    for name in ("worker-1", "worker-2"):
        w = FakeCluster()
        w.add_runtime()
        w.add_node("node-0")
        workers[name] = w
    mk = FakeMultiKueue(manager, workers, release_lost=release_lost)
    mk.install()
    return manager, workers, mk


@asynccontextmanager
async def controller(manager: FakeCluster, mk: FakeMultiKueue) -> AsyncIterator[Controller]:
    kube = k.Kube.connect(namespace="default", transport=manager.transport(roles=MANAGER_ROLES,
                                                                           rbac=manager_policy()))
    ctl = Controller(kube, Config(resync_seconds=3600, workers=2), fleet_connect=mk.connect)
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        await ctl.wait_synced()
        yield ctl
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await kube.aclose()
    assert manager.server.denied == [], "a request the shipped manager roles do not allow"
    for w in mk.workers.values():
        assert w.server.denied == [], "a request the shipped worker reader role does not allow"


async def writer(manager: FakeCluster) -> AsyncAdapter:
    kb = k.Kube.connect(namespace="default", transport=manager.transport(
        roles=("dispatch-writer", "dispatch-node-reader")))
    return AsyncAdapter(kb)


def entry(mk: FakeMultiKueue, wl: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in mk.kueue.entry(wl).items() if isinstance(v, str)}


def alive(workers: dict[str, FakeCluster]) -> list[tuple[str, str, str]]:
    """Every pod of the object that may still run, in any worker: (worker, pod, its A)."""
    out = []
    for name, w in sorted(workers.items()):
        for p in w.pods(NAME):
            if p["status"].get("phase") not in ("Succeeded", "Failed"):
                out.append((name, p["metadata"]["name"], p["metadata"]["labels"].get(LABEL_ADMISSION, "")))
    return out


def step(mk: FakeMultiKueue, *, honour_grace: bool = True) -> None:
    """One pass of MultiKueue and of every worker that answers, then the observer: at most one pod of the
    (one-node) object may run in the whole fleet, whatever its A and wherever it is."""
    mk.sync()
    for name, w in mk.workers.items():
        if name not in mk.lost:
            w.step(honour_grace=honour_grace)
            w.server.collect_garbage()
    assert len(alive(mk.workers)) <= 1, f"two executions at once: {alive(mk.workers)}"


def power_off(worker: FakeCluster) -> None:
    """The machine is off: its processes are gone (its API server, partitioned, tells nobody)."""
    for p in worker.pods(NAME):
        worker.server.update("", "pods", "default", p["metadata"]["name"],
                             lambda obj: obj["status"].update(phase="Failed"), status=True)


async def reader_of_workers(manager: FakeCluster, mk: FakeMultiKueue, monkeypatch: pytest.MonkeyPatch
                            ) -> AsyncAdapter:
    """A library user whose role reads the workers as the controller does (the shipped manager roles)."""
    monkeypatch.setattr(_fleet, "_connect", mk.connect)  # the library's own Fleet reaches the fake workers
    kb = k.Kube.connect(namespace="default", transport=manager.transport(roles=MANAGER_ROLES,
                                                                         rbac=manager_policy()))
    return AsyncAdapter(kb, read_only=True)


async def running_a1(manager: FakeCluster, workers: dict[str, FakeCluster], mk: FakeMultiKueue) -> str:
    adapter = await writer(manager)
    await adapter.open(SPEC)
    wl = mk.workload_for(NAME)
    await until(lambda: entry(mk, wl)["state"] == "Ready", what="dispatch's check Ready for A=1")
    for _ in range(3):
        step(mk)
    assert [(w, a) for w, _, a in alive(workers)] == [("worker-1", "1")]
    return wl


async def test_first_execution_runs_in_a_worker_with_the_a_the_manager_issued() -> None:
    manager, workers, mk = fleet()
    async with controller(manager, mk):
        wl = await running_a1(manager, workers, mk)
    tj = manager.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert tj is not None and tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"
    assert mk.kueue.workload(wl)["status"]["clusterName"] == "worker-1"
    assert mk.dispatched == [(wl, "worker-1", "1")]
    record = manager.server.objects("dispatch.phpboyscout.uk", "submissionrecords", "default")[0]
    assert record["spec"]["clusters"] == ["worker-1", "worker-2"]
    # the manager's own TrainJob never has pods: Trainer leaves an object MultiKueue manages alone
    assert manager.pods(NAME) == []
    # status says where it runs, from the manager alone (the writer's role reads no worker)
    adapter = await writer(manager)
    status = await adapter.inspect(NAME)
    assert (status.state.value, status.cluster, status.identity.admission) == ("Running", "worker-1", 1)
    [found] = await adapter.find()
    assert found.cluster == "worker-1"
    await adapter.aclose()


async def test_preemption_waits_for_the_workers_terminating_pod_then_admits_a2_anywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    manager, workers, mk = fleet()
    async with controller(manager, mk):
        wl = await running_a1(manager, workers, mk)
        [(_, old_pod, _)] = alive(workers)
        mk.kueue.evict(wl)
        # MultiKueue suspends the copy, releases quota once no Job is active (the pod still Terminating),
        # deletes the copy and forgets worker-1: the manager's Workload is free to go anywhere
        for _ in range(4):
            step(mk)
        assert workers["worker-1"].pods(NAME)[0]["metadata"].get("deletionTimestamp")
        assert not mk.kueue.workload(wl)["status"].get("clusterName")
        expected = f"worker-1/{old_pod} on node-0"
        await until(lambda: expected in entry(mk, wl)["message"], what="the check naming the worker's pod")
        assert entry(mk, wl)["state"] == "Pending"
        # ceased, asked on the manager: the writer's role reads no worker and says so; a role that reads
        # the workers (here the controller's) names the pod in worker-1
        adapter = await writer(manager)
        blind = await adapter.ceased(NAME)
        assert not blind.ceased and "which this role cannot read" in blind.reason
        await adapter.aclose()
        assert [d[1:] for d in manager.server.denied] == [("GET", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")]
        manager.server.denied.clear()  # the writer's expected 403, not the controller's
        seeing = await reader_of_workers(manager, mk, monkeypatch)
        told = await seeing.ceased(NAME)
        assert not told.ceased and f"worker-1/{old_pod}" in told.reason, told.reason
        await seeing.aclose()
        mk.order = ["worker-2", "worker-1"]
        step(mk)
        assert len(mk.dispatched) == 1, "MultiKueue dispatched again while dispatch's check was Pending"
        # the grace period ends: the pod goes, and A=2 is admitted (to worker-2 this time)
        for _ in range(3):
            step(mk, honour_grace=False)
        await until(lambda: entry(mk, wl)["state"] == "Ready", timeout=15, what="A=2 admitted")
        for _ in range(3):
            step(mk)
    assert [(w, a) for w, _, a in alive(workers)] == [("worker-2", "2")]
    assert [d[1:] for d in mk.dispatched] == [("worker-1", "1"), ("worker-2", "2")]


async def test_a_partitioned_worker_blocks_until_the_operator_confirms_it_down() -> None:
    # Kueue, as played here, releases the lost worker's Workload and would dispatch it elsewhere: the hazard
    manager, workers, mk = fleet(release_lost=True)
    async with controller(manager, mk) as ctl:
        wl = await running_a1(manager, workers, mk)
        mk.lose("worker-1")
        mk.worker_lost_timeout()          # MultiKueue gives up on worker-1: the Workload is evicted
        step(mk)
        await until(lambda: "worker worker-1 cannot be read" in entry(mk, wl)["message"], timeout=15,
                    what="the check naming the unreadable worker")
        message = entry(mk, wl)["message"]
        assert "dispatch admin worker-down worker-1" in message, message
        assert "Active=False" in message, message
        step(mk)
        assert len(mk.dispatched) == 1, "dispatched again while worker-1 might still run A=1"
        # the operator powers worker-1 off and confirms it: only then A=2 goes to worker-2
        power_off(workers["worker-1"])
        admin = k.Kube.connect(namespace="default", transport=manager.transport(roles=("dispatch-admin",)))
        confirmed = await Fleet(admin).confirm_down("worker-1")
        await admin.aclose()
        assert confirmed.down_confirmed
        await until(lambda: entry(mk, wl)["state"] == "Ready", timeout=15, what="A=2 after the confirmation")
        step(mk)
        step(mk)
        assert ctl.reconciler.fleet is not None
    assert mk.dispatched[-1][1:] == ("worker-2", "2")
    mc = manager.server.get("kueue.x-k8s.io", "multikueueclusters", "", "worker-1")
    assert mc is not None and mc["metadata"]["annotations"][WORKER_DOWN]


async def test_a_confirmation_lapses_when_the_worker_comes_back_and_is_lost_again() -> None:
    manager, _, mk = fleet()
    mk.lose("worker-1")
    admin = k.Kube.connect(namespace="default", transport=manager.transport(roles=("dispatch-admin",)))
    f = Fleet(admin)
    assert (await f.confirm_down("worker-1")).down_confirmed
    mk.heal("worker-1")
    assert not (await f.worker("worker-1")).down_confirmed
    mk.lose("worker-1")
    assert not (await f.worker("worker-1")).down_confirmed, "an old confirmation vouched for a new loss"
    await admin.aclose()


async def test_a_reachable_worker_cannot_be_confirmed_down() -> None:
    manager, _, _ = fleet()
    admin = k.Kube.connect(namespace="default", transport=manager.transport(roles=("dispatch-admin",)))
    try:
        with pytest.raises(Refused, match="only a worker Kueue has lost") as err:
            await Fleet(admin).confirm_down("worker-2")
    finally:
        await admin.aclose()
    assert "Active=True" in str(err.value) and err.value.reason == "WorkerNotLost"
    mc = manager.server.get("kueue.x-k8s.io", "multikueueclusters", "", "worker-2")
    assert mc is not None and WORKER_DOWN not in (mc["metadata"].get("annotations") or {})


async def test_a_worker_removed_from_the_manager_is_confirmed_by_the_operator_and_the_records_forget_it() -> None:
    """Issue 35 item 5: worker-1 is decommissioned (its MultiKueueCluster deleted) while the record remembers it
    from A=1's admission: the check names the removed worker and the way out; ``dispatch admin worker-down
    worker-1`` (the shipped dispatch-admin role), which answered NotFound before, makes every record that
    remembers it forget it, and the next execution is dispatched to worker-2."""
    manager, workers, mk = fleet(release_lost=True)
    async with controller(manager, mk):
        wl = await running_a1(manager, workers, mk)
        mk.lose("worker-1")
        mk.worker_lost_timeout()          # MultiKueue gives up on worker-1: the Workload is evicted
        power_off(workers["worker-1"])    # decommissioned: its machines are off ...
        manager.server.delete("kueue.x-k8s.io", "multikueueclusters", "", "worker-1")  # ... and it is removed
        step(mk)
        await until(lambda: "has no MultiKueueCluster any more" in entry(mk, wl)["message"], timeout=15,
                    what="the check naming the removed worker")
        message = entry(mk, wl)["message"]
        assert ("worker worker-1, which the submission's identity record remembers from the last admission, has no "
                "MultiKueueCluster any more (removed from the manager)") in message, message
        assert "`dispatch admin worker-down worker-1`, which makes the identity records forget it" in message
        admin = AsyncAdapter(k.Kube.connect(namespace="default", transport=manager.transport(
            roles=("dispatch-admin",))))
        try:
            got = await admin.worker_down("worker-1")
        finally:
            await admin.aclose()
        assert got.removed and got.forgotten == ("default/llama/s1",) and got.armed == (), got
        await until(lambda: entry(mk, wl)["state"] == "Ready", timeout=15, what="the next A after the confirmation")
        step(mk)
        step(mk)
    assert mk.dispatched[-1][1] == "worker-2" and int(mk.dispatched[-1][2]) > 1, mk.dispatched
    record = manager.server.objects("dispatch.phpboyscout.uk", "submissionrecords", "default")[0]["spec"]
    assert "worker-1" not in record.get("clusters", []), record
    assert manager.server.denied == []


async def test_a_healed_workers_leftover_job_is_named_and_its_delete_lets_the_next_execution_run() -> None:
    """The fleet campaign's seed 1851485545 on the real fleet (issue 34): the worker running A=1 was lost past
    workerLostTimeout, so its copy was never suspended; healed, MultiKueue deleted the copy (background, as Kueue
    does), and the worker's garbage collector, just back itself, removed the JobSet but missed its Job, left
    unsuspended with A=1's pod running. Nothing will suspend it: the check waits on that pod, names the Job and
    its delete, and once the worker's operator deletes it, A=2 runs; never two pods at once."""
    manager, workers, mk = fleet(release_lost=True)
    w1 = workers["worker-1"]
    async with controller(manager, mk):
        wl = await running_a1(manager, workers, mk)
        mk.lose("worker-1")
        mk.worker_lost_timeout()
        step(mk)
        await until(lambda: "worker worker-1 cannot be read" in entry(mk, wl)["message"], timeout=15,
                    what="the check naming the unreadable worker")
        w1.server.gc_lag = True
        mk.heal("worker-1")
        mk.sync()                          # the copy's removal, retried now that worker-1 answers
        assert w1.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME) is None
        w1.server.collect_garbage()        # the copy's JobSet goes; its Job waits for the next pass ...
        assert w1.server.miss_garbage() >= 1   # ... which never comes
        for _ in range(3):
            w1.step()
            step(mk)
        [job] = w1.server.objects("batch", "jobs", "default")
        assert not job["spec"].get("suspend") and w1.server.get("jobset.x-k8s.io", "jobsets", "default", NAME) is None
        assert [(w, a) for w, _, a in alive(workers)] == [("worker-1", "1")]
        job_name = job["metadata"]["name"]
        await until(lambda: f"job {job_name} belongs to an earlier JobSet" in entry(mk, wl)["message"], timeout=15,
                    what="the check naming the leftover Job")
        message = entry(mk, wl)["message"]
        assert entry(mk, wl)["state"] == "Pending" and "nothing will suspend it" in message, message
        assert f"kubectl delete job/{job_name}" in message, message
        assert len(mk.dispatched) == 1
        # worker-1's operator deletes the Job as named; its pod ends, and A=2 runs
        w1.server.delete("batch", "jobs", "default", job_name)
        w1.server.gc_lag = False
        w1.server.collect_garbage()
        for _ in range(4):
            step(mk, honour_grace=False)
        await until(lambda: entry(mk, wl)["state"] == "Ready", timeout=15, what="A=2 after the delete")
        for _ in range(3):
            step(mk)
    assert [a for _, _, a in alive(workers)] == ["2"]
    assert [d[2] for d in mk.dispatched] == ["1", "2"]
