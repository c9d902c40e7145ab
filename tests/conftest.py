"""Shared fixtures: a fake cluster with a runtime and three nodes, and a writer adapter on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dispatch import Adapter
from dispatch.testing import FakeCluster


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_runtime()
    for name in ("node-0", "node-1", "node-2"):
        c.add_node(name)
    return c


@pytest.fixture
def adapter(cluster: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=cluster.transport()) as a:
        yield a


@pytest.fixture
def reader(cluster: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=cluster.transport(), read_only=True) as a:
        yield a
