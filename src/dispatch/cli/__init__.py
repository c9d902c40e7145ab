"""The ``dispatch`` command line: every library operation as one command, over the same adapter.

Exit codes: 0 success; 1 unexpected failure (and ``ceased``'s "not ceased", as ``grep -q`` exits 1); 2 usage
error; 3 retryable failure (``Unreachable``, including ``PodsRemain``); 4 refused (``Refused``); 130 interrupted.
"""

from __future__ import annotations

from ._app import app
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
    "main",
]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="dispatch")
