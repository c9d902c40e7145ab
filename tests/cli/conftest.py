"""CLI tests run the real command against the suite's fake cluster (``tests/conftest.py``'s ``cluster``)
through the adapter factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from dispatch.testing import FakeCluster

from .cli_harness import Cli


@pytest.fixture
def cli(cluster: FakeCluster) -> Iterator[Cli]:
    yield Cli(cluster)
    cluster.history.check()


@pytest.fixture
def running(cli: Cli) -> Callable[[], str]:
    """Open and release llama/s1 and let its pod start; returns its name."""

    def make() -> str:
        assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
        assert cli("release", "llama-s1").exit_code == 0
        cli.cluster.settle()
        return "llama-s1"

    return make
