"""A trainer saving through the fenced fsspec filesystem, run as a real process by the race tests.

Usage: python _fs_writer.py ROOT RESULT STEPS SIZE STORAGE_OPTIONS_JSON GO_FILE

Each step writes ``tmp-checkpoint-<step>/model.bin`` (SIZE bytes saying its A and step) and ``meta.json``,
renames the directory to ``checkpoint-<step>`` (the commit, as Hugging Face's Trainer publishes one) and keeps
the last two checkpoints. It stops at the first ``Fenced``; RESULT gets what it did (unless it is killed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dispatch.fence import Fenced
from dispatch.fencefs import FencedFileSystem


def model(admission: int, step: int, size: int) -> bytes:
    unit = f"A={admission} step={step};".encode()
    return (unit * (size // len(unit) + 1))[:size]


def main() -> int:
    root, result, steps, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    options, go = json.loads(sys.argv[5]), Path(sys.argv[6])
    admission = int(os.environ["DISPATCH_ADMISSION"])
    fs = FencedFileSystem.from_env(root, storage_options=options)
    while not go.exists():
        time.sleep(0.001)
    out: dict[str, object] = {"admission": admission, "committed": [], "fenced": None}
    committed: list[int] = []
    out["committed"] = committed
    try:
        resume = fs.resume()  # a trainer goes on from the newest checkpoint of the highest A
        out["resume"] = resume
        first = 0 if resume is None else int(resume.rsplit("-", 1)[1]) + 1
        for step in range(first, first + steps):
            with fs.open(f"tmp-checkpoint-{step}/model.bin", "wb") as f:
                f.write(model(admission, step, size))
            fs.pipe_file(f"tmp-checkpoint-{step}/meta.json", json.dumps({"A": admission, "step": step}).encode())
            fs.mv(f"tmp-checkpoint-{step}", f"checkpoint-{step}")
            committed.append(step)
            fs.rotate(2)
    except Fenced as err:
        out["fenced"] = str(err)
        out["newer"] = err.newer
    result.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
