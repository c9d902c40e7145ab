"""Watch-driven waiting in plain mode: a waiter wakes on the change, not on a polling period.

The poll interval in these tests is 1,000 s: a waiter that returns at all returned because of a watch
event. The order is checked by the fake's resourceVersions, not by wall time.
"""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from dispatch import Adapter, Identity, JobSpec, PodsRemain, State
from dispatch._adapter import Following
from dispatch.cli import CliState
from dispatch.cli._release import release_wait
from dispatch.testing import FakeCluster

NAME = "llama-s1"
LONG = 1000.0


def held_with_terminating_pod(adapter: Adapter, cluster: FakeCluster) -> str:
    adapter.open(JobSpec(job_id="llama", submission="s1"), hold=False)
    cluster.settle()
    pod = str(cluster.pods(NAME)[0]["metadata"]["name"])
    adapter.hold(NAME)
    cluster.settle()   # the grace period is not over: the pod stays Terminating
    return pod


def rv(obj: dict[str, Any] | None) -> int:
    assert obj is not None
    return int(obj["metadata"]["resourceVersion"])


def test_release_wait_admits_on_the_pods_deletion_event_without_a_poll(
        adapter: Adapter, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    seen: dict[str, Any] = {"calls": 0, "woke": []}
    original = Following.changed

    def changed(self: Following, timeout: float) -> bool:
        seen["calls"] += 1
        if seen["calls"] == 1:   # the first attempt found the pod; now the kubelet confirms it stopped
            cluster.advance(31)
            cluster.confirm_termination(pod)
            seen["deleted_at"] = cluster.server.resource_version
        woke = original(self, timeout)
        seen["woke"].append(woke)
        seen["events"] = self.follower.events
        return woke

    monkeypatch.setattr(Following, "changed", changed)
    state = CliState(err=Console(file=None, force_terminal=False, width=200, quiet=True))
    identity = release_wait(state, adapter, NAME, timeout=2 * LONG, interval=LONG)
    assert identity.admission == 2
    assert seen["calls"] == 1 and seen["woke"] == [True] and seen["events"] >= 1
    trainjob = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", NAME)
    assert trainjob is not None and trainjob["spec"]["suspend"] is False
    assert rv(trainjob) > seen["deleted_at"]   # admitted after the deletion, by the fake's event order


def test_wait_returns_on_the_trainjob_event(adapter: Adapter, cluster: FakeCluster,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pod = held_with_terminating_pod(adapter, cluster)
    cluster.advance(31)
    cluster.confirm_termination(pod)
    releases: list[Identity] = []

    from dispatch._follow import Follower
    original = Follower.changed

    async def changed(self: Follower, timeout: float) -> bool:
        if not releases:   # the waiter saw Held; another client releases the object meanwhile
            releases.append(await adapter.core.release(NAME))
        return await original(self, timeout)

    monkeypatch.setattr(Follower, "changed", changed)
    status = adapter.wait(NAME, State.RUNNING, timeout=2 * LONG, interval=LONG)
    assert status.state is State.RUNNING and releases[0].admission == 2


def test_a_selection_that_cannot_be_watched_is_polled_with_backoff(adapter: Adapter, cluster: FakeCluster) -> None:
    held_with_terminating_pod(adapter, cluster)
    cluster.server.inject(method="GET", path=r"/trainjobs$", status=403, times=100)   # no list/watch of TrainJobs
    with adapter.follow(NAME, interval=0.01) as following:
        follower = following.follower
        assert not follower.healthy
        assert any("trainjobs" in e for e in follower.errors)
        following.changed(LONG)    # the watch that went down wakes the waiter once: re-check
        assert following.changed(LONG) is False     # then quiet polls after the fallback period, not LONG
        assert following.changed(LONG) is False
        assert follower._fallback == pytest.approx(0.04)   # doubling
    with pytest.raises(PodsRemain):
        adapter.release(NAME)
