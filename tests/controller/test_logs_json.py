"""The controller's stderr stays JSON lines, also when it is stopped during an API outage.

The container's log pipeline parses each line as one JSON object; a bare Python traceback breaks it. The
controller runs as the image runs it (``python -m dispatch.controller``, leader election and the guard on)
against an API server that cannot be reached, and gets SIGTERM while nothing has synced.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
import yaml

from dispatch.controller import configure_logging
from dispatch.testbed.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def unreachable_kubeconfig(path: Path) -> Path:
    port = free_port()          # nothing listens there
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
        "current-context": "c"}))
    return path


def test_a_stop_during_an_api_outage_logs_only_json(tmp_path: Path) -> None:
    probes = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatch.controller", "--kubeconfig", str(unreachable_kubeconfig(tmp_path / "kc")),
         "--leader-elect", "--lease-namespace", "default", "--metrics-port", str(probes), "--guard-port", "0",
         "--guard-cert-dir", str(tmp_path / "certs")],
        stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    seen: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: seen.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        # The informers, the Lease and the guard's publisher all fail meanwhile: wait for the first failure
        # logged (the loop runs), however slow the start on a loaded machine, then stop it.
        deadline = time.monotonic() + 120
        while not any("list/watch failed" in line for line in list(seen)) and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(seen)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(seen)
    assert proc.returncode == 0, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    bare = [line for line in lines if not line.startswith("{")]
    assert bare == [], "\n".join(bare[:20])
    events = [json.loads(line) for line in lines]
    assert {"list/watch failed", "controller stopped"} <= {e["msg"] for e in events}
    assert not [e for e in events if "event" in e or "message" in e]     # the message is under msg alone
    assert not [e for e in events if "Traceback" in json.dumps(e)]


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers, root.level = handlers, level
        structlog.reset_defaults()


def test_the_standard_librarys_records_are_json_too(capsys: pytest.CaptureFixture[str],
                                                    restored_logging: None) -> None:
    configure_logging("info")
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=True)
    logging.getLogger("asyncio").debug("below the level")
    logging.getLogger("httpx").info("HTTP Request: GET ...")      # a library's chatter: only warnings and worse
    [line] = capsys.readouterr().err.splitlines()
    got = json.loads(line)
    assert (got["msg"], got["level"], got["logger"]) == ("Task exception was never retrieved", "error", "asyncio")
    assert "event" not in got and "message" not in got
    assert got["exception"].startswith("Traceback") and got["exception"].endswith("ZeroDivisionError: division by zero")


def test_the_message_is_under_msg_and_nothing_else_is(capsys: pytest.CaptureFixture[str],
                                                      restored_logging: None) -> None:
    """Log pipelines (Loki, Elasticsearch, Kubernetes' own klog JSON) take one key for the line's message;
    a field a caller names ``message`` or ``msg`` (a check's message, a denial) must not pass for it."""
    configure_logging("info")
    log = structlog.get_logger("dispatch.controller")
    log.info("admission waits", workload="ns/w", check_message="waiting for pods of the previous execution")
    log.info("guard denied", message="a pod of the previous execution may still run", msg="not the message")
    waits, denied = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert waits["msg"] == "admission waits" and waits["check_message"].startswith("waiting for pods")
    assert denied["msg"] == "guard denied"
    moved = {v for key, v in denied.items() if key.startswith("detail")}
    assert moved == {"a pod of the previous execution may still run", "not the message"}
    for got in (waits, denied):
        assert "event" not in got and "message" not in got


STOPPED_WHILE_STARTING = """
import signal, sys
import dispatch.controller as c
from dispatch.controller.__main__ import main
logging_configured = c.configure_logging
def configure_then_stopped(level):
    logging_configured(level)
    signal.raise_signal(signal.SIGTERM)    # the kubelet stops the pod before the event loop runs
c.configure_logging = configure_then_stopped
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_while_it_starts_is_a_clean_stop(tmp_path: Path) -> None:
    """SIGTERM before the event loop's handlers exist (a pod stopped while it starts) exits 0, in JSON lines."""
    proc = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_STARTING, "--kubeconfig", str(unreachable_kubeconfig(tmp_path / "kc")),
         "--metrics-port", str(free_port())],
        stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.strip()]
    assert "controller stopped" in {e["msg"] for e in events}
