"""The CLI test harness: runs ``dispatch ARGS`` against one fake cluster through the adapter factory."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
from typer.testing import CliRunner, Result

from dispatch import Adapter
from dispatch.cli import CliState, Settings, app
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")
READER = ("dispatch-reader", "dispatch-node-reader")
ADMIN = ("dispatch-admin", "dispatch-node-reader")
"""`dispatch admin ...` runs as the operator bound to the admin role (the writer role may not patch pods)."""


@dataclass
class Cli:
    """Runs ``dispatch ARGS`` against one fake cluster; records the settings each run connected with."""

    cluster: FakeCluster
    connected: list[Settings] = field(default_factory=list)
    transport: Callable[[], httpx2.AsyncBaseTransport] | None = None
    """Replaces the fake cluster's own transport (to serve logs, say)."""

    def __call__(self, *args: str, input: str | None = None, env: dict[str, str | None] | None = None) -> Result:
        def connect(settings: Settings) -> Adapter:
            self.connected.append(settings)
            # exactly the shipped roles the CLI is run with
            roles = READER if settings.read_only else ADMIN if "admin" in args else WRITER
            transport = self.transport() if self.transport else self.cluster.transport(roles=roles)
            return Adapter.connect(settings.namespace, transport=transport, read_only=settings.read_only,
                                   request_timeout=settings.request_timeout)

        runner = CliRunner()
        return runner.invoke(
            app, list(args), obj=CliState(connect=connect), input=input,
            env={"COLUMNS": "250", "KUBECONFIG": None, "DISPATCH_NAMESPACE": None, **(env or {})},
            catch_exceptions=False,
        )

    def json(self, *args: str) -> Any:
        result = self("-o", "json", *args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def stepping(self, seconds: float = 1.0) -> None:
        """From now on every API request first moves the clock and steps every controller once."""

        def hook(method: str, path: str) -> None:
            self.cluster.advance(seconds)
            self.cluster.step()

        self.cluster.server.before_request = hook

