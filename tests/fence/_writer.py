"""A training process in miniature, run as a real process by the race tests.

Usage: python _writer.py ROOT RESULT STEPS INTERVAL [GO_FILE] [STARTED_FILE]

Reads its execution from DISPATCH_JOB_ID, DISPATCH_SUBMISSION and DISPATCH_ADMISSION, waits for GO_FILE to
exist (if given), claims ROOT, writes STARTED_FILE after its first commit (if given), then commits STEPS
checkpoints INTERVAL seconds apart, each a file ``payload`` naming its A and step. It stops at the first
``Fenced`` and writes what it did to RESULT as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from dispatch.fence import Fence, Fenced


def save(payload: str, directory: Path) -> None:
    (directory / "payload").write_text(payload)


def main() -> int:
    root, result, steps, interval = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    go = Path(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else None
    started = Path(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] else None
    admission = int(os.environ["DISPATCH_ADMISSION"])
    while go is not None and not go.exists():
        time.sleep(0.001)
    out: dict[str, object] = {"admission": admission, "committed": [], "fenced": None, "claimed": False}
    committed: list[list[int]] = []
    out["committed"] = committed
    try:
        fence = Fence.from_env(root)
        fence.snapshot_every = int(os.environ.get("FENCE_SNAPSHOT_EVERY", fence.snapshot_every))
        resume = fence.claim()
        out["claimed"] = True
        out["resume"] = None if resume is None else [resume.admission, resume.step]
        for step in range(steps):
            checkpoint = fence.commit(step, functools.partial(save, f"A={admission} step={step}"))
            committed.append([step, checkpoint.seq])
            if started is not None and step == 0:
                started.write_text("1")
            time.sleep(interval)
    except Fenced as err:
        out["fenced"] = str(err)
        out["newer"] = err.newer
    result.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
