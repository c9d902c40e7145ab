"""The commands on one object or many: release, hold, close, status, find, ceased, wait, logs, and completion.

Loaded only when one of them is asked for (see ``_app``); what only one command needs is imported inside it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .._records import State, Status
from ._codes import CEASED_EXIT_CODES_HELP, EXIT_CODES_HELP, EXIT_NOT_CEASED
from ._common import NameArg, NamespaceOpt, NoHeadersOpt, OutputOpt, _state
from ._errors import escape, guard
from ._output import (
    emit,
    identity_dict,
    pod_dict,
    pods_grid,
    print_cessation,
    print_status,
    print_statuses,
    show,
    status_grid,
    trainjob_names,
    wide,
)
from ._state import CliState, Output
from ._timing import INTERVAL, TIMEOUT, parse_duration

commands = typer.Typer(rich_markup_mode=None, add_completion=False)
"""This module's commands (the root command loads the module when one of them is asked for)."""

# --------------------------------------------------------------------------------------------- release


@commands.command(epilog=EXIT_CODES_HELP)
def release(
    ctx: typer.Context,
    name: NameArg,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Retry while pods of the previous execution remain (or the API is "
            "unreachable), showing them live, until admitted or --timeout.",
        ),
    ] = False,
    timeout: Annotated[float, TIMEOUT.option("--timeout", "With --wait: give up after seconds")] = 600.0,
    interval: Annotated[float, INTERVAL.option("--interval", "With --wait: seconds between attempts")] = 2.0,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Admit a held object if no pod of it may still run (A rises by one); else exit 3, nothing written.

    Releasing an admitted object prints its identity again (safe to retry). Ctrl-C never leaves a
    release half-written: an attempt in flight finishes first.
    """
    from ._release import release_once, release_wait  # rich's live view: only release loads it

    state = _state(ctx, output, namespace)
    with guard(state):
        adapter = state.adapter()
        if wait:
            identity = release_wait(state, adapter, name, timeout=timeout, interval=interval)
        else:
            identity = release_once(adapter, name)
    emit(
        state,
        {"name": name, "admitted": True, "identity": identity_dict(identity)},
        lambda: state.out.print(f"admitted {escape(name)}: execution {escape(str(identity))} (A={identity.admission})"),
        names=trainjob_names(name),
    )


# ------------------------------------------------------------------------------------------ hold/close


@commands.command(epilog=EXIT_CODES_HELP)
def hold(ctx: typer.Context, name: NameArg, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Suspend an object (Kueue mode: deactivate its Workload). Its pods then start to go."""
    state = _state(ctx, output, namespace)
    with guard(state):
        status = state.adapter().hold(name)
    print_status(state, status)


@commands.command(epilog=EXIT_CODES_HELP)
def close(ctx: typer.Context, name: NameArg, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Delete an object. Lists pods that remain: they still block a same-named new object."""
    state = _state(ctx, output, namespace)
    with guard(state):
        remaining = state.adapter().close(name)

    def human() -> None:
        state.out.print(f"closed {escape(name)}")
        if remaining:
            state.out.print("these pods may still run, and block a new object of the same name until they go:")
            show(state, pods_grid(remaining, wide=wide(state)))

    emit(state, {"name": name, "closed": True, "remaining": [pod_dict(p) for p in remaining]}, human,
         names=trainjob_names(name))


# ------------------------------------------------------------------------------------------ status etc.


StateFilterOpt = Annotated[
    list[State] | None,
    typer.Option(
        "--state",
        case_sensitive=False,
        metavar="STATE",
        help="Only objects in this state: Held, Queued, Running, ... (repeatable).",
    ),
]
JobIdOpt = Annotated[str | None, typer.Option("--job-id", help="Only this job.")]
SubmissionOpt = Annotated[str | None, typer.Option("--submission", help="Only this submission.")]
EveryOpt = Annotated[bool, typer.Option("--all", help="Every TrainJob of the namespace, dispatch's or not.")]
AllNamespacesOpt = Annotated[
    bool, typer.Option("--all-namespaces", "-A", help="Objects of every namespace (a NAMESPACE column first).")
]
SelectorOpt = Annotated[
    str | None,
    typer.Option("--selector", "-l", metavar="SELECTOR",
                 help="Only TrainJobs whose labels match this selector (kubectl's: -l team=ml,tier!=low, "
                 "-l 'tier in (gold,silver)')."),
]
WatchOpt = Annotated[
    bool,
    typer.Option("--watch", "-w",
                 help="After the table, print a row whenever an object's status changes (watched, not polled), "
                 "until Ctrl-C or --request-timeout."),
]
STATUS_EPILOG = EXIT_CODES_HELP + (
    "\n\nPiped, tables are kubectl's plain columns, one row per line and nothing wrapped: "
    "`dispatch status --no-headers | awk '{print $1}'` prints the names. -o name prints "
    "trainjob.trainer.kubeflow.org/NAME, for `kubectl describe $(dispatch status -o name)`."
)


@commands.command(epilog=STATUS_EPILOG)
def status(
    ctx: typer.Context,
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="One object to inspect; omit to list (find).")
    ] = None,
    job_id: JobIdOpt = None,
    submission: SubmissionOpt = None,
    every: EveryOpt = False,
    state_filter: StateFilterOpt = None,
    selector: SelectorOpt = None,
    all_namespaces: AllNamespacesOpt = False,
    watch: WatchOpt = False,
    no_headers: NoHeadersOpt = False,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Inspect one object, or find many: state, identity with A, age and cause.

    A not-running object's cause names what keeps it waiting, e.g. remaining pods with their nodes'
    states, or the Kueue admission check.
    """
    state = _state(ctx, output, namespace, no_headers=no_headers)
    if name is not None and (job_id or submission or state_filter or every or selector or all_namespaces):
        raise typer.BadParameter(
            "give a NAME or filters (--job-id, --submission, --state, --all, -l, -A), not both", ctx=ctx,
            param_hint="NAME",
        )
    if name is not None:
        _inspect(state, name, watch=watch)
    else:
        _find(state, Filters(job_id, submission, state_filter or None, every, selector, all_namespaces), watch=watch)


def find(ctx: typer.Context, **options: Any) -> None:
    """List objects with their state, identity, A, age and cause (`status` without a NAME).

    Costs a constant number of API calls however many objects match (one more per namespace with -A).
    """
    status(ctx, None, **options)


# Its options are status's own but NAME, so `find` and `status` without a NAME cannot drift apart.
_FIND_PARAMETERS = [p for p in inspect.signature(status, eval_str=True).parameters.values() if p.name != "name"]
find.__signature__ = inspect.Signature(_FIND_PARAMETERS)  # type: ignore[attr-defined]
find.__annotations__ = {**{p.name: p.annotation for p in _FIND_PARAMETERS}, "return": None}
commands.command("find", epilog=STATUS_EPILOG)(find)


@dataclasses.dataclass(frozen=True)
class Filters:
    job_id: str | None
    submission: str | None
    states: list[State] | None
    every: bool
    selector: str | None
    all_namespaces: bool

    def find(self, adapter: Any) -> list[Status]:
        found: list[Status] = adapter.find(job_id=self.job_id, submission=self.submission, state=self.states,
                                           unmanaged=self.every, selector=self.selector,
                                           all_namespaces=self.all_namespaces)
        return found


def _inspect(state: CliState, name: str, *, watch: bool) -> None:
    with guard(state):
        adapter = state.adapter()
        one = adapter.inspect(name)
        if not watch:
            print_status(state, one, warnings=True)
            return
        with adapter.follow(name) as following:
            _watch(state, lambda: [adapter.inspect(name)], following.changed, first=[one], namespaces=False)


def _find(state: CliState, filters: Filters, *, watch: bool) -> None:
    with guard(state):
        adapter = state.adapter()
        if not watch:
            many = filters.find(adapter)
        else:
            with adapter.follow_find(job_id=filters.job_id, submission=filters.submission, unmanaged=filters.every,
                                     selector=filters.selector, all_namespaces=filters.all_namespaces) as following:
                _watch(state, lambda: filters.find(adapter), following.changed, first=None,
                       namespaces=filters.all_namespaces)
            return
    print_statuses(state, many, namespaces=filters.all_namespaces)


def _watch(state: CliState, read: Callable[[], list[Status]], changed: Callable[[float], bool], *,
           first: list[Status] | None, namespaces: bool) -> None:
    """kubectl's ``get -w``: the table, then a row for each object whose status changed (each re-read is the
    library's consistent read; the watches only wake it). Ends after ``--request-timeout`` if given."""
    limit = state.settings.request_timeout
    deadline = None if limit is None else time.monotonic() + limit
    shown: dict[tuple[str, str], dict[str, Any]] = {}
    statuses = first if first is not None else read()
    headers = not state.settings.no_headers
    while True:
        fresh = [s for s in statuses if shown.get((s.namespace, s.name)) != _visible(s)]
        if fresh or not shown:
            _watch_rows(state, fresh, namespaces=namespaces, headers=headers)
            headers = False
        for s in statuses:
            shown[(s.namespace, s.name)] = _visible(s)
        if deadline is not None and time.monotonic() >= deadline:
            return
        changed(3600.0 if deadline is None else max(0.0, deadline - time.monotonic()))
        if deadline is not None and time.monotonic() >= deadline:
            return
        statuses = read()


def _visible(s: Status) -> dict[str, Any]:
    data = s.to_dict()
    data.pop("resourceVersion", None)  # a status write alone changes nothing a person sees
    return data


def _watch_rows(state: CliState, statuses: list[Status], *, namespaces: bool, headers: bool) -> None:
    fmt = state.settings.output
    if fmt in (Output.TABLE, Output.WIDE):
        if statuses:
            saved = state.settings.no_headers
            state.settings.no_headers = not headers
            try:
                show(state, status_grid(statuses, wide=fmt is Output.WIDE, namespaces=namespaces))
            finally:
                state.settings.no_headers = saved
        return
    for s in statuses:  # one document per change, as kubectl's -w -o json
        emit(state, s.to_dict(), lambda: None, names=trainjob_names(s.name))


@commands.command(epilog=CEASED_EXIT_CODES_HELP)
def ceased(ctx: typer.Context, name: NameArg, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Whether the object's processes are proven gone (writes nothing; needs get on Nodes).

    True once every remaining pod is finished or sits on a Node tainted node.kubernetes.io/out-of-service
    that no longer reports Ready (a deleted Node proves nothing here: its kubelet may run on). The
    answer is printed and is the exit code, as grep -q's is: 0 ceased, 1 not ceased, so
    `if dispatch ceased NAME; then ...` acts only on a proven end.
    """
    state = _state(ctx, output, namespace)
    with guard(state):
        result = state.adapter().ceased(name)
    print_cessation(state, name, result)
    if not result.ceased:
        raise typer.Exit(EXIT_NOT_CEASED)


@commands.command(epilog=EXIT_CODES_HELP)
def wait(
    ctx: typer.Context,
    name: NameArg,
    for_: Annotated[
        list[State],
        typer.Option(
            "--for",
            case_sensitive=False,
            metavar="STATE",
            help="State to wait for: Held, Queued, Running, Succeeded, Failed or Closing (repeatable: any).",
        ),
    ],
    timeout: Annotated[float, TIMEOUT.option("--timeout", "Give up after seconds, then exit 3")] = 600.0,
    interval: Annotated[float, INTERVAL.option("--interval", "Seconds between polls")] = 1.0,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Wait until the object is in one of the given states; print its status."""
    state = _state(ctx, output, namespace)
    seen: list[tuple[str, str]] = []

    def progress(s: Status) -> None:
        key = (s.state.value, str(s.cause))
        if not seen or seen[-1] != key:
            seen.append(key)
            state.err.print(f"{escape(s.name)}: {s.state.value}: {escape(str(s.cause))}", highlight=False)

    with guard(state):
        final = state.adapter().wait(name, set(for_), timeout=timeout, interval=interval, on_status=progress)
    print_status(state, final)


@commands.command(epilog=EXIT_CODES_HELP)
def logs(
    ctx: typer.Context,
    name: NameArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming new lines.")] = False,
    node: Annotated[
        int, typer.Option("--node", min=0, metavar="INDEX", help="Which node's trainer pod (0-based).")
    ] = 0,
    tail: Annotated[
        int, typer.Option("--tail", min=-1, metavar="LINES",
                          help="Only the last LINES lines (-1, the default: all), as kubectl's.")
    ] = -1,
    since: Annotated[
        str | None, typer.Option("--since", metavar="DURATION", callback=_since,
                                 help="Only lines newer than this: 30s, 5m, 2h (kubectl's --since).")
    ] = None,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", help="Prefix each line with its RFC 3339 timestamp.")
    ] = False,
    container: Annotated[
        str | None, typer.Option("--container", "-c", metavar="NAME",
                                 help="This container of the pod (default: the pod's default container).")
    ] = None,
    previous: Annotated[
        bool, typer.Option("--previous", "-p", help="The previous, ended instance of the container (after a "
                                                     "restart), as kubectl's.")
    ] = False,
    namespace: NamespaceOpt = None,
) -> None:
    """Print the trainer logs of one node of the object."""
    state = _state(ctx, None, namespace)
    since_seconds = None if since is None else max(1, math.ceil(parse_duration(since)))
    with guard(state):
        for line in state.adapter().logs(name, node=node, follow=follow, tail=None if tail < 0 else tail,
                                         since_seconds=since_seconds, timestamps=timestamps, container=container,
                                         previous=previous):
            state.out.file.write(line + "\n")
            state.out.file.flush()


def _since(value: str | None) -> str | None:
    if value is not None:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        if seconds <= 0:
            raise typer.BadParameter(f"must be a positive duration such as 30s or 5m (got {value!r})")
    return value


# ----------------------------------------------------------------------------------------- completion


SHELLS = ("bash", "zsh", "fish")


@commands.command(epilog="Exit codes: 0 success; 2 usage error (an unknown shell).")
def completion(
    ctx: typer.Context,
    shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script for bash, zsh or fish (commands, options, object names, namespaces,
    contexts).

    \b
    bash:  source <(dispatch completion bash)     (or save it in ~/.local/share/bash-completion/completions/dispatch)
    zsh:   dispatch completion zsh > "${fpath[1]}/_dispatch"
    fish:  dispatch completion fish > ~/.config/fish/completions/dispatch.fish
    """
    if shell not in SHELLS:
        raise typer.BadParameter(f"must be one of {', '.join(SHELLS)} (got {shell!r})", ctx=ctx, param_hint="SHELL")
    from ._completion import completion_script

    typer.echo(completion_script("dispatch", shell))  # `python -m dispatch` and the plugin complete otherwise
