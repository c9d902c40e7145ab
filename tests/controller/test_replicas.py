"""Two replicas: leader election saves work, resourceVersion preconditions keep them correct without it."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from dispatch import LABEL_ADMISSION, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch.controller import Controller
from dispatch.controller._leader import LeaderElector
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import BASE, running, until

FAST = {"leader_elect": True, "lease_namespace": "default", "lease_seconds": 1.0, "renew_deadline": 0.8,
        "retry_seconds": 0.05}


def ready(kueue: FakeKueue, wl: str) -> bool:
    return bool(kueue.entry(wl)["state"] == "Ready")


def workload_writes(ctl: Controller) -> float:
    return float(ctl.metrics.writes.labels("workload")._value.get())


async def test_one_leader_decides_and_a_standby_takes_over_when_it_stops(
    cluster: FakeCluster, kueue: FakeKueue, admin: k.Kube, adapter: AsyncAdapter
) -> None:
    kube = admin  # its Lease is in "default", which the shipped Lease Role does not cover
    stack = AsyncExitStack()
    async with AsyncExitStack() as outer:
        b_cm = running(kube, BASE, identity="b", **FAST)
        a = await stack.enter_async_context(running(kube, BASE, identity="a", **FAST))
        await until(lambda: a.leading.is_set())
        b = await outer.enter_async_context(b_cm)
        await asyncio.sleep(0.3)
        assert not b.leading.is_set()
        assert b.readyz() == (True, "ok (standby)") and a.readyz() == (True, "ok (leader)")
        await adapter.open(JobSpec(job_id="j", submission="s1", queue="lq-dispatch"))
        first = kueue.workload_for("j-s1")
        await until(lambda: ready(kueue, first))
        assert workload_writes(b) == 0 and workload_writes(a) == 1
        assert a.metrics.leader._value.get() == 1 and b.metrics.leader._value.get() == 0
        await stack.aclose()     # a stops and releases the Lease: b takes over at once, not after expiry
        await until(lambda: b.leading.is_set(), timeout=0.5)
        await adapter.open(JobSpec(job_id="j", submission="s2", queue="lq-dispatch"))
        second = kueue.workload_for("j-s2")
        await until(lambda: ready(kueue, second))
        assert workload_writes(b) == 1
    lease = cluster.server.get("coordination.k8s.io", "leases", "default", "dispatch-admission-controller")
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1


async def test_a_leader_that_vanishes_is_replaced_after_its_lease_expires(
    cluster: FakeCluster, admin: k.Kube
) -> None:
    kube = admin  # a Lease of the test's own
    changes: list[tuple[str, bool]] = []
    a = LeaderElector(kube, name="l", namespace="default", identity="a", lease_seconds=1, retry_seconds=0.05,
                      on_change=lambda v: changes.append(("a", v)))
    b = LeaderElector(kube, name="l", namespace="default", identity="b", lease_seconds=1, retry_seconds=0.05,
                      on_change=lambda v: changes.append(("b", v)))
    assert await a.try_once() is True
    assert await b.try_once() is False
    # a stops renewing without releasing (killed): b must wait out the lease, judged on its own clock
    await asyncio.sleep(0.5)
    assert await b.try_once() is False
    await asyncio.sleep(0.7)
    assert await b.try_once() is True
    assert await a.try_once() is False       # a comes back: the lease is b's now
    lease = cluster.server.get("coordination.k8s.io", "leases", "default", "l")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"


async def test_a_leader_that_cannot_renew_steps_down_after_the_deadline(
    cluster: FakeCluster, admin: k.Kube
) -> None:
    kube = admin  # a Lease of the test's own
    changes: list[bool] = []
    e = LeaderElector(kube, name="l", namespace="default", identity="a", lease_seconds=1.0, renew_deadline=0.3,
                      retry_seconds=0.05, on_change=changes.append)
    task = asyncio.create_task(e.run())
    await until(lambda: e.is_leader)
    cluster.server.inject(path="/leases", status=503, times=1000)
    await until(lambda: not e.is_leader, timeout=3.0)
    cluster.server.faults.clear()
    await until(lambda: e.is_leader, timeout=3.0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert changes[:3] == [True, False, True]


async def test_two_replicas_without_leader_election_still_admit_each_execution_once(
    cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube, adapter: AsyncAdapter
) -> None:
    """Both replicas decide every Workload at once; the RV preconditions let one write win each time."""
    names = [f"j-s{i}" for i in range(12)]
    for i in range(12):
        await adapter.open(JobSpec(job_id="j", submission=f"s{i}", queue="lq-dispatch"))
    kb2 = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
    async with running(kube, BASE, identity="a", workers=4), running(kb2, BASE, identity="b", workers=4):
        wls = [kueue.workload_for(name) for name in names]
        await until(lambda: all(ready(kueue, wl) for wl in wls), timeout=10)
        kueue.sync()
        cluster.settle()
        for wl in wls:                     # preempt them all; they wait for their pods, then come back
            kueue.evict(wl)
        cluster.settle()
        kueue.sync()
        await asyncio.sleep(0.2)
        assert not any(ready(kueue, wl) for wl in wls)
        cluster.advance(31)
        cluster.settle()
        await until(lambda: all(ready(kueue, wl) for wl in wls), timeout=10)
        kueue.sync()
        cluster.settle()
    await kb2.aclose()
    cluster.history.check()
    assert len(kueue.admitted) == 24          # Kueue started each Workload exactly twice
    for name in names:
        labels = [p["metadata"]["labels"][LABEL_ADMISSION] for p in cluster.pods(name)]
        assert len(labels) == 1
