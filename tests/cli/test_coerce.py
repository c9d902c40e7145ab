"""The command line's plain conversion gives what typer's own conversion gives, for every parameter of every
command (``dispatch.cli._coerce``: typer's builds pydantic, which ``status NAME`` no longer loads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
import typer.main

from dispatch.cli._app import app, load
from dispatch.cli._coerce import UNHANDLED, PlainConversion, plain_value
from dispatch.cli._registry import COMMANDS

SAMPLES: list[Any] = [
    "abc", "", " 7 ", "7", "007", "12", "-3", "+4", "1.5", "01.50", ".5", "1.", "1e3", "1_000", "nan", "inf",
    "true", "False", "yes", "0", "1", "ünï", "\u0663", "99999999999999999999", "Running", "/tmp/x", True,
    False, 0, 5, -1, 2.5, 3.0, (), ("a", "b"), ["x"], ("a", 1), ("Running",),
]
"""Values of every shape a parser, a default or an environment variable hands typer's conversion."""


def every_command() -> Iterator[tuple[str, Any]]:
    root: Any = typer.main.get_command(app)
    yield "dispatch", root
    stack = [(name, load(name)) for name in COMMANDS]
    while stack:
        path, command = stack.pop()
        yield path, command
        stack += [(f"{path} {sub}", cmd) for sub, cmd in (getattr(command, "commands", None) or {}).items()]


def converted(conversion: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        result = conversion.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as exc:
        return "error", exc.format_message()
    return type(result).__name__, repr(result)   # repr: nan equals itself


def params_of(command: Any) -> list[Any]:
    ctx = typer.Context(command)
    return [*command.params, command.get_help_option(ctx)]


def test_every_parameter_converts_as_typer_does() -> None:
    compared = plain = 0
    for path, command in every_command():
        ctx = typer.Context(command)
        for param in params_of(command):
            if param is None:
                continue
            ours = param._runtime_param
            assert isinstance(ours, PlainConversion), (path, param.name)
            for value in [None, *SAMPLES]:
                param._runtime_param = None   # typer's own conversion, built by typer
                theirs = param.get_runtime_param()
                expected = converted(theirs, value, param, ctx)
                param._runtime_param = PlainConversion(param)
                got = converted(param._runtime_param, value, param, ctx)
                assert got == expected, (path, param.name, value)
                compared += 1
                plain += value is not None and plain_value(param.type_descriptor, value) is not UNHANDLED
    assert compared > 5000 and plain > 500, (compared, plain)


@pytest.mark.parametrize(("annotation", "value", "expected"), [
    (str, "x", "x"), (bool, True, True), (int, "007", 7), (int, 3, 3), (float, "1.50", 1.5), (float, 2.0, 2.0),
    (list[str], ("a", "b"), ["a", "b"]),
])
def test_plain_values_are_converted_without_typer(annotation: Any, value: Any, expected: Any) -> None:
    """The values a command line carries most are converted here (the point: no pydantic for them)."""
    from typer.models import OptionInfo

    class Descriptor:
        parameter_info = OptionInfo()
        file_annotation = None

    Descriptor.annotation = annotation  # type: ignore[attr-defined]
    got = plain_value(Descriptor, value)
    assert got == expected and type(got) is type(expected)


def test_a_malformed_value_gets_typers_message() -> None:
    """A bad number is typer's to explain: its message, through its conversion built then."""
    command: Any = load("logs")
    ctx = typer.Context(command)
    number = next(p for p in command.params if p.type_descriptor.annotation is int)
    assert isinstance(number._runtime_param, PlainConversion)
    assert number.process_value(ctx, "3") == 3
    with pytest.raises(typer.BadParameter) as err:
        number.process_value(ctx, "ten")
    assert err.value.format_message() == (f"Invalid value for '{number.opts[0]}': Input should be a valid integer, "
                                          "unable to parse string as an integer")
    assert not isinstance(number._runtime_param, PlainConversion)  # typer's own serves from then on
