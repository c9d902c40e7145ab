"""The ``dispatch`` command line: every library operation as one command, over the same adapter.

Exit codes: 0 success; 1 unexpected failure (and ``ceased``'s "not ceased", as ``grep -q`` exits 1); 2 usage
error; 3 retryable failure (``Unreachable``, including ``PodsRemain``); 4 refused (``Refused``); 130 interrupted.
"""

from __future__ import annotations

from ._app import app
from ._completion import complete_var, completion_init, kubectl_complete_main
from ._errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NOT_CEASED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_RETRY,
    EXIT_USAGE,
)
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


def main(prog_name: str | None = "dispatch") -> None:
    """Console-script entry point (``dispatch``; ``python -m dispatch`` passes None, so that usage lines
    read ``python -m dispatch``)."""
    completion_init()  # so that the completion scripts' callbacks (_DISPATCH_COMPLETE=...) are answered
    app(prog_name=prog_name)


def kubectl_main() -> None:
    """``kubectl-dispatch``: the same command as a kubectl plugin, so ``kubectl dispatch status`` works."""
    completion_init()
    app(prog_name="kubectl dispatch", complete_var=complete_var("kubectl-dispatch"))
