"""Stand-ins for the controller's names when the ``controller`` extra is not installed.

The library and every other command need none of the controller's packages (structlog, prometheus-client,
cryptography), so ``pip install trainjob-dispatch`` stays light. Only ``dispatch controller`` needs them:
its help still shows (without defaults), and running it says which extra to install.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .. import _names as n

EXTRA = "pip install 'trainjob-dispatch[controller]'"


@dataclass(frozen=True)
class _Defaults:
    """The controller's option defaults its command shows and validates (tests/cli checks that they are
    ``dispatch.controller.DEFAULTS``'s)."""

    lease_namespace: str = "dispatch-system"
    lease_name: str = "dispatch-admission-controller"
    workers: int = 4
    batch: int = 64
    resync_seconds: float = 60.0
    foreign: str = "ready"
    controller_name: str = n.CONTROLLER_NAME
    guard_port: int | None = None
    guard_cert_dir: str = ""
    guard_webhook: str = "dispatch-guard"
    kueue_namespace: str = "kueue-system"


DEFAULTS: Any = _Defaults()
LOG_LEVEL: Any = "info"
METRICS_PORT: Any = 8080


def missing_module(error: ModuleNotFoundError) -> str:
    return error.name or str(error)


MISSING = ""
"""The module whose absence brought these stand-ins in (set by the CLI)."""


def run_from_cli(**_: Any) -> int:
    """What ``dispatch controller`` does without the extra: a usage error naming it (exit 2)."""
    print(f"dispatch controller needs the controller extra ({MISSING} is not installed): {EXTRA}",
          file=sys.stderr)
    return 2
