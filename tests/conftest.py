"""Shared fixtures: a fake cluster with a runtime and three nodes, and a writer adapter on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dispatch import Adapter
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")
"""The roles the ``adapter`` fixture holds: every library test runs with the shipped writer's permissions."""
READER = ("dispatch-reader", "dispatch-node-reader")


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_runtime()
    for name in ("node-0", "node-1", "node-2"):
        c.add_node(name)
    return c


@pytest.fixture
def adapter(cluster: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as a:
        yield a


@pytest.fixture
def reader(cluster: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=cluster.transport(roles=READER), read_only=True) as a:
        yield a


def keeper_pass(cluster: FakeCluster) -> dict[str, str]:
    """One pass of the controller's finalizer keeper (the shipped controller role) over every pod: dispatch's
    pod finalizer is freed by the controller alone (the writer role may not patch pods, issue 25)."""
    import asyncio

    from dispatch import _kube as k
    from dispatch.controller._finalizers import FinalizerKeeper
    from dispatch.controller._metrics import Metrics

    async def go() -> dict[str, str]:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
        keeper = FinalizerKeeper(kube, Metrics.create())
        try:
            keeper.list_pods(cluster.server.objects("", "pods"))
            return {key: await keeper.release(key) for key in sorted(keeper.signatures)}
        finally:
            await kube.aclose()

    return asyncio.run(go())


@pytest.fixture
def keeper(cluster: FakeCluster) -> Callable[[], dict[str, str]]:
    """``keeper()``: the controller frees the pods whose end is proven, as the shipped install's does."""
    return lambda: keeper_pass(cluster)


@pytest.fixture(scope="session")
def testbed_kubeconfig() -> Iterator[str]:
    """The local real control plane, up once per test run (built first if needed)."""
    import os
    import shutil

    from dispatch import testbed

    if shutil.which("go") is None and not testbed.is_up():
        pytest.skip("the Go toolchain is needed to build the testbed")
    was_up = testbed.is_up()
    path = testbed.up()
    yield str(path)
    if not was_up and os.environ.get("DISPATCH_TESTBED_KEEP") != "1":
        testbed.down()
