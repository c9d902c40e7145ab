"""What every command shares: the global options, the consoles, and the adapter factory.

The factory is the one seam tests use: they pass ``obj=CliState(connect=...)`` to the runner, and
the factory returns an adapter over ``dispatch.testing``'s fake cluster. The product always uses
:func:`connect_adapter`.
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console

from .._adapter import Adapter


class Output(enum.StrEnum):
    """Output formats of ``-o``."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


@dataclass
class Settings:
    """The global options, as parsed."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    read_only: bool = False
    debug: bool = False
    output: Output = Output.TABLE


def connect_adapter(settings: Settings) -> Adapter:
    """The product's adapter factory: a real connection from the kubeconfig."""
    return Adapter.connect(
        settings.namespace,
        kubeconfig=settings.kubeconfig,
        context=settings.context,
        read_only=settings.read_only,
    )


def make_console(*, stderr: bool) -> Console:
    """A console for people. Piped into a file or a log, lines are not cut at 80 columns (160 unless
    COLUMNS says otherwise); errors are never wrapped, so each stays one line."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    width = 160 if piped and "COLUMNS" not in os.environ else None
    return Console(stderr=stderr, soft_wrap=stderr, width=width)


@dataclass
class CliState:
    """Per-invocation state, carried as the click context's ``obj``."""

    connect: Callable[[Settings], Adapter] = connect_adapter
    settings: Settings = field(default_factory=Settings)
    out: Console = field(default_factory=lambda: make_console(stderr=False))
    err: Console = field(default_factory=lambda: make_console(stderr=True))
    _adapter: Adapter | None = None

    def adapter(self) -> Adapter:
        """Connect on first use (so ``--help`` and usage errors never touch the cluster)."""
        if self._adapter is None:
            self._adapter = self.connect(self.settings)
        return self._adapter

    def shutdown(self) -> None:
        if self._adapter is not None:
            adapter, self._adapter = self._adapter, None
            adapter.shutdown()
