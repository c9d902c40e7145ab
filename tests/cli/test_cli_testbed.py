"""``dispatch testbed ...`` and ``dispatch demo`` wiring (the testbed itself is replaced by a stand-in)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatch import LABEL_ADMISSION, testbed

from .cli_harness import Cli


@dataclass
class Component:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    frozen: bool


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def record(name: str, result: object = None) -> object:
        def fn(*args: str) -> object:
            seen.append(" ".join([name, *args]))
            return result

        return fn

    monkeypatch.setattr(testbed, "build", record("build", Path("/bin/dir")))
    monkeypatch.setattr(testbed, "up", record("up", Path("/rt/kubeconfig")))
    monkeypatch.setattr(testbed, "down", record("down"))
    monkeypatch.setattr(testbed, "freeze", record("freeze"))
    monkeypatch.setattr(testbed, "thaw", record("thaw"))
    monkeypatch.setattr(testbed, "kubeconfig_path", lambda: Path("/rt/kubeconfig"))
    monkeypatch.setattr(
        testbed, "status",
        lambda: [Component("etcd", 10, True, True, False), Component("kwok-node-2", 11, True, False, True)],
    )
    return seen


def test_testbed_commands_call_the_testbed(cli: Cli, calls: list[str]) -> None:
    for args, out in (
        (("build",), "built: /bin/dir"),
        (("up",), "export KUBECONFIG=/rt/kubeconfig"),
        (("down",), "testbed down"),
        (("freeze", "node-2"), "froze node-2"),
        (("thaw", "node-2"), "thawed node-2"),
    ):
        result = cli("testbed", *args)
        assert result.exit_code == 0, result.output
        assert out in result.stdout
    assert calls == ["build", "up", "down", "freeze node-2", "thaw node-2"]
    assert cli.connected == []


def test_testbed_status(cli: Cli, calls: list[str]) -> None:
    result = cli("testbed", "status")
    assert result.exit_code == 0
    assert "etcd" in result.stdout
    assert "frozen" in result.stdout
    assert "testbed is up" in result.stdout
    data = json.loads(cli("testbed", "status", "-o", "json").stdout)
    assert data["up"] is True
    assert data["kubeconfig"] == "/rt/kubeconfig"
    assert data["components"][1] == {"name": "kwok-node-2", "pid": 11, "running": True, "healthy": False,
                                     "frozen": True}


def test_testbed_failures_are_one_line_messages(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    def bad(node: str) -> None:
        raise ValueError(f"{node} is not freezable (freezable: node-2, node-3)")

    monkeypatch.setattr(testbed, "freeze", bad)
    result = cli("testbed", "freeze", "node-0")
    assert result.exit_code == 1
    assert "node-0 is not freezable" in result.stderr
    assert "Traceback" not in result.output


def test_testbed_needs_a_subcommand(cli: Cli) -> None:
    result = cli("testbed")
    assert result.exit_code in (0, 2)
    assert "freeze" in result.output


def test_demo_failure_exits_1(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli import _demo

    def broken(*args: object, **kwargs: object) -> None:
        raise _demo.DemoFailed("the promise was broken: demo-grace has two executions running")

    monkeypatch.setattr(_demo, "run_demo", broken)
    result = cli("demo")
    assert result.exit_code == 1
    assert "demo failed: the promise was broken" in result.stderr


def test_demo_passes_its_options(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli import _demo

    seen: list[tuple[bool, float, bool]] = []

    def fake(console: object, *, keep: bool, step_timeout: float, real_node: bool) -> None:
        seen.append((keep, step_timeout, real_node))

    monkeypatch.setattr(_demo, "run_demo", fake)
    assert cli("demo", "--keep", "--step-timeout", "30").exit_code == 0
    assert cli("demo", "--real-node").exit_code == 0
    assert seen == [(True, 30.0, False), (False, 120.0, True)]


def test_watcher_flags_two_running_executions(monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli import _demo

    def pod(name: str, obj: str, admission: str, phase: str = "Running") -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {
            "jobset.sigs.k8s.io/jobset-name": obj, LABEL_ADMISSION: admission}},
            "status": {"phase": phase}}

    pods = [pod("a-1", "a", "1"), pod("a-2", "a", "2", "Pending"), pod("b-1", "b", "1")]
    monkeypatch.setattr(_demo, "_get", lambda *args: {"items": pods})
    watcher = _demo.Watcher("ns")
    watcher.check()
    assert watcher.violations == []
    pods[1] = pod("a-2", "a", "2")
    watcher.check()
    assert len(watcher.violations) == 1
    assert "a has two executions running: A=1: a-1; A=2: a-2" in watcher.violations[0]
