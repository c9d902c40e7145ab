"""Status names ended pods that wait for a controller that is not running (issue 38 item 6), on the API
server's clock alone: the ``Date`` of its answers against its own deletion times."""

from __future__ import annotations

from typing import Any

from dispatch import _decision as d
from dispatch._kube import http_date
from dispatch._views import POD_FINALIZER, PodView

T0 = http_date("Thu, 03 Dec 2026 17:00:00 GMT")


def view(name: str, *, phase: str = "Failed", deleted: str | None = "2026-12-03T17:00:00Z", ours: bool = True,
         node: str = "n1") -> PodView:
    labels = {"dispatch.phpboyscout.uk/job-id": "j", "dispatch.phpboyscout.uk/submission": "s"}
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": name, "labels": labels,
                            "finalizers": [POD_FINALIZER] if ours else []}
    if deleted:
        meta["deletionTimestamp"] = deleted
        meta["deletionGracePeriodSeconds"] = 30
    terminated = {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": "2026-12-03T16:00:00Z",
                                 "finishedAt": "2026-12-03T17:00:01Z"}}
    return PodView.from_obj({"metadata": meta, "spec": {"nodeName": node, "restartPolicy": "Never",
                                                     "containers": [{"name": "node"}]},
                          "status": {"phase": phase, "conditions": [
                              {"type": "PodReadyToStartContainers", "status": "False"}],
                              "containerStatuses": [{"name": "node", "state": terminated}]}})


def test_http_dates_parse_strictly_and_bounded() -> None:
    assert T0 == 1796317200.0
    for bad in (None, "", "yesterday", "Thu, 03 Dec 2026 17:00:00", "x" * 65):
        assert http_date(bad) is None, bad


def test_only_ours_deleted_a_minute_ago_and_proven_are_named() -> None:
    assert T0 is not None
    ended = view("p-ended")
    assert d.keeper_idle_warning([ended], {}, T0 + 59) is None
    said = d.keeper_idle_warning([ended], {}, T0 + 61)
    assert said is not None and "p-ended (kubelet-confirmed, deleted 61s ago)" in said
    assert d.keeper_idle_warning([view("p-theirs", ours=False)], {}, T0 + 600) is None
    assert d.keeper_idle_warning([view("p-kept", deleted=None)], {}, T0 + 600) is None
    running = view("p-running", phase="Running")
    assert running.end(None) == "unproven"
    assert d.keeper_idle_warning([running], {}, T0 + 600) is None  # it may run: the rule names it, not this
