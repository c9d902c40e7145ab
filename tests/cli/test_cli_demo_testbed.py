"""``dispatch demo`` end to end on the local real control plane."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

pytestmark = pytest.mark.testbed


def test_demo_keeps_the_promise(testbed_kubeconfig: str) -> None:
    from dispatch.cli._demo import run_demo

    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    try:
        run_demo(console, step_timeout=180.0)
    finally:
        print(buffer.getvalue())
    text = buffer.getvalue()
    assert "The promise held" in text
    assert "A=2" in text
    assert "Ready=Unknown" in text
    assert "ceased=false" in text
    assert "ceased=true" in text
