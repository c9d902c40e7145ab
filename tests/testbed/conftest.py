"""The MultiKueue fleet, shared by the modules that need it: starting it costs about a minute and stopping it
half of one, so it is started by the first of them and stopped once, at the end of the session (unless any of
it was running before, even partly, as a campaign's fleet with a worker down is, or ``DISPATCH_TESTBED_KEEP=1``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def fleet_session() -> Iterator[None]:
    from dispatch.testbed import fleet

    was_up = fleet.is_up()
    was_present = was_up or fleet.is_present()
    if shutil.which("go") is None and not was_up:
        pytest.skip("the Go toolchain is needed to build the testbed")
    yield
    if not was_present and os.environ.get("DISPATCH_TESTBED_KEEP") != "1" and fleet.is_up():
        fleet.down()
