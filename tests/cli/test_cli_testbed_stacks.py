"""``dispatch testbed --stack`` / ``dispatch demo --stack`` and what the demo says before starting the testbed."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from dispatch import testbed
from dispatch.testbed import _paths

from .cli_harness import Cli


@pytest.fixture(autouse=True)
def _no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first so the original state (often: unset) is recorded and restored even when a command
    # sets the variable; a bare delenv of an unset name records nothing, and the selection then leaked
    # into every later test of this process (the testbed tests then expected the other stack).
    monkeypatch.setenv(_paths.STACK_ENV, "unset-by-fixture")
    monkeypatch.delenv(_paths.STACK_ENV)


def test_unknown_stack_is_refused_naming_the_known_ones(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    monkeypatch.setattr(testbed, "up", lambda: called.append("up"))
    for args in (("testbed", "--stack", "k8s-9.99", "up"), ("demo", "--stack", "k8s-9.99")):
        result = cli(*args)
        assert result.exit_code == 2, result.output
        assert "unknown testbed stack 'k8s-9.99' (known: k8s-1.35, k8s-1.37)" in result.stderr
        assert "Traceback" not in result.output
    assert called == []
    assert _paths.STACK_ENV not in os.environ


def test_stack_option_selects_the_stack_for_the_command(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def build() -> str:
        seen.append(testbed.stack())
        return "/bin/x"

    monkeypatch.setattr(testbed, "build", build)
    assert cli("testbed", "--stack", "k8s-1.37", "build").exit_code == 0
    assert seen == ["k8s-1.37"]
    assert os.environ[_paths.STACK_ENV] == "k8s-1.37"  # the build script and test workers inherit it


def test_stacks_lists_versions_and_marks_the_selected(cli: Cli) -> None:
    result = cli("testbed", "--stack", "k8s-1.37", "stacks")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("  k8s-1.35   k8s=v1.35.4 etcd=v3.6.5 kwok=v0.8.0 jobset=v0.11.1 trainer=v2.2.0")
    assert lines[1].startswith("* k8s-1.37   k8s=v1.37.2 etcd=v3.7.0 kwok=v0.8.0 jobset=v0.12.0 trainer=v2.3.0")


class _Tb:
    def __init__(self, up: bool, built: bool) -> None:
        self._up, self._built = up, built

    def is_up(self) -> bool:
        return self._up

    def is_built(self) -> bool:
        return self._built

    def stack(self) -> str:
        return "k8s-1.35"

    def build_estimate(self) -> float:
        return 1371.0


@pytest.mark.parametrize(
    ("up", "built", "said"),
    [
        (False, False, "First run: building the local testbed (stack k8s-1.35) from Go modules takes about 23 "
                       "minutes on 2 cores; later runs start in seconds. Progress follows, one line per component; "
                       "the Go tool's output goes to the log file named below."),
        (False, True, "Starting the local testbed (stack k8s-1.35; this takes under a minute)..."),
        (True, True, "Using the running local testbed (stack k8s-1.35)..."),
    ],
)
def test_demo_says_up_front_how_long_starting_takes(up: bool, built: bool, said: str) -> None:
    from dispatch.cli._demo import _testbed_intro

    buf = io.StringIO()
    Console(file=buf, width=400, force_terminal=False).print(_testbed_intro(_Tb(up, built)), highlight=False)
    assert buf.getvalue().strip() == said
