"""Every code block of README.md and docs/**/*.md is run, or checked as far as it can be without a cluster.

The conventions a page follows (a marker is an HTML comment on its own, right before the block):

* ```` ```python ```` blocks **run**, each in a fresh fake cluster: the scenario ``fake`` unless
  ``<!-- example: SCENARIO -->`` names another (``tests/docs/scenarios.py``). ``Adapter.connect`` and
  ``AsyncAdapter.connect`` without ``transport=`` reach that cluster (kubeconfig and context are
  ignored), every API request moves its clock one second and steps its controllers, and ``time.sleep``
  moves the clock instead of waiting. After the block, the cluster's overlap checker must pass.
* Both run as a user, never as the cluster's admin: with the shipped roles ``dispatch-writer`` and
  ``dispatch-node-reader`` (``--read-only``, ``read_only=True``: ``dispatch-reader`` and
  ``dispatch-node-reader``; ``dispatch admin ...``: ``dispatch-admin`` alone), and a block fails if any
  request of it was refused, even one the command got over. A Python block that passes its own
  ``transport=`` keeps it.
* ```` ```console ```` blocks **run**: each ``$ dispatch ...`` line is the real command, against the
  scenario's cluster (one cluster per block, not stepped: it stays in the state the page describes).
  The lines up to the next ``$`` are its expected output, compared by doctest's rules (``...`` matches
  anything; runs of whitespace compare equal). A last line ``[exit status N]`` expects that exit code;
  otherwise it must be 0. A ``$ kubectl patch trainjob NAME --type merge -p BODY`` line is the write
  anyone with patch on TrainJobs can type, played against the deployed guard: the patched TrainJob goes
  to the real guard (``dispatch.controller._guard.Guard``, reading with the controller's shipped role),
  and a denial prints what kubectl prints for it (exit 1); an allowed patch is applied.
* ``<!-- example: cluster REASON -->`` and ``<!-- example: testbed REASON -->`` mark a block that needs a
  real cluster (or the local testbed). Nothing runs, but Python in it (also a ``python - <<'PY'``
  heredoc) must compile and may use only public names of ``dispatch``, ``dispatch.errors`` and
  ``dispatch.testing``, and every ``dispatch ...`` command line in it must parse with the real CLI
  (the command and every option exist). ``A|B`` in a command line stands for alternatives; each is parsed.
* ``<!-- example: shown REASON -->`` marks a block that is shown only (output, manifests, other tools).
  YAML in it must still parse.

Any block that is neither Python nor a console session must carry one of these markers with a reason.
"""

from __future__ import annotations

import ast
import asyncio
import doctest
import functools
import importlib
import json
import re
import shlex
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from markdown_it import MarkdownIt
from typer.testing import CliRunner

import dispatch
from dispatch import Adapter, AsyncAdapter
from dispatch import _api as api
from dispatch import _kube as k
from dispatch.cli import CliState, Settings, app
from dispatch.controller._guard import Guard
from dispatch.testing import FakeCluster

from .scenarios import ENVIRONMENTS, SCENARIOS, STEPPING

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", ROOT / "README-pypi.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!--\s*example:\s*(?P<mode>[\w-]+)\s*(?P<reason>.*?)\s*-->\s*$", re.S)
NEEDS_REASON = {"cluster", "testbed", "shown"}
PUBLIC = {"dispatch": dispatch.__all__, "dispatch.errors": dispatch.errors.__all__,
          "dispatch.testing": importlib.import_module("dispatch.testing").__all__,
          "dispatch.controller.testing": importlib.import_module("dispatch.controller.testing").__all__}
EXIT_LINE = re.compile(r"^\[exit status (\d+)\]$")
HEREDOC = re.compile(r"python3? - <<'?(\w+)'?\n(.*?)\n\s*\1\s*$", re.S | re.M)
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    mode: str | None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> Iterator[Block]:
    """Fenced and indented code blocks, each with the marker right before it (if any)."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    for i, tok in enumerate(tokens):
        if tok.type not in ("fence", "code_block"):
            continue
        mode, reason = None, ""
        prev = tokens[i - 1] if i else None
        if prev is not None and prev.type == "html_block":
            found = MARKER.match(prev.content.strip())
            if found:
                mode, reason = found["mode"], found["reason"]
        lang = tok.info.split()[0] if tok.type == "fence" and tok.info.strip() else ""
        line = (tok.map[0] + 1) if tok.map else 0
        yield Block(path, line, lang, tok.content, mode, reason)


ALL = [b for src in SOURCES for b in blocks(src)]


def test_the_sources_have_blocks() -> None:
    """The collection itself works: README and the docs have examples of every kind."""
    kinds = {(b.path.name == "README.md", b.lang) for b in ALL}
    assert (True, "python") in kinds
    assert (False, "python") in kinds
    assert (False, "console") in kinds
    assert len(ALL) > 20


# ------------------------------------------------------------------------------------------ names


def check_names(code: str, where: str) -> None:
    """Only public names of dispatch's public modules; every one must exist."""
    tree = ast.parse(code, filename=where)
    imported_dispatch = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dispatch":
            assert node.module in PUBLIC, f"{where}: imports from non-public module {node.module}"
            for alias in node.names:
                assert alias.name in PUBLIC[node.module], f"{where}: {node.module} has no public {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dispatch":
                    assert alias.name in PUBLIC, f"{where}: imports non-public module {alias.name}"
                    imported_dispatch = imported_dispatch or (alias.name == "dispatch" and alias.asname is None)
    if imported_dispatch:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "dispatch" and node.attr not in ("errors", "testing")):
                assert node.attr in PUBLIC["dispatch"], f"{where}: dispatch has no public {node.attr}"


# ------------------------------------------------------------------------------------------ commands


def command_lines(text: str) -> Iterator[str]:
    """Each ``dispatch ...`` command of a shell block: continuations joined, a ``$ `` prompt dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        if line.startswith("dispatch ") or line == "dispatch":
            yield line


def alternatives(line: str) -> list[list[str]]:
    """``dispatch testbed up|down|freeze NODE`` stands for three commands; a line without ``|`` for one."""
    words = shlex.split(line, comments=True)
    for i, word in enumerate(words):
        if "|" in word:
            rest = " ".join(words[i:])
            return [words[1:i] + alt.split() for alt in rest.split("|")]
    return [words[1:]]


@functools.cache
def root_command() -> Any:
    """The click command typer builds from the app (typer's own copy of click: typed loosely)."""
    return typer.main.get_command(app)


def parse_command(argv: list[str], where: str) -> list[str]:
    """Resolve the command path and parse every option with the real parser; nothing is invoked.

    Returns the command path (``["admin", "release-pod"]``). A group is whatever has ``resolve_command``.
    """
    cmd = root_command()
    ctx = cmd.make_context("dispatch", list(argv))
    path: list[str] = []
    while hasattr(cmd, "resolve_command"):
        rest = [*ctx._protected_args, *ctx.args]
        assert rest, f"{where}: `dispatch {' '.join(argv)}` names no command"
        name, sub, args = cmd.resolve_command(ctx, rest)
        assert name is not None and sub is not None, f"{where}: no command in `dispatch {' '.join(argv)}`"
        path.append(name)
        cmd = sub
        ctx = sub.make_context(name, args, parent=ctx)
    return path


def check_commands(text: str, where: str) -> int:
    count = 0
    for line in command_lines(text):
        for argv in alternatives(line):
            try:
                parse_command(argv, where)
            except Exception as exc:
                if not hasattr(exc, "format_message"):  # a usage error of the parser, not a bug here
                    raise
                raise AssertionError(
                    f"{where}: `dispatch {' '.join(argv)}` does not parse: {exc.format_message()}"
                ) from None
            count += 1
    return count


# ------------------------------------------------------------------------------------------ running


WRITER = ("dispatch-writer", "dispatch-node-reader")
"""What a user of the pages holds (as every library test does): the shipped writer's roles."""
READER = ("dispatch-reader", "dispatch-node-reader")
"""What ``--read-only`` stands for: a user holding the shipped reader's roles."""
ADMIN = ("dispatch-admin",)
"""What ``dispatch admin ...`` runs with: the shipped admin role alone, the one its help asks for."""


class Environment:
    """A scenario's cluster as the default target of ``connect``, stepped by requests and sleeps."""

    def __init__(self, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, **step: bool) -> None:
        self.cluster = cluster
        self.step = step
        original = AsyncAdapter.connect.__func__  # type: ignore[attr-defined]

        def connect(cls: type[AsyncAdapter], /, namespace: str | None = None, *, transport: Any = None,
                    **kwargs: Any) -> AsyncAdapter:
            if transport is None:  # a user's shipped roles, as the CLI's examples run with
                transport = cluster.transport(roles=READER if kwargs.get("read_only") else WRITER)
                kwargs.pop("kubeconfig", None)
                kwargs.pop("context", None)
            result: AsyncAdapter = original(cls, namespace, transport=transport, **kwargs)
            return result

        monkeypatch.setattr(AsyncAdapter, "connect", classmethod(connect))
        monkeypatch.setattr(time, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.cluster.advance(seconds)
        self.cluster.step(**self.step)

    def step_on_requests(self) -> None:
        def hook(method: str, path: str) -> None:
            self.cluster.advance(1)
            self.cluster.step(**self.step)

        self.cluster.server.before_request = hook


def scenario(block: Block, default: str = "fake") -> FakeCluster:
    name = block.mode or default
    assert name in SCENARIOS, f"{block.where}: unknown example scenario {name!r} (known: {', '.join(SCENARIOS)})"
    return SCENARIOS[name]()


def run_python(block: Block, monkeypatch: pytest.MonkeyPatch, workdir: Path) -> None:
    check_names(block.code, block.where)
    cluster = scenario(block)
    inside = ENVIRONMENTS.get(block.mode or "")
    if inside is not None:
        for key, value in inside(cluster, workdir).items():
            monkeypatch.setenv(key, value)
    env = Environment(cluster, monkeypatch, **STEPPING.get(block.mode or "", {}))
    env.step_on_requests()
    code = compile(block.code, block.where, "exec")
    exec(code, {"__name__": "__doc_example__"})
    cluster.server.before_request = None
    assert not cluster.server.denied, f"{block.where}: the shipped roles refused {cluster.server.denied}"
    cluster.history.check()


def roles_of(argv: list[str], read_only: bool) -> tuple[str, ...]:
    """The shipped roles a command of a page runs with: the admin's for ``dispatch admin``, else a user's."""
    if parse_command(argv, "roles")[:1] == ["admin"]:
        return ADMIN
    return READER if read_only else WRITER


def cli_runner(cluster: FakeCluster) -> Callable[[list[str]], tuple[int, str]]:
    def run(argv: list[str]) -> tuple[int, str]:
        def connect(settings: Settings) -> Adapter:
            roles = roles_of(argv, settings.read_only)
            return Adapter.connect(settings.namespace, transport=cluster.transport(roles=roles),
                                   read_only=settings.read_only)

        result = CliRunner().invoke(app, argv, obj=CliState(connect=connect), catch_exceptions=False,
                                    env={"COLUMNS": "400", "KUBECONFIG": None, "DISPATCH_NAMESPACE": None})
        return result.exit_code, result.output

    return run


def sessions(code: str, where: str) -> Iterator[tuple[str, str, int]]:
    """``(command, expected output, expected exit code)`` for each ``$`` line of a console block."""
    command: str | None = None
    expected: list[str] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, *_expected(expected)
            command, expected = line[2:], []
        else:
            assert command is not None, f"{where}: output before the first `$` line"
            expected.append(line)
    if command is not None:
        yield command, *_expected(expected)


def _expected(lines: list[str]) -> tuple[str, int]:
    code = 0
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if lines and (m := EXIT_LINE.match(lines[-1].strip())):
        code, lines = int(m[1]), lines[:-1]
    return "\n".join(lines) + "\n", code


GUARD_DENIED = 'Error from server (Forbidden): admission webhook "guard.dispatch.phpboyscout.uk" denied the request: '
"""How kubectl prints the guard's denial, as seen on the testbed (tests/controller/test_guard_testbed.py)."""


def merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied to ``target``."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def kubectl_patch(cluster: FakeCluster, argv: list[str], where: str) -> tuple[int, str]:
    """``kubectl [-n NS] patch trainjob NAME --type merge -p BODY`` through the guard the cluster would run."""
    namespace, args = cluster.namespace, list(argv)
    if args[:1] == ["-n"]:
        namespace, args = args[1], args[2:]
    shape = len(args) == 7 and args[:2] == ["patch", "trainjob"] and args[3:6] == ["--type", "merge", "-p"]
    assert shape, f"{where}: only `kubectl [-n NS] patch trainjob NAME --type merge -p BODY` is played: {argv}"
    name, body = args[2], json.loads(args[6])
    meta = body.get("metadata") or {}
    touched = [key for part in ("labels", "annotations") for key in (meta.get(part) or {})
               if key.startswith("dispatch.phpboyscout.uk/")]
    assert not touched, (f"{where}: a patch of {touched} meets the CEL policy dispatch-identity before the guard; "
                         "only the guard is played")
    old = cluster.server.get("trainer.kubeflow.org", "trainjobs", namespace, name)
    if old is None:
        return 1, f'Error from server (NotFound): trainjobs.trainer.kubeflow.org "{name}" not found\n'
    new = merged(old, body)
    request = {"uid": "docs", "operation": "UPDATE", "namespace": namespace, "name": name,
               "object": new, "oldObject": old, "userInfo": {"username": "someone"}}

    async def review() -> str | None:
        kube = k.Kube.connect(namespace=namespace, transport=cluster.transport(role="dispatch-controller"))
        try:
            denial = await Guard(kube).decide(request)
            if denial is None:
                await k.Kube.connect(namespace=namespace, transport=cluster.transport()).merge_patch(
                    api.TRAINJOBS, name, body)
            return denial
        finally:
            await kube.aclose()

    denial = asyncio.run(review())
    if denial is not None:
        return 1, GUARD_DENIED + denial + "\n"
    return 0, f"trainjob.trainer.kubeflow.org/{name} patched\n"


def run_console(block: Block) -> None:
    cluster = scenario(block)
    run = cli_runner(cluster)
    ran = 0
    for command, want, want_code in sessions(block.code, block.where):
        words = shlex.split(command)
        if words[0] == "kubectl":
            code, got = kubectl_patch(cluster, words[1:], block.where)
        else:
            assert words[0] == "dispatch", f"{block.where}: `{command}` is not a dispatch command; mark the block"
            code, got = run(words[1:])
        assert code == want_code, f"{block.where}: `{command}` exited {code}, not {want_code}:\n{got}"
        if not CHECKER.check_output(want, got, FLAGS):
            raise AssertionError(f"{block.where}: `{command}` printed:\n{got}\nbut the page shows:\n{want}")
        ran += 1
    assert ran, f"{block.where}: a console block without a `$ dispatch` line"
    # A refusal the command tolerated (a node it could not read, say) would change what it prints.
    assert not cluster.server.denied, f"{block.where}: the shipped roles refused {cluster.server.denied}"
    cluster.history.check()


def check_offline(block: Block) -> None:
    assert block.reason, f"{block.where}: `<!-- example: {block.mode} -->` needs a reason after the mode"
    if block.lang == "python":
        compile(block.code, block.where, "exec")
        check_names(block.code, block.where)
    for match in HEREDOC.finditer(block.code):
        body = textwrap.dedent(match[2])
        compile(body, block.where, "exec")
        check_names(body, block.where)
    if block.mode != "shown":
        check_commands(block.code, block.where)
    if block.lang == "yaml":
        list(yaml.safe_load_all(block.code))


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_example(block: Block, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if block.mode in NEEDS_REASON:
        check_offline(block)
    elif block.lang == "python":
        run_python(block, monkeypatch, tmp_path)
    elif block.lang == "console":
        run_console(block)
    else:
        raise AssertionError(
            f"{block.where}: a {block.lang or 'indented'} block that does not run needs "
            "`<!-- example: cluster|testbed|shown REASON -->` before it"
        )


# ------------------------------------------------------------------------------------------ the checker


def test_command_parsing_refuses_unknown_options_and_commands() -> None:
    """The offline check is a real check: a typo in an option or a command fails it."""
    assert check_commands("dispatch release llama-s1 --wait --timeout 300\n", "t") == 1
    assert check_commands("dispatch testbed up|down|freeze NODE\n", "t") == 3
    with pytest.raises(AssertionError, match="does not parse"):
        check_commands("dispatch release llama-s1 --wiat\n", "t")
    with pytest.raises(AssertionError, match="does not parse"):
        check_commands("dispatch relaese llama-s1\n", "t")


def test_name_check_refuses_private_and_missing_names() -> None:
    check_names("from dispatch import Adapter, PodsRemain\n", "t")
    with pytest.raises(AssertionError, match="non-public module"):
        check_names("from dispatch._decision import decide\n", "t")
    with pytest.raises(AssertionError, match="no public Adaptor"):
        check_names("from dispatch import Adaptor\n", "t")
    with pytest.raises(AssertionError, match="no public release"):
        check_names("import dispatch\ndispatch.release('x')\n", "t")


def test_console_output_is_compared() -> None:
    """A page showing output the command does not print fails."""
    block = Block(ROOT / "docs" / "x.md", 1, "console", "$ dispatch status llama-s1\nnothing like this\n",
                  "running", "")
    with pytest.raises(AssertionError, match="but the page shows"):
        run_console(block)


def test_python_in_a_heredoc_is_checked() -> None:
    code = "python - <<'PY'\nfrom dispatch import Adaptor\nPY\n"
    with pytest.raises(AssertionError, match="no public Adaptor"):
        check_offline(Block(ROOT / "README.md", 1, "", code, "testbed", "needs a cluster"))
    with pytest.raises(AssertionError, match="needs a reason"):
        check_offline(Block(ROOT / "README.md", 1, "", "dispatch status\n", "cluster", ""))


def test_examples_run_with_the_shipped_roles_of_their_user() -> None:
    assert roles_of(["open", "--job-id", "llama", "--submission", "s1"], False) == WRITER
    assert roles_of(["--read-only", "status", "llama-s1"], True) == READER
    assert roles_of(["-n", "team-a", "admin", "release-pod", "p", "--node-confirmed-down"], False) == ADMIN
    # a writer may not migrate identity records: the page's admin command needs the admin's role
    block = Block(ROOT / "docs" / "x.md", 1, "console", "$ dispatch admin migrate -n default\n"
                  "identity records: 2 created, 0 raised\n", "legacy-ledger", "")
    run_console(block)
    cluster = SCENARIOS["legacy-ledger"]()
    code, out = cli_runner(cluster)(["status", "--job-id", "llama"])
    assert code == 0 and not cluster.server.denied, out
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as writer, \
            pytest.raises(dispatch.errors.Forbidden):
        writer.migrate()


def test_a_kubectl_patch_is_answered_by_the_guard() -> None:
    """The played ``kubectl patch`` is a real check: the guard's own answer, or the patch applied."""
    start = ["patch", "trainjob", "llama-s1", "--type", "merge", "-p", '{"spec":{"suspend":false}}']
    cluster = SCENARIOS["held-terminating"]()
    code, out = kubectl_patch(cluster, start, "t")
    assert code == 1 and out.startswith(GUARD_DENIED + "trainjob llama-s1 cannot start: remaining pods: "), out
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "llama-s1")
    assert tj is not None and tj["spec"]["suspend"] is True
    note = ["patch", "trainjob", "llama-s1", "--type", "merge", "-p", '{"metadata":{"annotations":{"team":"a"}}}']
    assert kubectl_patch(cluster, note, "t") == (0, "trainjob.trainer.kubeflow.org/llama-s1 patched\n")
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "llama-s1")
    assert tj is not None and tj["metadata"]["annotations"]["team"] == "a"
    lower = ["patch", "trainjob", "llama-s1", "--type", "merge", "-p",
             '{"metadata":{"annotations":{"dispatch.phpboyscout.uk/admission":"0"}}}']
    with pytest.raises(AssertionError, match="dispatch-identity"):
        kubectl_patch(cluster, lower, "t")

