"""Shared fixtures: a fake cluster with a runtime and three nodes, and a writer adapter on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dispatch import Adapter
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")
"""The roles the ``adapter`` fixture holds: every library test runs with the shipped writer's permissions."""
READER = ("dispatch-reader", "dispatch-node-reader")


LAST = ("tests/testbed/test_campaign.py",)
"""Run after every other test: the campaign's faults (a Node deleted and registered again, kubelet and containerd
restarted, the node powered off) leave the real node changed, and no other test should start on what they left."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.startswith(LAST))  # stable: the order is kept otherwise


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
    """One pass of the controller's finalizer keeper over every pod (``dispatch.controller.testing``)."""
    from dispatch.controller.testing import keeper_pass as one_pass

    return one_pass(cluster, settle=False)


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
    # A testbed some component of which runs is someone's (a campaign restarting its API server makes it
    # unhealthy for seconds): never taken down here. Only one this run started is.
    was_up = testbed.is_present()
    path = testbed.up()
    yield str(path)
    if not was_up and os.environ.get("DISPATCH_TESTBED_KEEP") != "1":
        testbed.down()
