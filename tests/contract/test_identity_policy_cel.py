"""The fake's mirror of the ``dispatch-identity`` CEL policy against the real CEL's answers.

The fake API server refuses a TrainJob write with ``_decision.identity_policy`` where the real one runs the
policy of ``deploy/base/guard.yaml`` (its guard enforces it with the webhook recording only, as the API server
does with the webhook off). ``data/identity-policy-cel.json`` holds what the policy answered on each case in
Kubernetes' own CEL environment; the mirror must allow and refuse the same writes, with the same reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch import _decision as d
from dispatch._trainer import TrainJobView

DATA = json.loads((Path(__file__).parent / "data" / "identity-policy-cel.json").read_text())
CASES: list[dict[str, Any]] = DATA["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_mirror_refuses_what_the_cel_policy_refused(case: dict[str, Any]) -> None:
    old = TrainJobView.from_obj(case["oldObject"]) if case["oldObject"] else None
    got = d.identity_policy(case["operation"], old, TrainJobView.from_obj(case["object"]))
    if not case["denied"]:
        assert got is None, got
        return
    assert got is not None, case["denied"]
    for denial in case["denied"]:
        if "strategic-merge directive" in denial:
            manager = denial.split("(manager ", 1)[1].split(":", 1)[0]
            assert f"(manager {manager}) carries the strategic-merge directive $" in got, (got, denial)
        else:
            assert "only dispatch's entry" in got or "only dispatch's runtime patch entry" in got, (got, denial)

