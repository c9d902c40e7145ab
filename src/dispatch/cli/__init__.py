"""The ``dispatch`` command line: every library operation as one command, over the same adapter.

Exit codes: 0 success; 1 unexpected failure (and ``ceased``'s "not ceased", as ``grep -q`` exits 1); 2 usage
error; 3 retryable failure (``Unreachable``, including ``PodsRemain``); 4 refused (``Refused``); 130 interrupted.

The entry points load only what the command asked for (``_app`` loads each command's module on demand;
``__complete`` answers a shell's TAB before the command line's parser is even built; a plain ``status NAME``
line is run by ``_plain`` without it), so that the command starts about as fast as kubectl.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ._codes import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NOT_CEASED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_RETRY,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from ._app import app
    from ._state import CliState, Output, Settings, connect_adapter

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_CEASED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_RETRY",
    "EXIT_USAGE",
    "CliState",
    "Output",
    "Settings",
    "app",
    "connect_adapter",
    "kubectl_complete_main",
    "kubectl_main",
    "main",
]

_LAZY = {"app": "._app", "CliState": "._state", "Output": "._state", "Settings": "._state",
         "connect_adapter": "._state"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(prog_name: str | None = "dispatch") -> None:
    """Console-script entry point (``dispatch``; ``python -m dispatch`` passes None, so that usage lines
    read ``python -m dispatch``)."""
    args = sys.argv[1:]
    if args == ["--version"]:  # what the parser would print, without building it
        from .. import __version__

        print(f"dispatch {__version__}")
        return
    if _lightly(args, prog="dispatch"):
        return
    from ._app import app

    app(prog_name=prog_name)


def _lightly(args: list[str], *, prog: str) -> bool:
    """Answer a TAB (``_completion``) or run a plain ``status NAME`` line (``_plain``, ending the process with its
    exit code as the parser would) without building the parser; False for any other line, which the parser reads.

    Both are one short read, so the cyclic collector stays off while they run: its ~80 passes over what their
    imports make took ~10 ms before the first request (a twelfth of it); what a read leaves in reference cycles
    is small and ends with the process. Their objects are then left to the process's end (``_end_lightly``)."""
    import gc

    collecting = gc.isenabled()
    gc.disable()
    try:
        from ._completion import answer_shell

        if answer_shell(args, prog=prog):
            _end_lightly()
            return True
        from ._plain import parse, run

        line = parse(args)
        if line is not None:
            code = run(line)
            _end_lightly()
            raise SystemExit(code)
        return False
    finally:
        if collecting:
            gc.enable()


def _end_lightly() -> None:
    """Leave the objects made so far to the process's end: the interpreter's last collections walk every object
    of the ~300 modules an answer from the cluster loads (~30 ms of a TAB that lists names, ~20% of it). Only
    objects in reference cycles are left uncollected; what these paths write goes to stdout and stderr, which
    the interpreter flushes all the same, and exit handlers run as before. Registered to run at exit, so that a
    caller of ``main`` in a longer-lived process keeps its collector until then."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def kubectl_main() -> None:
    """``kubectl-dispatch``: the same command as a kubectl plugin, so ``kubectl dispatch status`` works."""
    if _lightly(sys.argv[1:], prog="kubectl-dispatch"):
        return
    from ._app import app

    app(prog_name="kubectl dispatch")


def kubectl_complete_main() -> None:
    """``kubectl_complete-dispatch``: kubectl (1.26+) runs it with the words typed after ``kubectl dispatch``
    (the last one being completed) and reads cobra's format back."""
    import gc

    from ._completion import complete_main

    collecting = gc.isenabled()
    gc.disable()  # one short read, as ``_lightly``'s
    try:
        complete_main(sys.argv[1:])
    finally:
        if collecting:
            gc.enable()
    _end_lightly()
