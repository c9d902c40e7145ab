"""Issue 34, the first campaign's `k1` stall (Kueue mode), on the fake: an object re-opened under its name beside
its earlier TrainJob's finished JobSet reads that JobSet's end, and Kueue finishes its new Workload at once.

A1 runs to its end under Kueue; the object is closed while the garbage collector misses the TrainJob's deletion;
opened again, Trainer copies the old JobSet's `Completed` into the new TrainJob and Kueue declares the new Workload
finished: it never admits it, and the controller's check decides nothing for it. status names the end as not the
TrainJob's own and the way out; taken, A=2 is admitted and runs. The fake's Trainer and Kueue are held to the real
ones by tests/contract/test_trainer_status.py. Every client holds exactly a shipped role.
"""

from __future__ import annotations

from dispatch import AsyncAdapter, State
from dispatch import _decision as d
from dispatch import _kube as k
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import NAME, SPEC, quiet, running, until


def finished(kueue: FakeKueue, wl: str) -> bool:
    return any(c.get("type") == "Finished" and c.get("status") == "True"
               for c in kueue.workload(wl)["status"].get("conditions") or [])


async def test_a_reopened_object_whose_workload_kueue_finished_at_once_is_named_and_the_way_out_runs_it(
        adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    async with running(kube):
        await adapter.open(SPEC)
        wl = kueue.workload_for(NAME)
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="A=1 admitted")
        kueue.sync()
        cluster.settle()
        [proc] = cluster.running_processes(NAME)
        cluster.finish_pod(proc.pod)
        cluster.settle()
        kueue.sync()
        assert finished(kueue, wl) and (await adapter.inspect(NAME)).state is State.SUCCEEDED
        assert d.COPIED_END not in (await adapter.inspect(NAME)).cause.detail   # its own end

        cluster.advance(60)
        cluster.server.gc_lag = True
        await adapter.close(NAME)
        assert cluster.server.miss_garbage() >= 1     # the JobSet and the snapshot stay, their owner gone
        await adapter.open(SPEC)
        new_wl = kueue.reconcile_jobs()
        assert new_wl, "Kueue made the re-opened TrainJob's Workload"
        wl = new_wl[0]
        cluster.settle()
        kueue.sync()
        assert finished(kueue, wl), "Kueue finished the new Workload: the TrainJob reports the old JobSet's end"
        await quiet()
        assert kueue.entry(wl)["state"] != "Ready" and cluster.running_processes(NAME) == []
        status = await adapter.inspect(NAME)
        assert status.state is State.SUCCEEDED
        assert d.COPIED_END in status.cause.detail and d.ORPHANED in status.cause.detail, status.cause.detail

        # the way out, as named: the earlier layers deleted, then close and open again
        cluster.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)
        cluster.server.delete("", "configmaps", "default", f"{NAME}-runtime-snapshot")
        await adapter.close(NAME)
        cluster.server.gc_lag = False
        cluster.server.collect_garbage()
        cluster.settle()
        await adapter.open(SPEC)
        [wl] = kueue.reconcile_jobs()
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="A=2 admitted")
        kueue.sync()
        cluster.settle()
    [proc] = cluster.running_processes(NAME)
    assert proc.admission == 2, proc.describe()
    cluster.history.check()
