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
from typing import Annotated, Any, NamedTuple

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from .._overrides import ConfigOverrides
from ._codes import EXIT_CODES_HELP
from ._common import OUTPUT_HELP, NoHeadersOpt, _format, _set_format
from ._state import CliState, Settings
from ._timing import parse_duration

HELP = f"""Run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Each command is one call of the dispatch library. Objects are TrainJobs named <job-id>-<submission>
unless --name says otherwise. kubectl's client flags (--context, --as, --request-timeout, ...) may come
before or after the command.

{EXIT_CODES_HELP}
"""


class Entry(NamedTuple):
    """Where a command lives, and the first paragraph of its help (what ``dispatch --help`` lists without
    loading it; a test holds it equal to the command's own)."""

    module: str
    attr: str
    help: str
    group: bool = False
    starts: bool = False
    """It starts something (an execution, a controller, a testbed): never offered for a mistyped verb."""


COMMANDS: dict[str, Entry] = {
    "open": Entry("_open", "commands", "Create a TrainJob for one submission, held unless --no-hold.", starts=True),
    "release": Entry("_commands", "commands", "Admit a held object if no pod of it may still run (A rises by one); "
                     "else exit 3, nothing written.", starts=True),
    "hold": Entry("_commands", "commands", "Suspend an object (Kueue mode: deactivate its Workload). Its pods then "
                  "start to go."),
    "close": Entry("_commands", "commands", "Delete an object. Lists pods that remain: they still block a "
                   "same-named new object."),
    "status": Entry("_commands", "commands", "Inspect one object, or find many: state, identity with A, age and "
                    "cause."),
    "find": Entry("_commands", "commands", "List objects with their state, identity, A, age and cause (`status` "
                  "without a NAME)."),
    "ceased": Entry("_commands", "commands", "Whether the object's processes are proven gone (writes nothing; "
                    "needs get on Nodes)."),
    "wait": Entry("_commands", "commands", "Wait until the object is in one of the given states; print its "
                  "status."),
    "logs": Entry("_commands", "commands", "Print the trainer logs of one node of the object."),
    "completion": Entry("_commands", "commands", "Print the shell completion script for bash, zsh or fish "
                        "(commands, options, object names, namespaces, contexts)."),
    "controller": Entry("_controller", "commands", "Run the Kueue admission-check controller until SIGTERM or "
                        "Ctrl-C (long-running).", starts=True),
    "demo": Entry("_testbed", "commands", "Walk through the promise on the local testbed (built and started if "
                  "needed).", starts=True),
    "testbed": Entry("_testbed", "testbed_app", "The local real control plane (etcd, kube-apiserver, controllers, "
                     "KWOK nodes) for trying dispatch.", group=True, starts=True),
    "admin": Entry("_admin", "admin_app", "Identity-record and pod-finalizer administration (needs the "
                   "dispatch-admin role).", group=True),
}
"""Every command, in the order ``--help`` lists them."""

ALIASES = {"get": "status"}
"""kubectl's verbs that mean a dispatch command: ``dispatch get NAME`` is ``dispatch status NAME``."""
KUBECTL_VERBS = {
    "describe": "`dispatch status NAME` shows the object's state, cause, A and the pods that remain (-o yaml for "
                "every field); `kubectl describe trainjob NAME` adds its Events",
    "delete": "`dispatch close NAME` deletes the object and lists the pods that remain",
}
"""kubectl's verbs dispatch answers with a usage error naming its own verb (nothing is run)."""


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
    return command


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


GLOBAL_VALUES = frozenset({"--kubeconfig", "--context", "--request-timeout", "--as", "--as-group", "--as-uid",
                           "--token", "--server", "-s", "--cluster", "--user", "--certificate-authority",
                           "--tls-server-name", "-v", "--v"})
"""kubectl's client flags that take a value, taken before or after the command (as kubectl takes them)."""
GLOBAL_FLAGS = frozenset({"--insecure-skip-tls-verify", "--read-only", "--debug"})
"""Global switches, taken anywhere too."""


def hoist(args: list[str]) -> list[str]:
    """``args`` with every global flag (and its value) moved to the front, where the root command reads it:
    ``status x --context y`` is ``--context y status x``. Everything after ``--`` stays where it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        name, eq, value = arg.partition("=")
        if name in GLOBAL_VALUES:
            if eq:
                front += [name, value]  # -v=6 as well as --context=x (click reads no '=' after a short flag)
            else:
                front += args[i:i + 2]
                i += 1
        elif name.startswith("-v") and not name.startswith("--") and name[2:].isdigit():
            front += ["-v", name[2:]]  # -v6
        elif name in GLOBAL_FLAGS:
            if name == "--insecure-skip-tls-verify" and eq:
                if value.lower() not in ("true", "false"):
                    front.append(arg)  # click names the bad value
                elif value.lower() == "true":
                    front.append(name)
            else:
                front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


class DispatchGroup(TyperGroup):
    """The root command: commands loaded on demand, global flags taken anywhere, kubectl's verbs mapped."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = Commands()

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
