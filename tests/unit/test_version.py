"""One source of the version: ``dispatch.__version__``, shown by the CLI and the controller's metrics."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import httpx2
from prometheus_client import generate_latest
from typer.testing import CliRunner

import dispatch
from dispatch.cli import app
from dispatch.controller._http import serve
from dispatch.controller._metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", dispatch.__version__), dispatch.__version__


def test_dispatch_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"], prog_name="dispatch")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"dispatch {dispatch.__version__}\n"


def test_build_info_gauge_carries_the_package_version() -> None:
    text = generate_latest(Metrics.create().registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("dispatch_build_info{")]
    assert lines == [f'dispatch_build_info{{version="{dispatch.__version__}"}} 1.0']


async def test_metrics_endpoint_serves_the_build_info_gauge() -> None:
    metrics = Metrics.create()
    server = await serve("127.0.0.1", 0, healthz=lambda: (True, "ok"), readyz=lambda: (True, "ok"),
                         registry=metrics.registry)
    try:
        port = server.sockets[0].getsockname()[1]
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            body = (await http.get("/metrics")).text
    finally:
        server.close()
        await server.wait_closed()
    assert f'dispatch_build_info{{version="{dispatch.__version__}"}} 1.0' in body.splitlines()


def test_the_package_metadata_reads_its_version_from_dispatch() -> None:
    """A second literal version in pyproject.toml would drift from ``dispatch.__version__``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dispatch.__version__"}
