"""The ``dispatch`` command: every library operation as one command."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import shlex
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from .. import __version__
from .._api import PODS, TRAINJOBS
from .._controller_options import ControllerOptions
from .._controller_options import Option as ControllerOption
from .._records import State, Status
from .._validate import validate_spec
from ..errors import InvalidInput
from ._completion import completion_script
from ._errors import CEASED_EXIT_CODES_HELP, EXIT_CODES_HELP, EXIT_FAILURE, EXIT_NOT_CEASED, EXIT_USAGE, guard
from ._output import (
    Column,
    Grid,
    emit,
    identity_dict,
    pod_dict,
    pods_grid,
    print_cessation,
    print_status,
    print_statuses,
    resource_name,
    show,
    status_grid,
    trainjob_names,
    wide,
)
from ._release import release_once, release_wait
from ._spec import (
    EXAMPLE,
    SpecError,
    build_spec,
    load_input,
    locate,
    parse_integer,
    parse_pairs,
    parse_toleration,
    parse_volume,
)
from ._state import FORMATS, CliState, Output, Settings, parse_format
from ._timing import INTERVAL, STEP_TIMEOUT, TIMEOUT, parse_duration

try:
    from ..controller import run_from_cli
except ModuleNotFoundError as _missing:   # the `controller` extra is not installed: only that command needs it
    from . import _nocontroller
    from ._nocontroller import run_from_cli

    _nocontroller.MISSING = _nocontroller.missing_module(_missing)

HELP = f"""Run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Each command is one call of the dispatch library. Objects are TrainJobs named <job-id>-<submission>
unless --name says otherwise.

{EXIT_CODES_HELP}
"""

app = typer.Typer(
    name="dispatch",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
testbed_app = typer.Typer(
    help="The local real control plane (etcd, kube-apiserver, controllers, KWOK nodes) for trying dispatch.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(testbed_app, name="testbed")

def _format(value: str | None) -> str | None:
    """``-o``'s value checked when read, so a bad format or template is a usage error before any request."""
    if value is not None:
        try:
            parse_format(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


OUTPUT_HELP = f"Output format: {FORMATS} (as kubectl's)."
OutputOpt = Annotated[
    str | None,
    typer.Option("--output", "-o", metavar="FORMAT", callback=_format,
                 help=OUTPUT_HELP.removesuffix(".") + "; overrides the global -o."),
]
NoHeadersOpt = Annotated[
    bool, typer.Option("--no-headers", help="Print tables without their header row (as kubectl's).")
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (overrides the global -n)."),
]
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The TrainJob's name (<job-id>-<submission> by default).")]


def _state(ctx: typer.Context, output: str | None = None, namespace: str | None = None, *, named: bool = True,
           no_headers: bool = False) -> CliState:
    """The invocation's state with this command's own -o and -n applied. ``named`` is False for a command
    whose answer names no object, where ``-o name`` is a usage error (before anything is done)."""
    state = ctx.find_object(CliState)
    if state is None:  # invoked without the root callback (never in the product)
        state = CliState()
        ctx.obj = state
    if output is not None:
        _set_format(state.settings, output)
    if namespace is not None:
        state.settings.namespace = namespace
    if no_headers:
        state.settings.no_headers = True
    if state.settings.output is Output.NAME and not named:
        raise typer.BadParameter(f"{ctx.info_name}'s answer names no object; use another -o ({FORMATS})",
                                 ctx=ctx, param_hint="'-o' / '--output'")
    return state


def _set_format(settings: Settings, value: str) -> None:
    fmt = parse_format(value)  # checked already by the option's callback
    settings.output = fmt.output
    settings.format = fmt


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
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    state = ctx.obj if isinstance(ctx.obj, CliState) else CliState()
    ctx.obj = state
    state.settings = Settings(
        kubeconfig=kubeconfig,
        context=context,
        namespace=namespace,
        read_only=read_only,
        debug=debug,
        no_headers=no_headers,
        request_timeout=parse_duration(request_timeout) or None,
    )
    _set_format(state.settings, output)
    ctx.call_on_close(state.shutdown)


# ------------------------------------------------------------------------------------------------ open


@app.command("open", epilog=EXIT_CODES_HELP + "\n\nSpec file example (-f):\n\n\b\n" + EXAMPLE)
def open_(
    ctx: typer.Context,
    spec_file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="YAML spec file, or a whole TrainJob manifest brought under dispatch as "
                     "enrolment would ('-' for stdin); flags override a spec file's values."),
    ] = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="The logical job (a label value).")] = None,
    submission: Annotated[
        str | None, typer.Option("--submission", help="This submission of the job (a label value).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="TrainJob name (default <job-id>-<submission>).")] = None,
    runtime: Annotated[
        str | None, typer.Option("--runtime", help="Training runtime (default torch-distributed).")
    ] = None,
    runtime_kind: Annotated[
        str | None, typer.Option("--runtime-kind", help="ClusterTrainingRuntime (default) or TrainingRuntime.")
    ] = None,
    image: Annotated[str | None, typer.Option("--image", help="Trainer image.")] = None,
    command: Annotated[
        str | None, typer.Option("--command", help="Trainer command, split like a shell: 'python train.py'.")
    ] = None,
    args: Annotated[
        list[str] | None, typer.Option("--arg", metavar="ARG", help="A trainer argument (repeatable).")
    ] = None,
    nodes: Annotated[
        str | None, typer.Option("--nodes", metavar="INTEGER", help="Number of nodes (a plain decimal integer).")
    ] = None,
    resource: Annotated[
        list[str] | None,
        typer.Option(
            "--resource",
            "-r",
            metavar="KEY=VALUE",
            help="Resources per node, KEY=VALUE, comma-separated or repeated: -r cpu=2,memory=4Gi.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", "-e", metavar="KEY=VALUE",
            help="Trainer environment variable, one KEY=VALUE per flag (repeatable); the value is taken whole, "
            "commas and '=' included: -e CUDA_VISIBLE_DEVICES=0,1.",
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label", "-l", metavar="KEY=VALUE",
            help="Extra TrainJob label, KEY=VALUE, comma-separated or repeated: -l team=ml,tier=gold.",
        ),
    ] = None,
    node_selector: Annotated[
        list[str] | None,
        typer.Option(
            "--node-selector", metavar="KEY=VALUE",
            help="Pods' node selector, KEY=VALUE, comma-separated or repeated: --node-selector zone=a,gpu=a100.",
        ),
    ] = None,
    pod_annotation: Annotated[
        list[str] | None,
        typer.Option(
            "--pod-annotation", metavar="KEY=VALUE",
            help="Annotation on every pod, one KEY=VALUE per flag (repeatable); the value is taken whole, commas "
            "included.",
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Kueue LocalQueue (Kueue mode).")] = None,
    priority: Annotated[str | None, typer.Option("--priority", help="Kueue WorkloadPriorityClass.")] = None,
    grace_period: Annotated[
        str | None, typer.Option("--grace-period", metavar="INTEGER",
                                 help="Pods' termination grace period, seconds (a plain decimal integer).")
    ] = None,
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume", metavar="KEY=VALUE,...",
            help="A volume mounted in the trainer container (repeatable): name=ckpt,claim=llama-ckpt,mountPath=/ckpt; "
            "the source is claim=, configMap=, secret= or emptyDir; optional readOnly, subPath=.",
        ),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(
            "--toleration", metavar="KEY[=VALUE][:EFFECT[:SECONDS]]",
            help="A toleration of every pod, written as kubectl taint writes a taint (repeatable); without =VALUE "
            "the operator is Exists; '*' tolerates every taint.",
        ),
    ] = None,
    service_account: Annotated[
        str | None, typer.Option("--service-account", help="ServiceAccount every pod runs as.")
    ] = None,
    image_pull_secret: Annotated[
        list[str] | None,
        typer.Option("--image-pull-secret", metavar="NAME",
                     help="Secret every pod pulls images with (repeatable, or comma-separated)."),
    ] = None,
    hold: Annotated[
        bool,
        typer.Option("--hold/--no-hold", help="Create it held (default), or admit it at once through the check."),
    ] = True,
    dry_run: Annotated[
        str, typer.Option("--dry-run", metavar="none|client|server", callback=_dry_run,
                          help="As kubectl's: 'server' sends the create with dryRun=All (the API server and its "
                          "webhooks validate and default it; nothing is stored); 'client' prints what would be "
                          "sent; 'none' (default) creates it. The submission is not claimed by a dry run.")
    ] = "none",
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Create a TrainJob for one submission, held unless --no-hold."""
    state = _state(ctx, output, namespace)
    lines: dict[str, int] = {}
    try:
        from_file, manifest = load_input(spec_file, lines) if spec_file is not None else ({}, None)
        flags: dict[str, Any] = {
            "job_id": job_id,
            "submission": submission,
            "name": name,
            "runtime": runtime,
            "runtime_kind": runtime_kind,
            "image": image,
            "command": shlex.split(command) if command is not None else None,
            "args": list(args or []),
            "num_nodes": parse_integer("--nodes", nodes),
            "resources_per_node": parse_pairs("--resource", resource or []),
            "env": parse_pairs("--env", env or []),
            "labels": parse_pairs("--label", label or []),
            "node_selector": parse_pairs("--node-selector", node_selector or []),
            "pod_annotations": parse_pairs("--pod-annotation", pod_annotation or []),
            "queue": queue,
            "priority_class": priority,
            "termination_grace_period_seconds": parse_integer("--grace-period", grace_period),
            "volumes": [parse_volume(v) for v in volume or []],
            "tolerations": [parse_toleration(t) for t in toleration or []],
            "service_account": service_account,
            "image_pull_secrets": [name for item in image_pull_secret or [] for name in item.split(",")],
        }
        if manifest is not None:
            given = [option for option, value in zip(_SPEC_OPTIONS, flags.values(), strict=True)
                     if value not in (None, [], {})]
            if given:
                raise SpecError(f"{spec_file} is a TrainJob manifest: {', '.join(given)} cannot be given with it "
                                "(dispatch takes the manifest as written; edit it instead)")
        else:
            spec = build_spec(from_file, flags)
    except (SpecError, ValueError) as exc:
        raise typer.BadParameter(str(exc), ctx=ctx, param_hint="spec") from None
    if manifest is not None:
        _open_manifest(state, manifest, hold=hold, dry_run=dry_run)
        return
    with guard(state):
        try:
            validate_spec(spec)  # here too, so that a value from the file is named by its file and line
        except InvalidInput as exc:
            raise locate(exc, spec_file, lines, flags) if spec_file is not None else exc from None
    _open_and_show(state, dry_run, dry=lambda server: state.adapter().open_dry_run(spec, server=server),
                   real=lambda: state.adapter().open(spec, hold=hold))


_SPEC_OPTIONS = ("--job-id", "--submission", "--name", "--runtime", "--runtime-kind", "--image", "--command",
                 "--arg", "--nodes", "--resource", "--env", "--label", "--node-selector", "--pod-annotation",
                 "--queue", "--priority", "--grace-period", "--volume", "--toleration", "--service-account",
                 "--image-pull-secret")
"""The options that build a spec, in the order ``open_`` gathers them (none may come with a manifest)."""


def _open_manifest(state: CliState, manifest: dict[str, Any], *, hold: bool, dry_run: str) -> None:
    """``open -f trainjob.yaml``: the manifest brought under dispatch as enrolment would, then opened."""
    _open_and_show(state, dry_run, dry=lambda server: state.adapter().open_manifest_dry_run(manifest, server=server),
                   real=lambda: state.adapter().open_manifest(manifest, hold=hold), identity=True)


def _open_and_show(state: CliState, dry_run: str, *, dry: Callable[[bool], dict[str, Any]],
                   real: Callable[[], Status], identity: bool = False) -> None:
    """``open``'s call and answer, from flags or a manifest: the body a dry run would create (``dry``, told
    whether the server takes part; a manifest may leave its namespace to the context's), or the object made
    (``real``; ``identity`` names its job-id and submission, which a manifest's labels gave)."""
    with guard(state):
        if dry_run != "none":
            body = dry(dry_run == "server")
        else:
            status = real()
    if dry_run != "none":
        meta = body.get("metadata") or {}
        shown = str(meta.get("name", ""))
        emit(state, body, lambda: state.out.print(
            f"{resource_name(TRAINJOBS, escape(shown))} opened ({dry_run} dry run; nothing written) in namespace "
            f"{escape(str(meta.get('namespace') or state.adapter().namespace))}", highlight=False),
            names=trainjob_names(shown))
        return

    def human() -> None:
        verb = "opened" if status.state is not State.RUNNING else "opened and admitted"
        named = f" as {escape(status.identity.job_id)}/{escape(status.identity.submission)}" if identity else ""
        state.out.print(f"{verb} {escape(status.name)} in namespace {escape(status.namespace)}{named}")
        show(state, status_grid([status], wide=wide(state)))

    emit(state, status.to_dict(), human, names=trainjob_names(status.name))


def _dry_run(value: str) -> str:
    if value not in ("none", "client", "server"):
        raise typer.BadParameter(f"must be none, client or server (got {value!r})")
    return value


# --------------------------------------------------------------------------------------------- release


@app.command(epilog=EXIT_CODES_HELP)
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


@app.command(epilog=EXIT_CODES_HELP)
def hold(ctx: typer.Context, name: NameArg, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Suspend an object (Kueue mode: deactivate its Workload). Its pods then start to go."""
    state = _state(ctx, output, namespace)
    with guard(state):
        status = state.adapter().hold(name)
    print_status(state, status)


@app.command(epilog=EXIT_CODES_HELP)
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


# ------------------------------------------------------------------------------------------ admin

admin_app = typer.Typer(
    help="Identity-record and pod-finalizer administration (needs the dispatch-admin role).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(admin_app, name="admin")


@admin_app.command("forget", epilog=EXIT_CODES_HELP)
def admin_forget(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID")],
    submission: Annotated[str, typer.Argument(metavar="SUBMISSION")],
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the submission counts from A=1 again.")] = False,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Delete a submission's identity record, so a re-opened submission counts from A=1 again.

    Only once no process of it can run and nothing fences on its old admission numbers. Refused while a
    TrainJob holds the submission.
    """
    state = _state(ctx, output, namespace, named=False)
    if not yes:
        raise typer.BadParameter("forgetting a submission lets it reuse admission numbers; pass --yes to confirm",
                                 param_hint="--yes")
    with guard(state):
        forgotten = state.adapter().forget(job_id, submission)

    def human() -> None:
        state.out.print(f"forgot {escape(job_id)}/{escape(submission)}" if forgotten
                        else f"{escape(job_id)}/{escape(submission)} has no identity record")

    emit(state, {"jobId": job_id, "submission": submission, "forgotten": forgotten}, human)


@admin_app.command("release-pod", epilog=EXIT_CODES_HELP)
def admin_release_pod(
    ctx: typer.Context,
    pod: Annotated[str, typer.Argument(metavar="POD")],
    node_confirmed_down: Annotated[bool, typer.Option(
        "--node-confirmed-down",
        help="Confirm the pod's node is shut down (its processes are gone): that is the proof of the pod's end.",
    )] = False,
    process_gone: Annotated[bool, typer.Option(
        "--process-gone",
        help="Confirm the process of a pod someone else marked Failed is gone, now that its node's kubelet "
             "is back (Ready): that is the proof of the pod's end.",
    )] = False,
    output: OutputOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Remove dispatch's finalizer from a pod, so its deletion completes.

    Without --node-confirmed-down only a pod whose end is proven is released (its kubelet confirmed it,
    or its Node is tainted out-of-service and not Ready; a deleted Node proves nothing by itself: its
    kubelet may run on). With it, your word that the node is down is the
    proof: only give it once the machine is confirmed off, as for the out-of-service taint. Refused
    while the pod's Node is Ready. --process-gone is for a pod Kueue's failure recovery or PodGC marked
    Failed while its node was unreachable, once the node's kubelet is back: check the process is gone
    on the node, then give it.
    """
    state = _state(ctx, output, namespace)
    with guard(state):
        end = state.adapter().release_pod(pod, node_confirmed_down=node_confirmed_down, process_gone=process_gone)

    def human() -> None:
        state.out.print(f"released pod {escape(pod)} (end: {end.proof})")

    emit(state, {"pod": pod, "released": True, **end.to_dict()}, human, names=[resource_name(PODS, pod)])


@admin_app.command("worker-down", epilog=EXIT_CODES_HELP)
def admin_worker_down(
    ctx: typer.Context,
    worker: Annotated[str, typer.Argument(metavar="WORKER", help="The MultiKueueCluster's name.")],
    output: OutputOpt = None,
) -> None:
    """Confirm that a MultiKueue worker Kueue has lost is down, on the manager.

    dispatch's check on the manager waits while a worker the previous execution may have run in cannot be
    read: nothing proves its pods stopped. Once you know the worker's machines are off (or its API server
    and nodes are gone for good), this is the proof. It is written on the MultiKueueCluster and names the
    loss Kueue saw (its Active=False transition), so it lapses by itself when the worker comes back.
    Refused for a worker Kueue still reaches.
    """
    state = _state(ctx, output, None)
    with guard(state):
        w = state.adapter().worker_down(worker)

    def human() -> None:
        state.out.print(f"worker {escape(w.name)} confirmed down (Kueue lost it at {escape(w.lost_since)}: "
                        f"{escape(w.reason)})")

    emit(state, w.to_dict(), human)


@admin_app.command("workers", epilog=EXIT_CODES_HELP)
def admin_workers(ctx: typer.Context, output: OutputOpt = None) -> None:
    """List the MultiKueue workers as Kueue sees them, and which are confirmed down."""
    state = _state(ctx, output, None)
    with guard(state):
        workers = state.adapter().workers()

    def human() -> None:
        grid = Grid([Column("WORKER"), Column("KUEUE"), Column("REASON"), Column("LOST SINCE"),
                     Column("CONFIRMED DOWN")])
        for w in workers:
            grid.add([w.name, f"Active={w.active}", w.reason or "-", w.lost_since or "-",
                      "yes" if w.confirmed_down else "no"])
        show(state, grid)

    emit(state, {"items": [w.to_dict() for w in workers]}, human)


@admin_app.command("migrate", epilog=EXIT_CODES_HELP)
def admin_migrate(ctx: typer.Context, output: OutputOpt = None, namespace: NamespaceOpt = None) -> None:
    """Fold the old dispatch-admissions ConfigMap and every dispatch TrainJob's A into identity records.

    Run it once per namespace after upgrading from a version without records; safe to run again.
    """
    state = _state(ctx, output, namespace, named=False)
    with guard(state):
        created, raised = state.adapter().migrate()
    emit(state, {"created": created, "raised": raised},
         lambda: state.out.print(f"identity records: {created} created, {raised} raised"))


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


@app.command(epilog=STATUS_EPILOG)
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
app.command(epilog=STATUS_EPILOG)(find)


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
            print_status(state, one)
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


@app.command(epilog=CEASED_EXIT_CODES_HELP)
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


@app.command(epilog=EXIT_CODES_HELP)
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


@app.command(epilog=EXIT_CODES_HELP)
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


@app.command(epilog="Exit codes: 0 success; 2 usage error (an unknown shell).")
def completion(
    ctx: typer.Context,
    shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script for bash, zsh or fish (commands, options, states, formats).

    \b
    bash:  source <(dispatch completion bash)     (or save it in ~/.local/share/bash-completion/completions/dispatch)
    zsh:   dispatch completion zsh > "${fpath[1]}/_dispatch"
    fish:  dispatch completion fish > ~/.config/fish/completions/dispatch.fish
    """
    if shell not in SHELLS:
        raise typer.BadParameter(f"must be one of {', '.join(SHELLS)} (got {shell!r})", ctx=ctx, param_hint="SHELL")
    typer.echo(completion_script("dispatch", shell))  # `python -m dispatch` and the plugin complete otherwise


# ----------------------------------------------------------------------------------------- controller


def _typer_parameter(f: dataclasses.Field[Any]) -> inspect.Parameter:
    """One ``ControllerOptions`` field as a typer option: its flag, help, environment variable and bounds
    (a value out of them is a usage error naming the option)."""
    opt: ControllerOption = f.metadata["option"]

    def check(value: Any) -> Any:
        try:
            return opt.check(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    decls = [f"{opt.flag}/--no-{opt.flag[2:]}" if opt.negatable else opt.flag, *([opt.short] if opt.short else [])]
    info = typer.Option(*decls, help=opt.describe(), envvar=opt.env, metavar=opt.metavar, callback=check)
    kind: Any = (opt.kind | None) if opt.optional else opt.kind
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                             annotation=Annotated[kind, info])


def controller(ctx: typer.Context, **given: Any) -> None:
    """Run the Kueue admission-check controller until SIGTERM or Ctrl-C (long-running).

    It keeps the AdmissionCheck active, and for each pending Workload of a TrainJob either leaves the
    check Pending naming the pods that remain, or raises A and sets it Ready.
    """
    state = _state(ctx)
    s = state.settings
    given["namespace"] = given.get("namespace") or s.namespace
    with guard(state):
        result = run_from_cli(ControllerOptions(kubeconfig=s.kubeconfig, context=s.context, **given))
    if isinstance(result, int) and result:
        raise typer.Exit(result)


# Its options are ControllerOptions' own fields (all but the global --kubeconfig and --context), so this
# command, `python -m dispatch.controller` and the chart cannot drift apart.
_CONTROLLER_PARAMETERS = [_typer_parameter(f) for f in dataclasses.fields(ControllerOptions)
                          if not f.metadata["option"].global_]
controller.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
     *_CONTROLLER_PARAMETERS])
controller.__annotations__ = {"ctx": typer.Context, **{p.name: p.annotation for p in _CONTROLLER_PARAMETERS},
                              "return": None}
app.command(epilog=EXIT_CODES_HELP)(controller)


# -------------------------------------------------------------------------------------------- testbed


def _testbed(state: CliState) -> Any:
    from .. import testbed

    return testbed


StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        envvar="DISPATCH_TESTBED_STACK",
        show_envvar=True,
        metavar="NAME",
        help="Testbed stack of versions (see `dispatch testbed stacks`; default: testbed/stacks/default).",
    ),
]


def _select_stack(ctx: typer.Context, stack: str | None) -> None:
    """Select the stack for this command and the build/start processes it runs; refuse unknown names."""
    if stack is None:
        return
    from .. import testbed

    try:
        testbed.select_stack(stack)
    except ValueError as exc:
        _state(ctx).err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(EXIT_USAGE) from None


@testbed_app.callback()
def testbed_root(ctx: typer.Context, stack: StackOpt = None) -> None:
    _select_stack(ctx, stack)


NoRealNodeOpt = Annotated[
    bool,
    typer.Option(
        "--no-real-node",
        help="No real node (the stack's kubelet with containerd, beside the KWOK nodes): neither built nor "
        "started. Same as DISPATCH_TESTBED_REAL_NODE=0.",
    ),
]


def _no_real_node(off: bool) -> None:
    if off:
        os.environ["DISPATCH_TESTBED_REAL_NODE"] = "0"  # the build script and every child see it too


@testbed_app.command("stacks")
def testbed_stacks(ctx: typer.Context) -> None:
    """The stacks of versions the testbed can build (the selected one marked *)."""
    state = _state(ctx)
    tb = _testbed(state)
    with _testbed_errors(state):
        selected = tb.stack()
        for name in tb.stacks():
            pins = " ".join(f"{k.removesuffix('_VERSION').lower()}={v}" for k, v in tb.versions(name).items())
            state.out.print(f"{'*' if name == selected else ' '} {name:10} {pins}", highlight=False)


@contextlib.contextmanager
def _testbed_errors(state: CliState) -> Iterator[None]:
    """Any failure of a testbed command as an error line, a hint where one is known, and exit 1."""
    try:
        yield
    except Exception as exc:
        state.err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        if "root" in str(exc).lower() or isinstance(exc, PermissionError):
            state.err.print("[yellow]hint:[/] the testbed must run as root (Kueue's certificate path)",
                            highlight=False)
        elif shutil.which("go") is None:
            state.err.print("[yellow]hint:[/] the testbed is built from Go modules: install Go", highlight=False)
        raise typer.Exit(EXIT_FAILURE) from None


@testbed_app.command("build")
def testbed_build(ctx: typer.Context, no_real_node: NoRealNodeOpt = False) -> None:
    """Build the testbed's binaries (a no-op when already built)."""
    state = _state(ctx)
    _no_real_node(no_real_node)
    with _testbed_errors(state):
        path = _testbed(state).build()
    state.out.print(f"built: {path}")


@testbed_app.command("up")
def testbed_up(ctx: typer.Context, no_real_node: NoRealNodeOpt = False) -> None:
    """Build (if needed) and start the testbed; print its kubeconfig. Where the host allows (root, cgroups,
    containerd, runc and the CNI plugins installed), a real node runs beside the KWOK nodes."""
    state = _state(ctx)
    _no_real_node(no_real_node)
    with _testbed_errors(state):
        kubeconfig = _testbed(state).up()
    state.out.print(f"testbed up; kubeconfig: {kubeconfig}")
    state.out.print(f"use it with: export KUBECONFIG={kubeconfig}")


@testbed_app.command("down")
def testbed_down(ctx: typer.Context) -> None:
    """Stop the testbed and discard its data."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).down()
    state.out.print("testbed down")


@testbed_app.command("status")
def testbed_status(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Each component: running, healthy or frozen."""
    state = _state(ctx, output, named=False)
    tb = _testbed(state)
    with _testbed_errors(state):
        components = tb.status()
        kubeconfig = str(tb.kubeconfig_path())
        real_node = tb.real_node() if _any_running(components) else None
        real_problem = None if real_node else tb.real_node_problem()
    up = all(c.healthy or c.frozen for c in components)

    def human() -> None:
        grid = Grid([Column("COMPONENT"), Column("PID"), Column("STATE")])
        for c in components:
            word = "frozen" if c.frozen else "healthy" if c.healthy else "running" if c.running else "stopped"
            style = {"healthy": "green", "frozen": "cyan", "running": "yellow", "stopped": "red"}[word]
            grid.add([c.name, "-" if c.pid is None else str(c.pid), Text(word, style=style)])
        show(state, grid)
        state.out.print(f"testbed is {'up' if up else 'not up'}; kubeconfig: {kubeconfig}")
        if real_node:
            state.out.print(f"real node: {real_node} (label dispatch.test/real-node=true, NoSchedule taint)")
        elif up:
            state.out.print(f"real node: none ({real_problem})", highlight=False)

    emit(
        state,
        {"up": up, "kubeconfig": kubeconfig, "components": [dataclasses.asdict(c) for c in components],
         "realNode": real_node, "realNodeProblem": real_problem},
        human,
    )


def _any_running(components: list[Any]) -> bool:
    """Any component running: only then is the real node worth asking about."""
    return any(c.running for c in components)


@testbed_app.command("freeze")
def testbed_freeze(
    ctx: typer.Context, node: Annotated[str, typer.Argument(metavar="NODE", help="A freezable node.")]
) -> None:
    """Stop a node's kubelet (its KWOK process, or the real node's kubelet): the node goes Ready=Unknown, its
    pods keep 'running' (on the real node, really)."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).freeze(node)
    state.out.print(f"froze {node}: it goes Ready=Unknown within the node monitor grace period")


@testbed_app.command("thaw")
def testbed_thaw(
    ctx: typer.Context, node: Annotated[str, typer.Argument(metavar="NODE", help="A frozen node.")]
) -> None:
    """Resume a frozen node's kubelet."""
    state = _state(ctx)
    with _testbed_errors(state):
        _testbed(state).thaw(node)
    state.out.print(f"thawed {node}")


# ----------------------------------------------------------------------------------------------- demo


@app.command(epilog=EXIT_CODES_HELP + " The demo exits 1 if the promise was broken or a step failed.")
def demo(
    ctx: typer.Context,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's namespace and objects afterwards.")] = False,
    step_timeout: Annotated[
        float, STEP_TIMEOUT.option("--step-timeout", "Seconds each step may take before the demo fails")
    ] = 120.0,
    stack: StackOpt = None,
    real_node: Annotated[bool, typer.Option(
        "--real-node", help="Run the story on the testbed's real node: a real kubelet, real processes, and "
                            "the processes' own record as the judge.")] = False,
) -> None:
    """Walk through the promise on the local testbed (built and started if needed).

    A TrainJob runs, is held, its pods stay Terminating and release is refused naming them; they go and
    release admits with A=2. Then a frozen node (Ready=Unknown): not ceased until the operator's
    out-of-service taint, then release admits. Fails if two executions of one object ever ran at once.
    """
    from ._demo import DemoFailed, run_demo

    _select_stack(ctx, stack)
    state = _state(ctx)
    with guard(state):
        try:
            run_demo(state.out, keep=keep, step_timeout=step_timeout, real_node=real_node)
        except DemoFailed as exc:
            state.err.print(f"[bold red]demo failed:[/] {escape(str(exc))}", highlight=False)
            raise typer.Exit(EXIT_FAILURE) from None
