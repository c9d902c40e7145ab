"""Converting a command line's values without building pydantic for the plain ones.

typer converts every parameter's value with a pydantic ``TypeAdapter`` it builds on the parameter's first use,
before it looks at the value (even an absent one, which it passes through unconverted): importing pydantic
and building an adapter for each of the ~30 parameters ``status NAME`` has (its own and the global ones) cost
more than the rest of the command's start. Most of dispatch's parameters are plain ``str``, ``bool``, ``int``,
``float`` or ``list[str]``, and most values are already of their type (the parser's strings, the declared
defaults). For those, and for absent values, this module returns exactly what typer returns; every other value
(a malformed or out-of-range number, an environment variable's text for a flag) and every other type (choices,
paths, enums, custom parsers) goes to typer's own conversion, built then by typer itself, so its results and
its error messages are typer's. ``tests/cli/test_coerce.py`` holds the two equal over every parameter of every
command.

No ``typer._...`` module is imported: the conversion is put in the slot typer fills on first use (the
parameter's ``_runtime_param``), and anything else typer asks of it is asked of typer's own conversion. If a
typer release drops the slot, nothing is put there and typer converts as before.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

_DIGITS = re.compile(r"[0-9]{1,18}\Z")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?\Z")
UNHANDLED: Any = object()
"""What ``plain_value`` returns for a value it leaves to typer."""


def plain_value(descriptor: Any, value: Any) -> Any:
    """``value`` converted as typer converts it for a parameter of ``descriptor`` (typer's type descriptor:
    its annotation and ``typer.Option``/``Argument`` settings), or ``UNHANDLED`` (then typer converts it)."""
    annotation: Any = descriptor.annotation
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return UNHANDLED
    if annotation is str:
        return value if type(value) is str else UNHANDLED
    if annotation is bool:
        return value if type(value) is bool else UNHANDLED
    if annotation is int or annotation is float:
        if info.clamp:
            return UNHANDLED
        if type(value) is annotation:
            number = value
        elif type(value) is str and (_DIGITS if annotation is int else _DECIMAL).match(value):
            number = annotation(value)
        else:
            return UNHANDLED
        if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
            return UNHANDLED  # typer's message says what the range is
        return number
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        if type(value) in (list, tuple) and all(type(item) is str for item in value):
            return list(value)
        return UNHANDLED
    return UNHANDLED


class PlainConversion:
    """Stands in a parameter's conversion slot until a value needs typer's own conversion; from then on
    typer's (built by typer, through the parameter) serves."""

    def __init__(self, param: Any) -> None:
        self.param = param
        self.descriptor = param.type_descriptor

    def typer_conversion(self) -> Any:
        """typer's own conversion of the parameter, built by typer and left in the slot."""
        param = self.param
        if param._runtime_param is self:
            param._runtime_param = None
        return param.get_runtime_param()

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multiple = param.multiple or param.nargs == -1
        if value is None:
            return () if multiple else None  # what typer returns for an absent value
        done = UNHANDLED if multiple and isinstance(value, str) else plain_value(self.descriptor, value)
        if done is UNHANDLED:
            return self.typer_conversion().coerce(value, param=param, ctx=ctx)
        return done

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("param", "descriptor"):
            raise AttributeError(name)
        return getattr(self.typer_conversion(), name)


def convert_plainly(command: Any, *, subcommands: bool = True) -> Any:
    """Give each parameter of ``command`` (and of its subcommands, unless told not to: the root's are built
    on demand) the conversion above; the help option, made by click on first use, is given it then."""
    for param in command.params:
        _install(param)
    make_help = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = make_help(ctx)
        if option is not None:
            _install(option)
        return option

    command.get_help_option = get_help_option
    for sub in (getattr(command, "commands", None) or {}).values() if subcommands else ():
        convert_plainly(sub)
    return command


def _install(param: Any) -> None:
    if (getattr(param, "_runtime_param", 0) is None and hasattr(param, "get_runtime_param")
            and hasattr(param, "type_descriptor")):
        param._runtime_param = PlainConversion(param)
