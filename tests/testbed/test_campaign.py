"""A bounded campaign on the running testbed (issue 34): a few minutes of random actions and faults from a fresh
seed, printed, with dispatch's controller and guard as deployed, judged by what the real node's processes wrote.

``DISPATCH_CAMPAIGN_SEED`` replays a seed, ``DISPATCH_CAMPAIGN_MINUTES`` sets the length (default 3) and
``DISPATCH_CAMPAIGN_FAULTS`` the fault kinds (comma-separated; default all); ``DISPATCH_CAMPAIGN_FIRST`` names an
action to run alone in round 3 too (``namespace_cycle``, which the weights seldom draw). The schedule played and
the report are kept in the test's directory (``schedule.json`` replays with ``scripts/campaign --replay``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dispatch import testbed
from dispatch.testbed import _campaign_runner as runner
from dispatch.testbed import campaign

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def test_a_bounded_campaign_breaks_no_oracle(testbed_kubeconfig: str, tmp_path: Path) -> None:
    if testbed.real_node() is None:
        why = testbed.real_node_problem() or "unknown"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the testbed has no real node: {why}")
        pytest.skip(f"the testbed has no real node: {why}")
    seed = int(os.environ.get("DISPATCH_CAMPAIGN_SEED") or int(time.time() * 1000) % 2**31)
    minutes = float(os.environ.get("DISPATCH_CAMPAIGN_MINUTES", "3"))
    faults = os.environ.get("DISPATCH_CAMPAIGN_FAULTS", ",".join(campaign.FAULTS))
    print(f"\ncampaign seed {seed} ({minutes} min; replay: DISPATCH_CAMPAIGN_SEED={seed})", flush=True)
    schedule = campaign.generate(seed, 100_000, faults=[f for f in faults.split(",") if f and f != "none"])
    if first := os.environ.get("DISPATCH_CAMPAIGN_FIRST"):
        schedule = campaign.with_first(schedule, first)
    report = runner.run(schedule, minutes=minutes, workdir=tmp_path)
    print(report.text())
    print(json.dumps(report.to_json(), indent=1))
    assert report.rounds > 0 and report.processes > 0, "the campaign ran nothing"
    assert not report.failed, report.text()
