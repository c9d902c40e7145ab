"""kubectl's habits: output formats, piped tables, -A/-l/-w, completion, the plugin and module entry points,
--request-timeout and error messages naming the server, logs options, open --dry-run. All against the fake
cluster with the shipped roles (``cli_harness``)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
import yaml
from typer.testing import CliRunner

from dispatch import LABEL_JOB_ID, Adapter
from dispatch._adapter import Following
from dispatch.cli import EXIT_REFUSED, EXIT_RETRY, EXIT_USAGE, app

from .cli_harness import WRITER, Cli

ROOT = Path(__file__).resolve().parents[2]


def opened(cli: Cli, *names: str, extra: tuple[str, ...] = ()) -> None:
    for name in names:
        job, sub = name.split("-")
        result = cli("open", "--job-id", job, "--submission", sub, *extra)
        assert result.exit_code == 0, result.output


# ------------------------------------------------------------------------------------------- piped tables


def test_piped_table_is_one_row_per_line_unpadded_even_with_a_long_cause(
        cli: Cli, running: Callable[[], str]) -> None:
    """The issue's case: a held object whose cause lists its remaining pods used to wrap into a stray
    ``(Ready=True);`` row; piped, each object is one line and ``awk '{print $1}'`` prints only names."""
    name = running()
    assert cli("hold", name).exit_code == 0
    opened(cli, "other-s1")
    result = cli("status", env={"COLUMNS": "40"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["NAME", name, "other-s1"]
    assert "remaining pods:" in lines[1] and "(Ready=True)" in lines[1]
    assert all(line == line.rstrip() for line in lines)  # nothing padded after the last cell
    header = lines[0]
    for column in ("STATE", "IDENTITY", "A", "MODE", "AGE", "CAUSE"):
        assert f"   {column}" in header  # kubectl's three-space column gap
    assert "\x1b[" not in result.stdout  # no colour codes in a pipe


def test_no_headers(cli: Cli) -> None:
    opened(cli, "a-s1", "b-s1")
    for command in (("status",), ("find",)):
        result = cli(*command, "--no-headers")
        assert result.exit_code == 0, result.output
        assert [line.split()[0] for line in result.stdout.splitlines()] == ["a-s1", "b-s1"]
    assert cli("--no-headers", "status").stdout.splitlines()[0].startswith("a-s1")


def test_a_cell_never_splits_a_row(cli: Cli) -> None:
    from dispatch.cli._output import Column, Grid

    grid = Grid([Column("NAME"), Column("CAUSE", fold=True)])
    grid.add(["a", "first\nsecond\tthird\x1b[31m"])
    assert grid.lines() == ["NAME   CAUSE", "a      first second third [31m"]


# ---------------------------------------------------------------------------------------------- -o formats


def test_output_name(cli: Cli, running: Callable[[], str]) -> None:
    opened(cli, "a-s1")
    name = running()
    tj = "trainjob.trainer.kubeflow.org/"
    assert cli("status", "-o", "name").stdout == f"{tj}a-s1\n{tj}{name}\n"
    assert cli("find", "-o", "name").stdout == f"{tj}a-s1\n{tj}{name}\n"
    assert cli("status", "a-s1", "-o", "name").stdout == f"{tj}a-s1\n"
    assert cli("-o", "name", "open", "--job-id", "b", "--submission", "s1").stdout == f"{tj}b-s1\n"
    assert cli("release", "b-s1", "-o", "name").stdout == f"{tj}b-s1\n"
    assert cli("hold", "b-s1", "-o", "name").stdout == f"{tj}b-s1\n"
    ceased = cli("ceased", "a-s1", "-o", "name")
    assert ceased.exit_code == 0 and ceased.stdout == f"{tj}a-s1\n"
    assert cli("close", "a-s1", "-o", "name").stdout == f"{tj}a-s1\n"


def test_output_name_is_refused_where_nothing_is_named(cli: Cli) -> None:
    result = cli("admin", "migrate", "-o", "name")
    assert result.exit_code == EXIT_USAGE
    assert "names no object" in result.stderr
    assert cli.connected == []  # refused before anything was asked of the cluster


def test_output_wide(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    assert cli("hold", name).exit_code == 0
    plain = cli("status").stdout.splitlines()
    wide = cli("status", "-o", "wide").stdout.splitlines()
    for column in ("PODS", "NODES", "CREATED BY"):
        assert column in wide[0] and column not in plain[0]
    row = wide[1].split()
    assert row[0] == name and row[6:8] == ["1", "node-0"]
    ceased = cli("ceased", name, "-o", "wide")
    assert "FINALIZER" in ceased.stdout and "WHY" in ceased.stdout


def test_output_jsonpath(cli: Cli, running: Callable[[], str]) -> None:
    opened(cli, "a-s1")
    name = running()
    assert cli("status", "-o", "jsonpath={.items[*].name}").stdout == f"a-s1 {name}"  # no newline, as kubectl
    ranged = cli("status", "-o", 'jsonpath={range .items[*]}{.name}{"\\t"}{.identity.admission}{"\\n"}{end}')
    assert ranged.stdout == f"a-s1\t0\n{name}\t1\n"
    filtered = cli("status", "-o", 'jsonpath={.items[?(@.state=="Running")].name}')
    assert filtered.stdout == name
    assert cli("status", name, "-o", "jsonpath={.identity.jobId}/{.identity.submission}#{.identity.admission}"
               ).stdout == "llama/s1#1"
    assert cli("status", name, "-o", "jsonpath={.nothere}").stdout == ""  # a missing key prints nothing


def test_output_custom_columns(cli: Cli, running: Callable[[], str]) -> None:
    opened(cli, "a-s1")
    name = running()
    result = cli("status", "-o", "custom-columns=NAME:.name,A:.identity.admission,QUEUE:.queue")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["NAME       A   QUEUE", "a-s1       0   <none>", f"{name}   1   <none>"]
    one = cli("status", name, "--no-headers", "-o", "custom-columns=STATE:.state")
    assert one.stdout == "Running\n"


@pytest.mark.parametrize(("fmt", "words"), [
    ("jsonpath", "jsonpath needs a template"),
    ("jsonpath={.items[", "unclosed '{'"),
    ("jsonpath={.items[0}", "unclosed '['"),
    ("jsonpath={.items[?(@.a ~ 1)]}", "unexpected ' '"),
    ("jsonpath={range .items[*]}{.name}", "{range} without {end}"),
    ("jsonpath={.a}{end}", "{end} without {range}"),
    ("custom-columns=NAME", "is not HEADER:PATH"),
    ("custom-columns=NAME:name", "a path starts with"),
    ("tabel", "unknown output format 'tabel'"),
    ("json=x", "takes no template"),
    ("go-template={{.name}}", "unknown output format"),
])
def test_a_bad_output_format_is_a_usage_error_before_any_request(cli: Cli, fmt: str, words: str) -> None:
    for args in (("status", "-o", fmt), ("-o", fmt, "status")):
        result = cli(*args)
        assert result.exit_code == EXIT_USAGE, (args, result.output)
        assert words in result.stderr, result.stderr
    assert cli.connected == []


# ------------------------------------------------------------------------------------------- -A, -l, -w


def test_all_namespaces(cli: Cli) -> None:
    cli.cluster.server.create("", "namespaces", "", {"metadata": {"name": "team-b"}})
    opened(cli, "a-s1")
    assert cli("-n", "team-b", "open", "--job-id", "b", "--submission", "s1").exit_code == 0
    assert cli("-n", "team-b", "open", "--job-id", "a", "--submission", "s1").exit_code == 0
    result = cli("status", "-A")
    assert result.exit_code == 0, result.output
    rows = [line.split()[:2] for line in result.stdout.splitlines()]
    assert rows == [["NAMESPACE", "NAME"], ["default", "a-s1"], ["team-b", "a-s1"], ["team-b", "b-s1"]]
    data = cli.json("find", "--all-namespaces")
    assert [(s["namespace"], s["name"]) for s in data["items"]] == [
        ("default", "a-s1"), ("team-b", "a-s1"), ("team-b", "b-s1")]
    assert [s["name"] for s in cli.json("find", "-A", "--job-id", "b")["items"]] == ["b-s1"]
    refused = cli("status", "a-s1", "-A")
    assert refused.exit_code == EXIT_USAGE and "not both" in refused.stderr


def test_selector(cli: Cli) -> None:
    opened(cli, "a-s1", extra=("--label", "team=ml"))
    opened(cli, "b-s1", extra=("--label", "team=cv"))
    opened(cli, "c-s1")
    def names(*args: str) -> list[str]:
        return [s["name"] for s in cli.json("status", *args)["items"]]

    assert names("-l", "team=ml") == ["a-s1"]
    assert names("--selector", "team in (ml,cv)") == ["a-s1", "b-s1"]
    assert names("-l", "!team") == ["c-s1"]
    assert names("-l", "team!=ml") == ["b-s1", "c-s1"]
    assert names("-l", "team=ml", "--state", "Held") == ["a-s1"]
    # dispatch's own filter still applies: a TrainJob that is not dispatch's is not listed without --all
    cli.cluster.server.create("trainer.kubeflow.org", "trainjobs", "default", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "foreign", "labels": {"team": "ml"}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}})
    assert names("-l", "team=ml") == ["a-s1"]
    assert names("-l", "team=ml", "--all") == ["a-s1", "foreign"]
    bad = cli("status", "-l", "team=ml\x00")
    assert bad.exit_code == EXIT_REFUSED and "is not a label selector" in bad.stderr
    unparsed = cli("find", "-l", "team in ml")
    err = " ".join(unparsed.stderr.split())
    assert unparsed.exit_code == EXIT_REFUSED and "label selector 'team in ml' refused by the API server" in err
    assert "'key in (a,b)'" in err


def release(cli: Cli, name: str) -> None:
    """A release by another user of the cluster, while the CLI watches."""
    with Adapter.connect("default", transport=cli.cluster.transport(roles=WRITER)) as other:
        other.release(name)


def _change_once(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """Make one change to the cluster the first time a watcher waits, so the watch has something to show."""
    original = Following.changed
    done: list[bool] = []

    def changed(self: Following, timeout: float) -> bool:
        if not done:
            done.append(True)
            change()
        return original(self, min(timeout, 0.5))

    monkeypatch.setattr(Following, "changed", changed)


def test_watch_one_object_prints_a_row_per_change(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    opened(cli, "a-s1")
    _change_once(monkeypatch, lambda: release(cli, "a-s1"))
    result = cli("--request-timeout", "2s", "status", "a-s1", "-w")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATE"]
    assert [line.split()[:2] for line in lines[1:]] == [["a-s1", "Held"], ["a-s1", "Running"]]


def test_watch_find_prints_only_changed_rows(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    opened(cli, "a-s1", "b-s1")
    _change_once(monkeypatch, lambda: release(cli, "b-s1"))
    result = cli("--request-timeout", "2", "find", "-w", "--no-headers")
    assert result.exit_code == 0, result.output
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["a-s1", "Held"], ["b-s1", "Held"], ["b-s1", "Running"]]
    as_json = cli("--request-timeout", "1", "find", "-w", "-o", "json")
    docs = [json.loads(d) for d in as_json.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    assert [d["name"] for d in docs] == ["a-s1", "b-s1"]  # one document per object, as kubectl -w -o json


# ------------------------------------------------------------------------------------ completion, entries


def test_completion_scripts(cli: Cli) -> None:
    for shell, words in (("bash", "complete -o default -F _dispatch_completion dispatch"),
                         ("zsh", "compdef _dispatch_completion dispatch"),
                         ("fish", "complete --command dispatch")):
        result = cli("completion", shell)
        assert result.exit_code == 0, result.output
        assert words in result.stdout and "dispatch __complete" in result.stdout
    bad = cli("completion", "tcsh")
    assert bad.exit_code == EXIT_USAGE and "bash, zsh, fish" in bad.stderr


def _complete(*words: str) -> list[str]:
    """What every shell script asks: ``dispatch __complete WORDS...``, answered in cobra's format."""
    proc = subprocess.run([sys.executable, "-c", "from dispatch.cli import main; main()", "__complete", *words],
                          env=_env(), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    *found, directive = proc.stdout.splitlines()
    assert directive.startswith(":"), proc.stdout
    return found


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("_DISPATCH")}


def test_completion_answers_commands_options_and_choices() -> None:
    assert _complete("sta") == ["status"]
    assert {"--selector", "--state"} <= set(_complete("status", "--s"))
    assert _complete("status", "--state", "") == ["Held", "Queued", "Running", "Succeeded", "Failed", "Closing"]
    assert _complete("--context", "x", "status", "--state", "Ru") == ["Running"]
    assert _complete("-o", "js") == ["json", "jsonpath="]
    assert _complete("completion", "") == ["bash", "fish", "zsh"]
    assert "release-pod" in _complete("admin", "")


def test_completion_of_an_older_bash_script() -> None:
    """A bash script printed by dispatch 0.1.0 (typer's, which sets _DISPATCH_COMPLETE) still completes."""
    env = {"_DISPATCH_COMPLETE": "complete_bash", "COMP_WORDS": "dispatch status --st", "COMP_CWORD": "2"}
    proc = subprocess.run([sys.executable, "-c", "from dispatch.cli import main; main()"],
                          env={**_env(), **env}, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.split() == ["--state"], proc


def test_completion_in_bash_itself(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bash") is None:
        pytest.fail("bash is needed to test the bash completion script")
    launcher = tmp_path / "dispatch"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} -c "from dispatch.cli import main; main()" "$@"\n')
    launcher.chmod(0o755)
    script = ('source <(dispatch completion bash); COMP_WORDS=(dispatch status --st); COMP_CWORD=2; '
              '_dispatch_completion dispatch; printf "%s\\n" "${COMPREPLY[@]}"')
    proc = subprocess.run(["bash", "-c", script], env={**_env(), "PATH": f"{tmp_path}:{_env()['PATH']}"},
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["--state"]


def test_kubectl_plugin_completion() -> None:
    from dispatch.cli._completion import candidates

    assert candidates(["sta"])[0] == ["status"]
    assert "--output" in candidates(["status", "--out"])[0]
    proc = subprocess.run([sys.executable, "-c", "from dispatch.cli import kubectl_complete_main as m; m()",
                           "status", "--state", "Ru"], capture_output=True, text=True, check=False, env=_env())
    assert proc.stdout == "Running\n:4\n"  # kubectl's plugin completion format: candidates, then a directive


def test_python_dash_m_dispatch() -> None:
    version = subprocess.run([sys.executable, "-m", "dispatch", "--version"], capture_output=True, text=True,
                             check=False, env=_env())
    assert version.returncode == 0 and version.stdout.startswith("dispatch ")
    usage = subprocess.run([sys.executable, "-m", "dispatch", "status", "--help"], capture_output=True, text=True,
                           check=False, env=_env())
    assert usage.returncode == 0 and "Usage: python -m dispatch status" in usage.stdout


def test_kubectl_plugin_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-dispatch"] == "dispatch.cli:kubectl_main"  # `kubectl dispatch` finds it on PATH
    assert scripts["kubectl_complete-dispatch"] == "dispatch.cli:kubectl_complete_main"
    import importlib

    for target in scripts.values():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr))
    proc = subprocess.run([sys.executable, "-c", "from dispatch.cli import kubectl_main; kubectl_main()",
                           "status", "--help"], capture_output=True, text=True, check=False, env=_env())
    assert proc.returncode == 0 and "Usage: kubectl dispatch status" in proc.stdout


# -------------------------------------------------------------------------------- servers that do not answer


def _kubeconfig(tmp_path: Path, server: str, context: str = "lab") -> Path:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP server that accepts connections and never answers (a hung API server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join()
    for s in accepted:
        s.close()
    listener.close()


def test_request_timeout_ends_a_hung_server_naming_it(tmp_path: Path,
                                                      silent_server: tuple[str, list[socket.socket]]) -> None:
    url, accepted = silent_server
    config = _kubeconfig(tmp_path, url)
    result = CliRunner().invoke(app, ["--kubeconfig", str(config), "--request-timeout", "1s", "status", "x"],
                                env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_RETRY, result.output
    err = " ".join(result.stderr.split())
    assert f"the API server at {url}" in err and "context lab" in err
    assert "did not answer GET /apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/x within the " \
           "request timeout of 1s" in err
    assert accepted  # it was really asked


def test_a_silent_server_without_request_timeout_still_names_the_cause(
        tmp_path: Path, silent_server: tuple[str, list[socket.socket]]) -> None:
    """The per-attempt timeout's error used to have an empty text; now it names what ran out."""
    from dispatch import _kube as k
    from dispatch.errors import Unreachable

    url, _ = silent_server
    kube = k.Kube.connect(kubeconfig=_kubeconfig(tmp_path, url), timeout=0.3)
    kube.retries = 1
    import asyncio

    with pytest.raises(Unreachable) as err:
        asyncio.run(kube.get(k.PODS, "p"))
    assert err.value.reason == "Timeout"
    assert f"at {url}" in str(err.value)
    assert "ConnectTimeout (no answer in time)" in str(err.value) or "ReadTimeout" in str(err.value)


def test_an_unreachable_server_is_named_with_its_context(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    config = _kubeconfig(tmp_path, f"https://127.0.0.1:{port}", context="prod-eu")
    result = CliRunner().invoke(app, ["--kubeconfig", str(config), "status", "x"], env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_RETRY, result.output
    err = " ".join(result.stderr.split())
    assert f"cannot reach the API server at https://127.0.0.1:{port}" in err
    assert "context prod-eu" in err and "is the cluster running?" in err


@pytest.mark.parametrize("value", ["abc", "-1s", "5d", "1e9", "nan", "9999h"])
def test_a_bad_request_timeout_is_a_usage_error(cli: Cli, value: str) -> None:
    result = cli("--request-timeout", value, "status")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--request-timeout" in result.stderr
    assert cli.connected == []


def test_request_timeout_reaches_the_adapter(cli: Cli) -> None:
    assert cli("--request-timeout", "1m30s", "status").exit_code == 0
    assert cli("--request-timeout", "0", "status").exit_code == 0
    assert [s.request_timeout for s in cli.connected] == [90.0, None]


def test_an_exec_plugins_whole_stderr_is_shown(tmp_path: Path) -> None:
    plugin = tmp_path / "login"
    plugin.write_text(f"#!{sys.executable}\nimport sys\n"
                      "print('error: your session expired', file=sys.stderr)\n"
                      "print('to log in again run:', file=sys.stderr)\n"
                      "print('    cloud auth login --cluster lab', file=sys.stderr)\n"
                      "sys.exit(1)\n")
    plugin.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                  "command": str(plugin)}}}],
        "contexts": [{"name": "lab", "context": {"cluster": "c", "user": "u"}}],
    }))
    result = CliRunner().invoke(app, ["--kubeconfig", str(config), "status", "x"], env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_REFUSED, result.output
    for line in ("error: your session expired", "to log in again run:", "cloud auth login --cluster lab"):
        assert line in result.stderr


# -------------------------------------------------------------------------------------------------- logs


def test_logs_options_reach_the_log_api(cli: Cli, running: Callable[[], str]) -> None:
    name = running()
    seen: list[dict[str, str]] = []

    async def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/log"):
            seen.append(dict(request.url.params))
            return httpx2.Response(200, text="2026-01-01T00:00:00Z step 1\n")
        response: httpx2.Response = await cli.cluster.server.handle(request)
        return response

    cli.transport = lambda: httpx2.MockTransport(handle)
    result = cli("logs", name, "--tail", "20", "--since", "5m", "--timestamps", "-c", "node", "--previous")
    assert result.exit_code == 0, result.output
    assert seen[-1] == {"follow": "false", "tailLines": "20", "sinceSeconds": "300", "timestamps": "true",
                        "container": "node", "previous": "true"}
    assert cli("logs", name, "-p").exit_code == 0
    assert seen[-1] == {"follow": "false", "previous": "true"}
    for args, words in ((("--tail", "-2"), "--tail"), (("--since", "0s"), "positive duration"),
                        (("--since", "yesterday"), "not a duration")):
        bad = cli("logs", name, *args)
        assert bad.exit_code == EXIT_USAGE and words in bad.stderr, bad.stderr
    bad_container = cli("logs", name, "-c", "No_Such")
    assert bad_container.exit_code == EXIT_REFUSED and "container" in bad_container.stderr
    assert len(seen) == 2  # refused before any log request


# ---------------------------------------------------------------------------------------------- dry run


def test_open_dry_run_server_writes_nothing(cli: Cli) -> None:
    result = cli("open", "--job-id", "a", "--submission", "s1", "--dry-run=server")
    assert result.exit_code == 0, result.output
    assert "trainjob.trainer.kubeflow.org/a-s1 opened (server dry run; nothing written)" in result.stdout
    shown = yaml.safe_load(cli("open", "--job-id", "a", "--submission", "s1", "--dry-run", "server",
                               "-o", "yaml").stdout)
    assert shown["kind"] == "TrainJob" and shown["metadata"]["labels"][LABEL_JOB_ID] == "a"
    assert shown["spec"]["suspend"] is True
    assert cli.cluster.server.objects("trainer.kubeflow.org", "trainjobs", "default") == []
    assert cli.json("status")["items"] == []
    # nothing claimed either: the real open still works
    assert cli("open", "--job-id", "a", "--submission", "s1").exit_code == 0
    again = cli("open", "--job-id", "a", "--submission", "s1", "--dry-run=server")
    assert again.exit_code == EXIT_REFUSED and "already exists" in again.stderr


def test_open_dry_run_client_and_bad_values(cli: Cli) -> None:
    client = cli("--read-only", "open", "--job-id", "a", "--submission", "s1", "--dry-run=client", "-o", "json")
    assert client.exit_code == 0, client.output
    assert json.loads(client.stdout)["metadata"]["name"] == "a-s1"
    assert cli.cluster.server.objects("trainer.kubeflow.org", "trainjobs", "default") == []
    refused = cli("--read-only", "open", "--job-id", "a", "--submission", "s1", "--dry-run=server")
    assert refused.exit_code == EXIT_REFUSED and "read-only" in refused.stderr
    bad = cli("open", "--job-id", "a", "--submission", "s1", "--dry-run=yes")
    assert bad.exit_code == EXIT_USAGE and "none, client or server" in bad.stderr
    invalid = cli("open", "--job-id", "a", "--submission", "bad/sub", "--dry-run=server")
    assert invalid.exit_code == EXIT_REFUSED and "submission" in invalid.stderr
