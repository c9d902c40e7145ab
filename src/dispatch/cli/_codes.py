"""The command's exit codes and their help text (a module of their own: ``--help`` shows them without
loading what reports errors)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_RETRY = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130
EXIT_NOT_CEASED = 1
"""``dispatch ceased``'s answer "not ceased", as ``grep -q`` exits 1 for "not found": a script reads the
answer from the exit code alone. An unexpected failure also exits 1, and reads as the safe answer."""

EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 unexpected failure; 2 usage error; 3 retryable failure (Unreachable: "
    "API server unreachable, timeout, conflict, or PodsRemain: pods of the previous execution may still "
    "run); 4 refused, do not retry unchanged (Refused: invalid input, not found, forbidden, read-only, "
    "an unusable kubeconfig, a server that is not the Kubernetes API); "
    "130 interrupted."
)
CEASED_EXIT_CODES_HELP = (
    "Exit codes, as grep -q's: 0 ceased; 1 not ceased (or an unexpected failure: either way, act as if "
    "it may still run); 2 usage error; 3 retryable failure (Unreachable); 4 refused (Refused: an invalid name, "
    "forbidden, an unusable kubeconfig, ...); 130 interrupted."
)
