"""The campaign's ``namespace_cycle`` without a cluster: what the runner expects after it, and how it goes on
when the namespace does not go (``dispatch.testbed._campaign_runner``, its admin client and re-provisioning
stood in for)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dispatch import POD_FINALIZER
from dispatch import _kube as k
from dispatch.testbed import _campaign_runner as runner
from dispatch.testbed import campaign as c
from dispatch.testbed import harness


class Admin:
    """A cluster admin's client on a namespace that goes ``checks`` reads after its deletion (None: never)."""

    def __init__(self, checks: int | None) -> None:
        self.checks = checks
        self.there, self.deleting = True, False
        self.created: list[str] = []

    async def delete(self, res: k.Res, name: str, **_: Any) -> dict[str, Any]:
        assert res is k.NAMESPACES
        self.deleting = True
        return {}

    async def get_or_none(self, res: k.Res, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        assert res is k.NAMESPACES
        if self.deleting and self.checks is not None:
            if self.checks <= 0:
                self.there, self.deleting = False, False
            self.checks -= 1
        return {"metadata": {"name": name}} if self.there else None

    async def create(self, res: k.Res, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        self.created.append(res.kind)
        if res is k.NAMESPACES:
            self.there = True
        return obj

    async def list(self, res: k.Res, namespace: str | None = None, **_: Any) -> SimpleNamespace:
        pods = [{"metadata": {"name": "p0-s1-0", "finalizers": [POD_FINALIZER], "deletionTimestamp": "t"},
                 "status": {"phase": "Failed"}}]
        return SimpleNamespace(items=pods if res is k.PODS else [])


def campaign(tmp_path: Path, admin: Admin, monkeypatch: pytest.MonkeyPatch) -> tuple[runner.Campaign, list[str]]:
    got = runner.Campaign(c.Schedule(1, ()), tmp_path)
    got.admin, got.ns, got.cq = admin, "ctl-1", "ctl-1"  # type: ignore[assignment]
    got.desired = {"p0": "running", "k0": "held"}
    got.editor, got.writers = object(), [object()]  # type: ignore[assignment,list-item]
    provisioned: list[str] = []

    async def provision() -> dict[str, Path]:
        provisioned.append(got.ns)
        return {}

    async def nothing() -> None:
        return None

    async def answers(*_: Any) -> bool:
        return True
    monkeypatch.setattr(got, "_provision", provision)
    monkeypatch.setattr(got, "supervise", nothing)
    monkeypatch.setattr(got, "_heal_everything", nothing)
    monkeypatch.setattr(harness, "probe_denied", answers)
    return got, provisioned


def test_a_namespace_gone_is_made_again_and_every_submission_is_then_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = Admin(checks=0)
    got, provisioned = campaign(tmp_path, admin, monkeypatch)
    assert asyncio.run(got.namespace_cycle()) == "ok"
    assert admin.created == ["Namespace", "LocalQueue"] and provisioned == ["ctl-1"]
    assert got.desired == {"p0": "absent", "k0": "absent"} and not got.ns_gone
    assert any("namespace_cycle(ctl-1): ok (gone in" in n for n in got.report.findings)


def test_a_namespace_that_does_not_go_is_named_with_what_remains_and_made_again_once_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "NAMESPACE_GONE_TIMEOUT", 0.0)
    admin = Admin(checks=None)
    got, provisioned = campaign(tmp_path, admin, monkeypatch)
    got.active.add("freeze")
    assert asyncio.run(got.namespace_cycle()) == "not gone"
    assert got.ns_gone and got.ns_pending and provisioned == []
    assert f"Pod p0-s1-0 (Failed, finalizers {POD_FINALIZER}, deleting)" in got.report.findings[0]
    assert asyncio.run(got.act(c.Op("open", "p0", "a"))) == "skipped (the namespace is not made again yet)"
    assert asyncio.run(got.namespace_cycle()) == "skipped (the namespace is not made again yet)"
    assert not asyncio.run(got._namespace_back())       # still there
    admin.checks = 0
    assert asyncio.run(got._namespace_back())           # gone at last: made again
    assert not got.ns_gone and not got.ns_pending and provisioned == ["ctl-1"]
    assert got.report.outcomes == {"namespace_cycle: late ok": 1}
