"""The ``dispatch`` command: the root (its global options) and its commands, each loaded when asked for.

A command's module is imported only when that command runs, is asked for its help, or is completed: ``dispatch
--help`` lists the commands from ``COMMANDS`` without loading any, and ``dispatch status NAME`` loads the
status command's module and what it uses, never the controller, the testbed or the fence (``tests/cli/
test_cli_start.py`` holds each command's import set). kubectl's client flags are taken anywhere on the line, as
kubectl takes them, and kubectl's verbs are mapped to dispatch's (``get``) or refused naming dispatch's verb
(``describe``, ``delete``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from .._overrides import ConfigOverrides
from ._codes import EXIT_CODES_HELP
from ._coerce import convert_plainly
from ._common import OUTPUT_HELP, NoHeadersOpt, _format
from ._registry import ALIASES, COMMANDS, KUBECTL_VERBS, hoist
from ._state import CliState, Settings
from ._state import set_format as _set_format
from ._timing import parse_duration

HELP = f"""Run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Each command is one call of the dispatch library. Objects are TrainJobs named <job-id>-<submission>
unless --name says otherwise. kubectl's client flags (--context, --as, --request-timeout, ...) may come
before or after the command.

{EXIT_CODES_HELP}
"""


def load(name: str) -> Any:
    """The click command ``name`` (a command or a group), built from its module on first use."""
    entry = COMMANDS[name]
    module = importlib.import_module(f".{entry.module}", __package__)
    found: Any = getattr(module, entry.attr)
    if entry.group:
        command: Any = typer.main.get_command(found)
    else:
        [info] = [i for i in found.registered_commands
                  if (i.name or i.callback.__name__.lower().replace("_", "-")) == name]
        one = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False)
        one.registered_commands.append(info)
        command = typer.main.get_command(one)
    command.name = name
    return convert_plainly(command)


class Commands(MutableMapping[str, Any]):
    """The root group's commands, each built when first looked up (``list(commands)`` builds none)."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = load(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._built]))

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._built))


class DispatchGroup(TyperGroup):
    """The root command: commands loaded on demand, global flags taken anywhere, kubectl's verbs mapped."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = Commands()
        convert_plainly(self, subcommands=False)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist(args))

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        name = ALIASES.get(cmd_name, cmd_name)
        return self.commands[name] if name in COMMANDS or name in self.commands else None

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """A known command; else a usage error that names dispatch's verb for a kubectl verb, and suggests only
        a command that starts nothing (``delete`` once drew "Did you mean 'release'?", which admits)."""
        name = args[0]
        command = self.get_command(ctx, name)
        if command is not None:
            return name, command, args[1:]
        if ctx.resilient_parsing:
            return None, None, args[1:]
        if name.startswith("-"):
            self.parse_args(ctx, args)  # an unknown option: click's own "No such option"
        if name in KUBECTL_VERBS:
            ctx.fail(f"dispatch has no {name!r} command: {KUBECTL_VERBS[name]}.")
        safe = [n for n, e in COMMANDS.items() if not e.starts] + list(ALIASES)
        matches = difflib.get_close_matches(name, safe)
        ctx.fail(f"No such command {name!r}." + (f" Did you mean {', '.join(repr(m) for m in matches)}?"
                                                   if matches else ""))
        raise AssertionError("ctx.fail raises a usage error")

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The command list from ``COMMANDS`` (the help line each would give), loading none of them."""
        rows = [(name, e.help) for name, e in COMMANDS.items()]
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        short = [(name, TyperCommand(name=name, help=text).get_short_help_str(limit)) for name, text in rows]
        with formatter.section("Commands"):
            formatter.write_dl(short)


app = typer.Typer(
    name="dispatch",
    cls=DispatchGroup,
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dispatch {__version__}")
        raise typer.Exit()


def _request_timeout(value: str) -> str:
    try:
        parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


@app.callback()
def root(
    ctx: typer.Context,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            help="Kubeconfig file (default: the KUBECONFIG list, merged as kubectl merges it; then "
            "~/.kube/config; then in-cluster).",
        ),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="Kubeconfig context to use.")] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            envvar="DISPATCH_NAMESPACE",
            show_envvar=True,
            help="Namespace (default: the context's, else 'default').",
        ),
    ] = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Refuse every write (status, ceased, wait and logs still work).")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    output: Annotated[
        str, typer.Option("--output", "-o", metavar="FORMAT", callback=_format, help=OUTPUT_HELP)
    ] = "table",
    no_headers: NoHeadersOpt = False,
    request_timeout: Annotated[
        str,
        typer.Option(
            "--request-timeout", metavar="DURATION", callback=_request_timeout,
            help="How long one request to the API server may take, retries included: a number of seconds or "
            "a duration (5s, 2m, 1h); 0 waits as long as the library's own bounds. With --watch it also ends "
            "the watch. As kubectl's.",
        ),
    ] = "0",
    cluster: Annotated[str | None, typer.Option(
        "--cluster", metavar="NAME", help="The kubeconfig cluster to use (instead of the context's).")] = None,
    user: Annotated[str | None, typer.Option(
        "--user", metavar="NAME", help="The kubeconfig user to use (instead of the context's).")] = None,
    server: Annotated[str | None, typer.Option(
        "--server", "-s", metavar="URL", help="The API server's address (instead of the cluster's).")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", metavar="TOKEN", help="Bearer token for the API server (instead of the user's credentials).")
    ] = None,
    certificate_authority: Annotated[str | None, typer.Option(
        "--certificate-authority", metavar="FILE", help="A CA certificate file to check the server with.")] = None,
    insecure_skip_tls_verify: Annotated[bool, typer.Option(
        "--insecure-skip-tls-verify", help="Do not check the server's certificate (insecure, as kubectl's).")
    ] = False,
    tls_server_name: Annotated[str | None, typer.Option(
        "--tls-server-name", metavar="NAME",
        help="The name to check the server's certificate against (and to send as SNI).")] = None,
    impersonate: Annotated[str | None, typer.Option(
        "--as", metavar="USER", help="Act as this user (impersonation: Impersonate-User), as kubectl's --as.")
    ] = None,
    impersonate_group: Annotated[list[str] | None, typer.Option(
        "--as-group", metavar="GROUP", help="Act as a member of this group (repeatable; needs --as).")] = None,
    impersonate_uid: Annotated[str | None, typer.Option(
        "--as-uid", metavar="UID", help="Act with this UID (needs --as).")] = None,
    verbosity: Annotated[int, typer.Option(
        "-v", "--v", metavar="LEVEL", min=0,
        help="Log level, as kubectl's -v: 6 or more prints each request, its status and its time to stderr.")
    ] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    state = ctx.obj if isinstance(ctx.obj, CliState) else CliState()
    ctx.obj = state
    overrides = ConfigOverrides(
        cluster=cluster, user=user, server=server, token=token, certificate_authority=certificate_authority,
        insecure_skip_tls_verify=insecure_skip_tls_verify, tls_server_name=tls_server_name,
        impersonate=impersonate, impersonate_groups=tuple(impersonate_group or ()), impersonate_uid=impersonate_uid,
    )
    state.settings = Settings(
        kubeconfig=kubeconfig,
        context=context,
        namespace=namespace,
        read_only=read_only,
        debug=debug,
        no_headers=no_headers,
        request_timeout=parse_duration(request_timeout) or None,
        overrides=None if overrides == ConfigOverrides() else overrides,
        verbosity=verbosity,
    )
    _set_format(state.settings, output)
    ctx.call_on_close(state.shutdown)
