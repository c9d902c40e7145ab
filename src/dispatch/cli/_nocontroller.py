"""Stand-ins for the controller's names when the ``controller`` extra is not installed.

The library and every other command need none of the controller's packages (structlog, prometheus-client,
cryptography), so ``pip install trainjob-dispatch`` stays light. Only ``dispatch controller`` needs them:
its help still shows (the options are ``ControllerOptions``', which need no extra), and running it says
which extra to install.
"""

from __future__ import annotations

import sys

from .._controller_options import ControllerOptions

EXTRA = "pip install 'trainjob-dispatch[controller]'"


def missing_module(error: ModuleNotFoundError) -> str:
    return error.name or str(error)


MISSING = ""
"""The module whose absence brought these stand-ins in (set by the CLI)."""


def run_from_cli(options: ControllerOptions) -> int:
    """What ``dispatch controller`` does without the extra: a usage error naming it (exit 2)."""
    print(f"dispatch controller needs the controller extra ({MISSING} is not installed): {EXTRA}",
          file=sys.stderr)
    return 2
