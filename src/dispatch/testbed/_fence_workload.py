"""The real node's fenced training process: ``dispatch.fence`` in a real container, judged by what it wrote.

Copied into the testbed's Python image (:mod:`dispatch.testbed._pyimage`) as a script and run there with the
image's own interpreter and the project's own ``dispatch`` package, so the process on the node runs the very
fence a user imports (``from dispatch import Fence``), not a second implementation of its protocol.

It claims ``$CHECKPOINT_ROOT/<namespace>/<job-id>/<submission>/`` for its ``DISPATCH_ADMISSION``, resumes from
the newest checkpoint that counts, and commits one checkpoint (a file ``payload`` naming its A, step and pid) every
``COMMIT_EVERY`` seconds. Two records of what it did go to host directories the test reads:

* the process oracle's lines (``ORACLE_FILE``, the format of ``testbed/images/workload``: START, TICK per
  commit attempt, TERM, EXIT), so :mod:`dispatch.testbed.oracle` sees when the process was alive;
* one JSON line per fence event (``FENCE_REPORT``): ``claim`` (with the resumed checkpoint), ``commit``
  (step, log sequence, time), ``fenced`` (the step refused, the newer A), ``refused`` (a claim refused).

A stale process stops at its first ``Fenced``, as the how-to says a trainer should; ``FENCED_TRIES=N`` makes it
try ``N`` more commits first, so a test sees that every one of them is refused too. ``LINGER=1`` ignores
SIGTERM (a process that only SIGKILL ends, as on a node whose kubelet lost track of it).

``--trace OUT`` runs one claim and one commit in a scratch directory and writes the files the interpreter
loaded (modules and shared objects) to ``OUT`` as JSON: what the image must carry.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatch.fence import Fence, Fenced


class _Out:
    """Appends whole lines (one ``write`` on an ``O_APPEND`` file each), so processes can share a file."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, text: str) -> None:
        os.write(self.fd, (text + "\n").encode())


def _field(v: str) -> str:
    if not v:
        return "-"
    for a, b in (("%", "%25"), (" ", "%20"), ("=", "%3D"), ("\n", "%0A"), ("\t", "%09")):
        v = v.replace(a, b)
    return v


def _proc(path: str, pick: Any) -> str:
    try:
        return str(pick(Path(path)))
    except (OSError, IndexError, ValueError):
        return "-"


class _Oracle:
    """The process oracle's line format, as the Go workload writes it."""

    def __init__(self, out: _Out, env: dict[str, str]) -> None:
        self.out, self.seq = out, 0
        start = _proc("/proc/self/stat", lambda p: p.read_text().rsplit(")", 1)[1].split()[19])
        pidns = _proc("/proc/self/ns/pid", lambda p: os.readlink(p).removeprefix("pid:[").removesuffix("]"))
        self.prefix = (f"dispatch-oracle/1 job={_field(env.get('DISPATCH_JOB_ID', ''))} "
                       f"submission={_field(env.get('DISPATCH_SUBMISSION', ''))} "
                       f"a={_field(env.get('DISPATCH_ADMISSION', ''))} pod={_field(env.get('POD_NAME', ''))} "
                       f"pid={os.getpid()} pidns={pidns} start={start} run={secrets.token_hex(8)}")

    def event(self, name: str, extra: str = "") -> None:
        self.seq += 1
        self.out.line(f"{self.prefix} seq={self.seq} ms={int(time.time() * 1000)} event={name}{extra}")


def save(payload: str, directory: Path) -> None:
    (directory / "payload").write_text(payload)


def run(env: dict[str, str]) -> int:
    """The training loop; returns the exit status (0: stopped by the step limit, 3: fenced)."""
    oracle = _Oracle(_Out(env.get("ORACLE_FILE", "/oracle/oracle.log")), env)
    report = _Out(env.get("FENCE_REPORT", "/oracle/fence.jsonl"))
    admission, pid = int(env.get("DISPATCH_ADMISSION", "0") or 0), os.getpid()

    def note(event: str, **fields: object) -> None:
        report.line(json.dumps({"event": event, "a": admission, "pid": pid, "ms": int(time.time() * 1000),
                                **fields}, sort_keys=True))

    if env.get("LINGER") == "1":
        signal.signal(signal.SIGTERM, lambda *_: oracle.event("TERM", " signal=terminated"))
    oracle.event("START", f" cmd={_field(Path(sys.argv[0]).name)}")
    every = float(env.get("COMMIT_EVERY", "0.1"))
    steps = int(env.get("STEPS", "0"))  # 0: no limit
    tries = int(env.get("FENCED_TRIES", "0"))
    fence = Fence.from_env(env.get("CHECKPOINT_ROOT", "/checkpoints"), environ=env)
    try:
        resume = fence.claim()
    except Fenced as err:
        note("refused", newer=err.newer, error=str(err))
        oracle.event("EXIT", " code=3")
        return 3
    note("claim", seq=fence._claim_seq,
         resume=None if resume is None else {"a": resume.admission, "step": resume.step, "seq": resume.seq})
    step = 0 if resume is None else resume.step + 1
    refused = 0
    while steps == 0 or step < steps:
        oracle.event("TICK")
        payload = f"A={admission} step={step} pid={pid}"
        try:
            checkpoint = fence.commit(step, functools.partial(save, payload))
        except Fenced as err:
            note("fenced", step=step, newer=err.newer, error=str(err))
            refused += 1
            if refused > tries:
                oracle.event("EXIT", " code=3")
                return 3
        else:
            note("commit", step=step, seq=checkpoint.seq, location=checkpoint.location)
        step += 1
        time.sleep(every)
    oracle.event("EXIT", " code=0")
    return 0


def trace(out: Path) -> None:
    """One claim and one commit in a scratch directory; then what the interpreter had loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"DISPATCH_NAMESPACE": "trace", "DISPATCH_JOB_ID": "trace", "DISPATCH_SUBMISSION": "s1",
               "DISPATCH_ADMISSION": "1",
               "CHECKPOINT_ROOT": f"{tmp}/ckpt", "ORACLE_FILE": f"{tmp}/oracle/oracle.log",
               "FENCE_REPORT": f"{tmp}/oracle/fence.jsonl", "STEPS": "1", "COMMIT_EVERY": "0",
               "LINGER": "1"}
        if run(env) != 0:
            raise SystemExit("the traced run failed")
    modules = sorted({str(m.__file__) for m in list(sys.modules.values())
                      if isinstance(getattr(m, "__file__", None), str)})
    with open("/proc/self/maps") as maps:
        shared = sorted({f.split()[-1] for f in maps if f.split()[-1].startswith("/") and ".so" in f})
    out.write_text(json.dumps({"executable": sys.executable, "version": list(sys.version_info[:2]),
                               "prefix": sys.base_prefix, "modules": modules, "shared": shared}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--trace":
        trace(Path(sys.argv[2]))
        sys.exit(0)
    sys.exit(run(dict(os.environ)))
