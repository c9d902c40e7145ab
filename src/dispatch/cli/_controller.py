"""``dispatch controller``: its options are ``ControllerOptions``' own, so this command, ``python -m
dispatch.controller`` and the chart cannot drift apart. The controller itself (and its extra) is loaded only
when the command runs."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Annotated, Any

import typer

from .._controller_options import ControllerOptions
from .._controller_options import Option as ControllerOption
from ._codes import EXIT_CODES_HELP
from ._common import _state
from ._errors import guard


def run_from_cli(options: ControllerOptions) -> int | None:
    """Run the controller; without the ``controller`` extra, say which extra to install (exit 2)."""
    try:
        from ..controller import run_from_cli as run
    except ModuleNotFoundError as missing:
        from . import _nocontroller

        _nocontroller.MISSING = _nocontroller.missing_module(missing)
        run = _nocontroller.run_from_cli
    result: int | None = run(options)
    return result

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
commands = typer.Typer(rich_markup_mode=None, add_completion=False)
commands.command("controller", epilog=EXIT_CODES_HELP)(controller)

