"""Real processes racing on one checkpoint location: A=1 writing on while A=2 starts, and four at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ._log import counting, read_log
from .conftest import Location

WRITER = Path(__file__).with_name("_writer.py")


def start(location: Location, admission: int, result: Path, steps: int, interval: float,
          go: Path | None = None, started: Path | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **location.env, "DISPATCH_NAMESPACE": "team-a", "DISPATCH_JOB_ID": "llama",
           "DISPATCH_SUBMISSION": "s1", "DISPATCH_ADMISSION": str(admission)}
    argv = [sys.executable, str(WRITER), location.root, str(result), str(steps), str(interval),
            str(go or ""), str(started or "")]
    return subprocess.Popen(argv, env=env)


def finish(process: subprocess.Popen[bytes], result: Path) -> dict[str, Any]:
    assert process.wait(timeout=120) == 0
    out: dict[str, Any] = json.loads(result.read_text())
    return out


def read_payload(location: Location, data: str) -> str:
    store = location.fence(99).store
    with store.open_data(data) as directory:
        return (directory / "payload").read_text()


def test_a_stale_writer_is_fenced_once_the_newer_execution_claims(location: Location, tmp_path: Path) -> None:
    """The seed's hazard: A=1 still writes when A=2 starts on the same path."""
    started = tmp_path / "a1-started"
    old = start(location, 1, tmp_path / "a1.json", steps=10_000, interval=0.002, started=started)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert old.poll() is None and time.monotonic() < deadline, "A=1 did not start committing"
        time.sleep(0.01)
    time.sleep(0.2)  # A=1 keeps committing
    new = start(location, 2, tmp_path / "a2.json", steps=15, interval=0.0)
    a2 = finish(new, tmp_path / "a2.json")
    a1 = finish(old, tmp_path / "a1.json")

    # A=1 was refused, loudly, naming both executions; A=2 was never refused
    assert a1["fenced"] and "execution A=1 may not commit" in a1["fenced"] and "A=2 has claimed" in a1["fenced"]
    assert a1["newer"] == 2 and a2["fenced"] is None and len(a2["committed"]) == 15
    entries = read_log(location.fence(99).store)
    claim2 = next(e.seq for e in entries if e.kind == "claim" and e.admission == 2)
    # every commit A=1 was told succeeded precedes A=2's claim; every A=1 commit entry after it does not count
    assert a1["committed"] and all(seq < claim2 for _step, seq in a1["committed"])
    assert [e.seq for e in counting(entries)] == sorted(seq for r in (a1, a2) for _step, seq in r["committed"])
    # A=2 resumed from A=1's newest checkpoint that counted when it claimed
    assert a2["resume"] == [1, a1["committed"][-1][0]]
    # A=2's checkpoints are intact: each holds what A=2 wrote
    by_seq = {e.seq: e for e in entries}
    for step, seq in a2["committed"]:
        assert read_payload(location, by_seq[seq].data) == f"A=2 step={step}"
    # the next execution resumes from A=2's newest
    resume = location.fence(3).claim()
    assert resume is not None and (resume.admission, resume.step) == (2, 14)


@pytest.mark.parametrize("kind", ["posix", pytest.param("s3", marks=pytest.mark.minio)])
def test_four_executions_started_at_once(kind: str, make_location: Any, tmp_path: Path) -> None:
    """A=1..4 released together; whatever the interleaving, only commits before a higher claim count."""
    location: Location = make_location(kind)
    go = tmp_path / "go"
    runs = [(a, tmp_path / f"a{a}.json") for a in (1, 2, 3, 4)]
    processes = [(start(location, a, result, steps=25, interval=0.001, go=go), result) for a, result in runs]
    time.sleep(0.5)  # let every interpreter reach the start line
    go.write_text("go")
    results = {r["admission"]: r for r in (finish(p, result) for p, result in processes)}

    entries = read_log(location.fence(99).store)
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    told_ok = sorted(seq for r in results.values() for _step, seq in r["committed"])
    # a writer is told its commit succeeded exactly when its entry counts
    assert [e.seq for e in counting(entries)] == told_ok
    for admission, result in results.items():
        higher_claims = [e.seq for e in entries if e.kind == "claim" and e.admission > admission]
        for _step, seq in result["committed"]:
            assert all(seq < h for h in higher_claims)
        if result["fenced"]:
            assert result["newer"] > admission
        for step, seq in result["committed"]:
            assert read_payload(location, entries[seq - 1].data) == f"A={admission} step={step}"
    assert not results[4]["fenced"] and len(results[4]["committed"]) == 25
    resume = location.fence(5).claim()
    assert resume is not None and (resume.admission, resume.step) == (4, 24)
