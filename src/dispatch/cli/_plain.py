"""``dispatch status NAME`` without the command line's parser, when the line is plain (issue 37).

Building typer's parser (typer, its click, the root command, the status command's module and its ~30
parameters) took ~20 ms of the command's start before its first request. The lines a person types most, ``status
NAME`` or ``get NAME`` with a namespace, an output format, a context or a kubeconfig, are read here instead;
``parse`` returns None for anything else (help, a watch, a filter, an unknown, repeated or malformed option, a
value the parser would refuse), and the parser runs as before, so every usage error and every other line is
still typer's. What a plain line does is what the parser's ``status`` does: the same settings (``tests/cli/
test_cli_plain.py`` runs every accepted shape both ways against the fake cluster and compares the settings,
the output and the exit code), the same read, the same printing, the same messages and exit codes for errors
(``_errors.outcome``), and the parser's own endings for a broken pipe and an end of input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ._registry import hoist

if TYPE_CHECKING:
    from .._adapter import Adapter
    from ._state import Settings

COMMANDS = frozenset({"status", "get"})
"""The commands read here (``get`` is kubectl's word for ``status``), when given one NAME."""
VALUES = {"--kubeconfig": "kubeconfig", "--context": "context", "--namespace": "namespace", "-n": "namespace",
          "--output": "output", "-o": "output"}
"""Options taking a value: the root command's; ``-n`` and ``-o`` are the status command's too."""
FLAGS = {"--read-only": "read_only", "--debug": "debug", "--no-headers": "no_headers"}
COMMAND_OPTIONS = frozenset({"namespace", "output", "no_headers"})
"""What the status command takes of its own (the others are global: ``hoist`` moves them before it)."""
NAMESPACE_VARIABLE = "DISPATCH_NAMESPACE"
"""The global ``--namespace``'s environment variable (read when no ``-n`` is given before the command)."""


class Plain(NamedTuple):
    """A plain ``status NAME`` line: the root command's options, the status command's, and the NAME."""

    root: dict[str, str | bool]
    command: dict[str, str | bool]
    name: str


def parse(args: list[str]) -> Plain | None:
    """The line read as the parser reads it, or None if it is not plain (the parser then reads it)."""
    if any(key.startswith("_") and key.endswith("_COMPLETE") for key in os.environ):
        return None  # the parser's own completion protocol
    words = hoist(args)
    root: dict[str, str | bool] = {}
    command: dict[str, str | bool] | None = None
    name: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        given = root if command is None else command
        dest: str
        value: str | bool
        if word in FLAGS:
            dest, value = FLAGS[word], True
        elif word in VALUES:
            if i >= len(words):
                return None
            dest, value = VALUES[word], words[i]
            i += 1
        elif word.startswith("--") and word.partition("=")[0] in VALUES:
            option, _, value = word.partition("=")
            dest = VALUES[option]
        elif word[:2] in ("-n", "-o") and len(word) > 2 and word[2] != "=":
            dest, value = VALUES[word[:2]], word[2:]  # -ojson, as click reads a short option's joined value
        elif word.startswith("-"):
            return None  # --help, -w, -A, --, an unknown option: the parser's
        elif command is None:
            if word not in COMMANDS:
                return None
            command = {}
            continue
        elif name is None:
            name = word
            continue
        else:
            return None  # a second argument: the parser's usage error
        if dest in given or (given is command and dest not in COMMAND_OPTIONS):
            return None  # repeated, or a global option the parser would see here (hoist moved the others)
        if isinstance(value, str) and (not value or value.startswith("-")):
            return None  # as the parser would read it, but not plain
        given[dest] = value
    if command is None or name is None:
        return None
    from ._state import parse_format

    for given in (root, command):
        if "output" in given:
            try:
                parse_format(str(given["output"]))
            except ValueError:
                return None  # the parser's usage error
    return Plain(root, command, name)


def settings(line: Plain) -> Settings:
    """What the root command's callback and then the status command make of the line's options."""
    from ._state import Settings, set_format

    root = line.root
    namespace = root.get("namespace") or os.environ.get(NAMESPACE_VARIABLE) or None
    made = Settings(kubeconfig=_text(root.get("kubeconfig")), context=_text(root.get("context")),
                    namespace=_text(namespace), read_only=bool(root.get("read_only")), debug=bool(root.get("debug")),
                    no_headers=bool(root.get("no_headers")))
    set_format(made, str(root.get("output", "table")))
    if "output" in line.command:
        set_format(made, str(line.command["output"]))
    if "namespace" in line.command:
        made.namespace = str(line.command["namespace"])
    if line.command.get("no_headers"):
        made.no_headers = True
    return made


def _text(value: str | bool | None) -> str | None:
    return None if value is None else str(value)


def run(line: Plain, connect: Callable[[Settings], Adapter] | None = None) -> int:
    """Run the status command on a plain line; the exit code, as the parser's ``status`` would end."""
    from ._state import CliState

    state = CliState(settings=settings(line)) if connect is None else CliState(connect, settings(line))
    try:
        try:
            one = state.adapter().inspect(line.name)
            from ._output import print_status

            print_status(state, one, warnings=True)
        except BaseException as exc:
            from ._errors import outcome

            code = outcome(state, exc)
            if code is None:
                raise
            return code
        finally:
            state.shutdown()
    except KeyboardInterrupt:
        return 130  # as the parser's main ends a Ctrl-C outside the command's guard
    except EOFError:
        sys.stderr.write("\nAborted!\n")  # click's echo, then its Abort's message
        sys.stderr.flush()
        return 1
    except OSError as exc:
        import errno

        if exc.errno != errno.EPIPE:
            raise
        sys.stdout = _Pacified(sys.stdout)
        sys.stderr = _Pacified(sys.stderr)
        return 1
    return 0


class _Pacified:
    """A stream whose flush ignores a closed pipe, as the parser leaves stdout after one (click's
    ``PacifyFlushWrapper``): the interpreter's last flush then prints no second error."""

    def __init__(self, wrapped: object) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        import errno

        try:
            self.wrapped.flush()  # type: ignore[attr-defined]
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, attr: str) -> object:
        return getattr(self.wrapped, attr)
