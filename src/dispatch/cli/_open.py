"""``dispatch open``: a TrainJob from flags, a spec file or a whole manifest."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from .._api import TRAINJOBS
from .._records import State, Status
from .._validate import validate_spec
from ..errors import InvalidInput
from ._codes import EXIT_CODES_HELP
from ._common import NamespaceOpt, OutputOpt, _state
from ._errors import guard
from ._output import emit, print_warnings, resource_name, show, status_grid, trainjob_names, wide
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
from ._state import CliState

commands = typer.Typer(rich_markup_mode=None, add_completion=False)
"""This module's command (the root command loads it when ``open`` is asked for)."""


@commands.command("open", epilog=EXIT_CODES_HELP + "\n\nSpec file example (-f):\n\n\b\n" + EXAMPLE)
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
        print_warnings(state, status)  # the runtime's risk, said once: when an object of it is made

    emit(state, status.to_dict(), human, names=trainjob_names(status.name))


def _dry_run(value: str) -> str:
    if value not in ("none", "client", "server"):
        raise typer.BadParameter(f"must be none, client or server (got {value!r})")
    return value
