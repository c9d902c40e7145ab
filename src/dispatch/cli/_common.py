"""What every command module shares: the options every command takes (-o, -n, --no-headers, NAME) and the
invocation's state with a command's own options applied. Light: the root command and ``--help`` load it."""

from __future__ import annotations

from typing import Annotated

import typer

from ._state import FORMATS, CliState, Output, parse_format
from ._state import set_format as _set_format


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
