"""``dispatch demo`` end to end on the local real control plane."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

pytestmark = pytest.mark.testbed


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
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
    assert "acting as a dispatch-writer of dispatch-demo-" in text  # the shipped roles, as installed
    assert "A=2" in text
    assert "Ready=Unknown" in text
    assert "ceased=false" in text
    assert "ceased=true" in text


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
def test_demo_on_the_real_node_keeps_the_promise_as_the_processes_tell_it(testbed_kubeconfig: str) -> None:
    import os

    from dispatch import testbed
    from dispatch.cli._demo import run_demo

    if testbed.real_node() is None:
        why = testbed.real_node_problem() or "unknown"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the testbed has no real node: {why}")
        pytest.skip(f"the testbed has no real node: {why}")
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=False)
    try:
        run_demo(console, step_timeout=180.0, real_node=True)
    finally:
        print(buffer.getvalue())
    text = buffer.getvalue()
    assert "The promise held" in text
    # what the processes wrote: A=1 ended (with SIGTERM) before A=2 of the same submission started
    assert "process oracle (A=1 got SIGTERM" in text and "A=2 pid" in text
    assert "ceased=false" in text and "ceased=true" in text
