"""Fixtures for the controller on the fake cluster: Kueue played by ``FakeKueue``, the controller as a task."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from dispatch import LABEL_ADMISSION, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch.controller import Config, Controller
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1", queue="lq-dispatch")


async def until(pred: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``pred`` while the controller task runs; fail after ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def quiet(seconds: float = 0.2) -> None:
    """Let the controller run for a while (to show it does *not* do something)."""
    await asyncio.sleep(seconds)


@pytest.fixture
def kueue(cluster: FakeCluster) -> FakeKueue:
    kq = FakeKueue(cluster)
    kq.install()
    return kq


@pytest.fixture
async def kube(cluster: FakeCluster) -> AsyncIterator[k.Kube]:
    """The controller's client: exactly the shipped ``dispatch-controller`` role (and its Lease Role)."""
    kb = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
    yield kb
    await kb.aclose()
    assert cluster.server.denied == [], "a request the shipped roles do not allow"


@pytest.fixture
async def adapter(cluster: FakeCluster) -> AsyncIterator[AsyncAdapter]:
    """The user's library: exactly the shipped writer role (with the node reader)."""
    kb = k.Kube.connect(namespace="default", transport=cluster.transport(
        roles=("dispatch-writer", "dispatch-node-reader")))
    yield AsyncAdapter(kb)
    await kb.aclose()


@pytest.fixture
async def admin(cluster: FakeCluster) -> AsyncIterator[k.Kube]:
    """An unrestricted client, for tests of mechanisms (leader election on a Lease of their own) not roles."""
    kb = k.Kube.connect(namespace="default", transport=cluster.transport())
    yield kb
    await kb.aclose()


BASE = Config(resync_seconds=3600, workers=2)


@asynccontextmanager
async def running(kube: k.Kube, config: Config = BASE, **changes: Any) -> AsyncIterator[Controller]:
    """A controller task on ``kube``; stopped (and awaited) on exit."""
    ctl = Controller(kube, replace(config, **changes))
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    try:
        await ctl.wait_synced()
        yield ctl
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def writes(cluster: FakeCluster, since: int = 0) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in cluster.server.requests[since:] if m in ("POST", "PUT", "PATCH", "DELETE")]


def pods_summary(cluster: FakeCluster, name: str = NAME) -> list[tuple[str, str, str | None, bool]]:
    return [(p["metadata"]["name"], p["status"]["phase"],
             p["metadata"]["labels"].get(LABEL_ADMISSION),
             bool(p["metadata"].get("deletionTimestamp"))) for p in cluster.pods(name)]


# ------------------------------------------------------------------ the controller's image on the testbed


@pytest.fixture(scope="session")
def controller_image() -> str:
    """The image built from this tree by scripts/build-image (layers cached; the base made once)."""
    from dispatch.testbed import _container

    why = _container.podman_missing()
    if why and not (os.environ.get("CI") and os.geteuid() == 0):   # in CI, scripts/build-image installs them
        pytest.skip(f"the controller's image needs podman: {why}")
    return _container.build_image()


@pytest.fixture(scope="session")
def shipped(testbed_kubeconfig: str, controller_image: str) -> str:
    """deploy/ applied to the testbed (server-side), so the image runs under the shipped roles only."""
    from dispatch.testbed import _container

    return _container.apply_deploy()
