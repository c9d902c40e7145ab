"""What each user command imports: only what it uses (issue 37: start like kubectl).

Each case runs the real entry point in a fresh interpreter (as the console script does) and reads
``sys.modules`` when the command ends. No timing is asserted here (``bench/cli_start_bench.py`` measures it):
a command that starts importing the controller, the testbed, the fence or the docs fails this test, whatever
the machine's speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

NEVER = ("dispatch.controller", "dispatch.testbed", "dispatch.testing", "dispatch.fence", "dispatch.cli._demo",
         "structlog", "prometheus_client", "cryptography", "mkdocs", "griffe")
"""Nothing of the controller, the testbed, the fake, the fence or the docs, for any user command."""
PARSER = ("typer", "rich", "httpx2", "pydantic", "yaml", "asyncio", "msgspec", "dispatch._adapter")
"""What ``--version`` and a TAB on a command's name need none of."""
COMMAND_MODULES = ("dispatch.cli._open", "dispatch.cli._commands", "dispatch.cli._admin", "dispatch.cli._controller",
                   "dispatch.cli._testbed")


def modules_after(*args: str, tmp_path: Path) -> set[str]:
    """The modules loaded once ``dispatch ARGS`` has run (against a kubeconfig whose server refuses
    connections: the command fails after its imports, before any answer)."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    code = textwrap.dedent(f"""
        import sys
        sys.argv = ["dispatch", *{list(args)!r}]
        from dispatch.cli import main
        try:
            main()
        except SystemExit:
            pass
        sys.stdout = sys.__stdout__
        print("MODULES:" + ",".join(sorted(sys.modules)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig),
                               "HOME": str(tmp_path)})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES:")]
    assert line, (proc.stdout[-2000:], proc.stderr[-2000:])
    return set(line[0].removeprefix("MODULES:").split(","))


def modules_at_first_request(*args: str, tmp_path: Path) -> set[str]:
    """The modules loaded when ``dispatch ARGS`` sends its first request (read as the request leaves the
    client; the server refuses the connection and the command ends)."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    code = textwrap.dedent(f"""
        import sys
        import httpx2
        seen = []
        send = httpx2.AsyncClient.send
        async def first(self, *a, **kw):
            if not seen:
                seen.append(sorted(sys.modules))
            return await send(self, *a, **kw)
        httpx2.AsyncClient.send = first
        sys.argv = ["dispatch", *{list(args)!r}]
        from dispatch.cli import main
        try:
            main()
        except SystemExit:
            pass
        sys.stdout = sys.__stdout__
        print("MODULES:" + ",".join(seen[0] if seen else []))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig),
                               "HOME": str(tmp_path)})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES:")]
    assert line and line[0] != "MODULES:", (proc.stdout[-2000:], proc.stderr[-2000:])
    return set(line[0].removeprefix("MODULES:").split(","))


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_version_loads_nothing_but_the_package(tmp_path: Path) -> None:
    modules = modules_after("--version", tmp_path=tmp_path)
    assert loaded(modules, ("dispatch",)) == ["dispatch", "dispatch.cli", "dispatch.cli._codes"]
    assert loaded(modules, PARSER) == []


def test_help_loads_the_parser_and_no_command(tmp_path: Path) -> None:
    modules = modules_after("--help", tmp_path=tmp_path)
    assert "typer" in modules
    assert loaded(modules, (*COMMAND_MODULES, *NEVER, "rich", "httpx2", "pydantic", "dispatch._adapter")) == []


def test_a_tab_on_a_command_name_loads_no_parser(tmp_path: Path) -> None:
    modules = modules_after("__complete", "sta", tmp_path=tmp_path)
    assert loaded(modules, (*PARSER, *COMMAND_MODULES, *NEVER)) == []


def test_a_tab_on_an_object_name_loads_no_parser(tmp_path: Path) -> None:
    """``status lla<TAB>`` lists the namespace's TrainJobs: which commands take a TrainJob's name first is in the
    command table, so neither the parser nor the command's module is loaded (only the client that lists)."""
    for args in (("__complete", "status", "x"), ("__complete", "get", ""), ("__complete", "release", "a")):
        modules = modules_after(*args, tmp_path=tmp_path)
        assert "dispatch._kube" in modules, args  # it did ask the cluster
        assert loaded(modules, ("typer", "pydantic", "rich", "dispatch._adapter", *COMMAND_MODULES, *NEVER)) == []


def test_the_command_table_knows_which_commands_take_a_trainjob_name_first() -> None:
    """``Entry.names_object`` (what a TAB right after the command reads) is what the command's own first
    argument says."""
    from dispatch.cli._app import load
    from dispatch.cli._completion import OBJECT_ARGUMENTS
    from dispatch.cli._registry import COMMANDS

    for name, entry in COMMANDS.items():
        command = load(name)
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        takes_name = not entry.group and bool(arguments) and arguments[0].metavar in OBJECT_ARGUMENTS
        assert entry.names_object == takes_name, name


@pytest.mark.parametrize("args", [
    ("status", "x"), ("status",), ("find",), ("get", "x"), ("ceased", "x"), ("hold", "x"), ("close", "x"),
    ("release", "x"), ("wait", "x", "--for", "Running", "--timeout", "0"), ("logs", "x"),
    ("open", "--job-id", "j", "--submission", "s"), ("status", "--help"), ("completion", "bash"),
    ("__complete", "status", "x"), ("admin", "workers"),
])
def test_a_user_command_loads_nothing_of_the_controller_testbed_fence_or_docs(args: tuple[str, ...],
                                                                              tmp_path: Path) -> None:
    modules = modules_after(*args, tmp_path=tmp_path)
    assert loaded(modules, NEVER) == []


def test_status_loads_only_its_own_command_module(tmp_path: Path) -> None:
    """A line the parser must read (here a watch) loads the status command's module and no other."""
    modules = modules_after("status", "x", "--watch", tmp_path=tmp_path)
    assert loaded(modules, COMMAND_MODULES) == ["dispatch.cli._commands"]
    assert loaded(modules, ("dispatch.cli._spec", "dispatch.cli._release")) == []


@pytest.mark.parametrize("args", [("status", "x"), ("get", "x", "-o", "json"),
                                  ("-n", "ns", "status", "x", "--no-headers")])
def test_a_plain_status_line_loads_no_parser(args: tuple[str, ...], tmp_path: Path) -> None:
    """``status NAME`` with plain options is read by ``cli._plain``: neither typer nor any command's module is
    loaded, start to end (an error included: this one cannot reach its server)."""
    modules = modules_after(*args, tmp_path=tmp_path)
    assert "dispatch.cli._plain" in modules and "dispatch._adapter" in modules
    assert loaded(modules, ("typer", "click", "pydantic", "dispatch.cli._app", "dispatch.cli._common",
                            "dispatch.cli._coerce", *COMMAND_MODULES, *NEVER)) == []


def test_status_sends_its_first_request_with_only_what_reading_needs(tmp_path: Path) -> None:
    """When a plain ``status NAME``'s first request leaves, nothing only opening, writing, following, the fleet
    or administration uses is loaded (``_adapter`` imports those in the methods that use them), nor what prints
    the answer or reports an error (loaded after the answer)."""
    modules = modules_at_first_request("status", "x", tmp_path=tmp_path)
    assert "dispatch._adapter" in modules
    assert loaded(modules, ("typer", "dispatch._admin", "dispatch._enrol", "dispatch._events", "dispatch._fleet",
                            "dispatch._follow", "dispatch._validate", "dispatch.cli._output", "dispatch.cli._errors",
                            *COMMAND_MODULES)) == []


def test_status_sends_its_first_request_before_loading_rich_or_the_template_parser(tmp_path: Path) -> None:
    """What ``status NAME`` has loaded when its first request leaves: printing's modules (rich, the jsonpath
    template parser) come after the answer, so they are not part of the wait before the request."""
    modules = modules_at_first_request("status", "x", tmp_path=tmp_path)
    assert "dispatch._adapter" in modules  # the request did go out through the library
    assert loaded(modules, ("rich", "dispatch.cli._jsonpath", "dispatch.cli._release", *NEVER)) == []


def test_status_converts_its_values_without_pydantic(tmp_path: Path) -> None:
    """typer converts each parameter's value with a pydantic adapter it builds on first use; ``status NAME``'s
    values are plain (strings, flags, absent options), converted by ``cli._coerce`` as typer would, so neither
    pydantic nor typer's adapters are loaded before its first request (they cost more than the rest of its
    start). A value typer must convert still loads them (``test_coerce``). A plain ``status NAME`` loads no
    parser at all (``_plain``); this line is one the parser reads."""
    modules = modules_at_first_request("status", "x", "--request-timeout", "5s", tmp_path=tmp_path)
    assert "dispatch._adapter" in modules and "typer" in modules  # a line the parser reads (not plain)
    assert loaded(modules, ("pydantic", "pydantic_core", "typer._adapters")) == []


def test_a_template_format_still_loads_its_parser(tmp_path: Path) -> None:
    """``-o jsonpath=...`` is parsed before any request (a bad template is a usage error), so its parser loads
    then; the default table does not need it."""
    modules = modules_at_first_request("status", "x", "-o", "jsonpath={.name}", tmp_path=tmp_path)
    assert "dispatch.cli._jsonpath" in modules


def test_help_lists_each_command_as_its_own_help_would(tmp_path: Path) -> None:
    """``--help`` reads the command list from a table; each line is what the command's own help gives."""
    import typer

    from dispatch.cli._app import load
    from dispatch.cli._registry import COMMANDS

    for name, entry in COMMANDS.items():
        command = load(name)
        for width in (40, 70, 200):
            table = typer.core.TyperCommand(name=name, help=entry.help).get_short_help_str(width)
            assert command.get_short_help_str(width) == table, name


def test_the_command_line_uses_no_private_module_of_typer() -> None:
    """The bound ``typer>=0.29,<1`` admits any 0.x: only typer's documented names are used (``typer.main.
    get_command``, ``typer.core.TyperGroup``, click's own API), never a ``typer._...`` module, whose layout
    changes between minor releases (0.29 vendored click into ``typer._click``)."""
    import ast

    used = []
    for path in sorted((ROOT / "src" / "dispatch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            used += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("typer._") or ".typer._" in n]
    assert used == []


@pytest.mark.parametrize("args", [("__complete", "sta"), ("__complete", "status", "x"), ("status", "x")])
def test_a_tab_and_a_plain_line_end_without_the_collectors_last_passes(args: tuple[str, ...], tmp_path: Path) -> None:
    """The objects are frozen at exit (``cli._end_lightly``), so the interpreter's last collections skip them;
    the answer is printed whole all the same. A line the parser reads keeps the collector."""
    for line, frozen in ((args, True), (("status", "x", "--watch"), False)):
        kubeconfig = tmp_path / "config"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))
        code = textwrap.dedent(f"""
            import atexit, gc, os, sys
            atexit.register(lambda: os.write(2, f"FROZEN {{gc.get_freeze_count() > 0}}\\n".encode()))  # runs last
            sys.argv = ["dispatch", *{list(line)!r}]
            from dispatch.cli import main
            main()
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
                                   "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)})
        assert proc.stderr.splitlines()[-1] == f"FROZEN {frozen}", (line, proc.stdout, proc.stderr)
        if line[0] == "__complete":
            assert proc.stdout.splitlines()[-1].startswith(":")  # cobra's directive: the answer printed whole


@pytest.mark.parametrize(("args", "collecting"), [(("status", "x"), False), (("status", "x", "--watch"), True)])
def test_the_collector_is_off_while_a_plain_line_reads(args: tuple[str, ...], collecting: bool,
                                                     tmp_path: Path) -> None:
    """A plain ``status NAME`` sends its first request with the cyclic collector off (``cli._lightly``); a line
    the parser reads runs with it on."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    code = textwrap.dedent(f"""
        import gc, os, socket, sys
        def connect(self, *a):
            os.write(1, f"COLLECTING {{gc.isenabled()}}\\n".encode())
            os._exit(0)
        socket.socket.connect = connect
        sys.argv = ["dispatch", *{list(args)!r}]
        from dispatch.cli import main
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin",
                               "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)})
    assert proc.stdout.strip() == f"COLLECTING {collecting}", (proc.stdout, proc.stderr)


def test_a_caller_of_main_gets_its_collector_back(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from dispatch.cli import main

    monkeypatch.setattr("sys.argv", ["dispatch", "__complete", "sta"])
    monkeypatch.setattr("atexit.register", lambda *a: None)  # this process keeps its collector at exit too
    assert gc.isenabled()
    main()
    assert gc.isenabled()
    assert capsys.readouterr().out == "status\n:4\n"


def test_the_benchs_floor_is_what_a_plain_status_line_loads_of_other_packages(tmp_path: Path) -> None:
    """``bench/cli_start_bench.py``'s floor (``STATUS_THIRD_PARTY``) loads exactly the modules of other packages
    and of the standard library that ``status NAME`` has loaded when its first request leaves: the floor the
    bench compares the command with is neither short of them nor over."""
    from bench.cli_start_bench import STATUS_THIRD_PARTY

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    code = textwrap.dedent("""
        import os, socket, sys
        def connect(self, *a):  # the request's connection: where the bench's server sees it
            os.write(1, ("MODULES:" + ",".join(sys.modules)).encode())
            os._exit(0)
        socket.socket.connect = connect
        sys.argv = ["dispatch", "status", "x"]
        from dispatch.cli import main
        main()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig),
                              "HOME": str(tmp_path)}).stdout
    first = {m for m in out.removeprefix("MODULES:").split(",") if not m.startswith("dispatch")}
    proc = subprocess.run([sys.executable, "-c", STATUS_THIRD_PARTY + "; import sys; print(','.join(sys.modules))"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    floor = set(proc.stdout.strip().split(","))
    assert sorted(first - floor - {"gc"}) == []  # gc: built in, what turns the collector off
    assert sorted(floor - first) == []
