"""``status NAME`` read without the parser (``cli._plain``) does what the parser's ``status`` does.

Every line shape ``_plain.parse`` accepts is run both ways against the same fake cluster: through typer (the
harness's ``CliRunner``) and through ``_plain.run``, with the same streams and environment. The settings the
adapter is connected with, stdout, stderr and the exit code must be equal. Every other line must be left to the
parser (``parse`` answers None), so its help, its usage errors and its other commands are typer's.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from dispatch import Adapter
from dispatch.cli import Settings
from dispatch.cli._plain import parse, run
from dispatch.testing import FakeCluster

from .cli_harness import READER, WRITER, Cli

ENV = {"COLUMNS": "250", "KUBECONFIG": None, "DISPATCH_NAMESPACE": None}


def settings_key(s: Settings) -> tuple[Any, ...]:
    """What a connection and the printing read of the settings (a parsed template compares by its output)."""
    return (s.kubeconfig, s.context, s.namespace, s.read_only, s.debug, s.output, s.no_headers, s.request_timeout,
            s.overrides, s.verbosity, s.format is not None and s.format.output)


def both(cluster: FakeCluster, args: list[str], env: dict[str, str | None] | None = None) -> tuple[Any, Any]:
    """(the parser's, the plain path's) (settings, stdout, stderr, exit code) for ``dispatch ARGS``."""
    env = {**ENV, **(env or {})}
    cli = Cli(cluster)
    parsed = cli(*args, env=env)
    via_typer = ([settings_key(s) for s in cli.connected], parsed.stdout, parsed.stderr, parsed.exit_code)

    seen: list[Settings] = []

    def connect(settings: Settings) -> Adapter:
        seen.append(settings)
        roles = READER if settings.read_only else WRITER
        return Adapter.connect(settings.namespace, transport=cluster.transport(roles=roles),
                               read_only=settings.read_only, request_timeout=settings.request_timeout)

    runner = CliRunner()
    with runner.isolation(env=env) as (out, err, _):
        line = parse(args)
        assert line is not None, args
        code = run(line, connect)
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return via_typer, ([settings_key(s) for s in seen], stdout, stderr, code)


@pytest.fixture
def objects(cli: Cli) -> Iterator[FakeCluster]:
    """A held object in ``default`` and one in ``team-a``."""
    assert cli("open", "--job-id", "llama", "--submission", "s1").exit_code == 0
    assert cli("-n", "team-a", "open", "--job-id", "llama", "--submission", "s2").exit_code == 0
    yield cli.cluster


COMMAND = ["status", "get"]
NAMES = ["llama-s1", "llama-s2", "Not_A_Name"]
"""Found in ``default``, found only in ``team-a`` (else a 404), and a name the library refuses."""
ROOT = [[], ["-n", "team-a"], ["--namespace=team-a"], ["-o", "json"], ["--read-only"], ["--no-headers"],
        ["--context", "ctx"], ["--kubeconfig=/k"], ["--debug"]]
OWN = [[], ["-n", "team-a"], ["-nteam-a"], ["--namespace", "team-a"], ["-o", "yaml"], ["-ojson"],
       ["--output=name"], ["-o", "wide"], ["-o", "jsonpath={.state}"], ["-o", "custom-columns=N:.name,S:.state"],
       ["--no-headers"], ["--read-only"], ["--context=ctx"], ["-o", "json", "-n", "team-a"], ["-n", "Bad_NS"]]
GLOBAL = {"--read-only", "--context", "--kubeconfig", "--debug"}


def shapes() -> Iterator[list[str]]:
    """Every root option set with every command option set and every name; ``status`` and ``get`` in turn,
    and the command's options after the NAME, or before it (as click takes them) on every third line."""
    for i, (root, own, name) in enumerate(itertools.product(ROOT, OWN, NAMES)):
        if {o.partition("=")[0] for o in root} & {o.partition("=")[0] for o in own} & GLOBAL:
            continue  # a global option given twice is left to the parser (below)
        command = COMMAND[i % 2]
        yield [*root, command, name, *own]
        if own and i % 3 == 0:
            yield [*root, command, *own, name]


def without_frames(stderr: str) -> str:
    """``--debug``'s traceback less its frames: they differ where the error was caught (the parser's command or
    ``_plain.run``) and where the waiting thread happened to be; the rest (the chained errors, the message and its
    hint) must be the same."""
    return "\n".join(line for line in stderr.splitlines() if not line.startswith("  "))


def test_every_plain_line_prints_what_the_parser_prints(objects: FakeCluster) -> None:
    codes: dict[int, int] = {}
    shown = 0
    for args in shapes():
        via_typer, via_plain = both(objects, args)
        if "--debug" in args:
            via_typer = (*via_typer[:2], without_frames(via_typer[2]), via_typer[3])
            via_plain = (*via_plain[:2], without_frames(via_plain[2]), via_plain[3])
        assert via_plain == via_typer, args
        codes[via_typer[3]] = codes.get(via_typer[3], 0) + 1
        shown += bool(via_typer[1].strip())
    assert sum(codes.values()) > 300 and shown > 100 and set(codes) == {0, 4}, codes  # found, and not found


@pytest.mark.parametrize("env", [{"DISPATCH_NAMESPACE": "team-a"}, {"DISPATCH_NAMESPACE": ""}])
@pytest.mark.parametrize("args", [["status", "llama-s2"], ["-n", "default", "status", "llama-s1"],
                                  ["status", "llama-s1", "-n", "default"]])
def test_the_namespace_variable_as_the_parser_reads_it(objects: FakeCluster, env: dict[str, str | None],
                                                       args: list[str]) -> None:
    via_typer, via_plain = both(objects, args, env)
    assert via_plain == via_typer


@pytest.mark.parametrize("args", [
    [], ["status"], ["find", "x"], ["release", "x"], ["status", "x", "y"], ["status", "--help"], ["--help"],
    ["status", "x", "-h"], ["status", "x", "-w"], ["status", "x", "--watch"], ["status", "x", "-A"],
    ["status", "x", "--all"], ["status", "x", "--state", "Held"], ["status", "x", "-l", "a=b"],
    ["status", "x", "--job-id", "j"], ["status", "x", "-n"], ["status", "x", "-o"], ["status", "x", "-o", "xml"],
    ["status", "x", "-o=json"], ["status", "x", "-n=a"], ["status", "x", "--namespace="], ["status", "x", "-n", ""],
    ["status", "x", "-n", "-o"], ["status", "x", "-o", "json", "-o", "yaml"], ["-n", "a", "-n", "b", "status", "x"],
    ["status", "x", "--no-headers=true"], ["status", "x", "--read-only=true"], ["status", "--", "x"],
    ["status", "-", "x"], ["status", "x", "--request-timeout", "5s"], ["status", "x", "-v", "6"],
    ["status", "x", "-v6"],
    ["status", "x", "--as", "me"], ["status", "x", "--server", "http://h"], ["status", "x", "--token", "t"],
    ["status", "x", "--insecure-skip-tls-verify"], ["--version", "status", "x"], ["status", "x", "--unknown"],
    ["describe", "x"], ["Status", "x"], ["status", "x", "-o", "jsonpath="], ["status", "x", "-o", "jsonpath={.x"],
    ["status", "x", "--context"], ["--kubeconfig", "status", "x"], ["--read-only", "status", "x", "--read-only"],
    ["--context", "a", "status", "x", "--context=b"],
])
def test_other_lines_are_left_to_the_parser(args: list[str]) -> None:
    assert parse(args) is None


def test_the_parsers_completion_protocol_is_left_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse(["status", "x"]) is not None
    monkeypatch.setitem(os.environ, "_DISPATCH_COMPLETE", "zsh_complete")
    assert parse(["status", "x"]) is None


def test_the_command_line_entry_runs_a_plain_line_without_the_parser() -> None:
    """``main`` ends a plain line with the exit code ``run`` gives, through ``SystemExit`` as the parser does
    (``tests/cli/test_cli_start.py`` holds that typer is not loaded then)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys; sys.argv = ['dispatch', 'status', 'Not_A_Name', '--kubeconfig', '/nonexistent']\n"
            "from dispatch.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'typer' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert proc.stdout.strip() == "EXIT 4 False", (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: ")


@pytest.mark.parametrize("error", [BrokenPipeError(32, "Broken pipe"), KeyboardInterrupt(), EOFError(),
                                   RuntimeError("unexpected")])
def test_an_ending_while_printing_is_the_parsers(objects: FakeCluster, monkeypatch: pytest.MonkeyPatch,
                                                error: BaseException) -> None:
    """A closed pipe, Ctrl-C or the end of input while the answer is printed ends both ways alike (exit code and
    stderr); any other exception goes on to the caller both ways."""
    import sys

    import dispatch.cli._commands
    import dispatch.cli._output

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(dispatch.cli._output, "print_status", fail)
    monkeypatch.setattr(dispatch.cli._commands, "print_status", fail)
    stdout, stderr = sys.stdout, sys.stderr
    try:
        if isinstance(error, RuntimeError):
            for _ in range(2):
                with pytest.raises(RuntimeError):
                    both(objects, ["status", "llama-s1"])
            return
        via_typer, via_plain = both(objects, ["status", "llama-s1"])
    finally:
        sys.stdout, sys.stderr = stdout, stderr  # a closed pipe leaves them wrapped, both ways
    assert via_plain == via_typer
    assert via_plain[3] == {BrokenPipeError: 1, KeyboardInterrupt: 130, EOFError: 1}[type(error)]
