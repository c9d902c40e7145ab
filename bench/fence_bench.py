"""Cost of fencing a checkpoint: time per ``Fence.commit`` against a plain write of the same files.

For each store and payload size, ``--rounds`` (default 30) checkpoints of one file:

* POSIX (a directory under ``--dir``): *plain* is the durable write a careful trainer does anyway (a new
  directory, the file written and ``fsync``-ed, the directories ``fsync``-ed); *fenced* is ``commit``
  writing the same file (that work, plus two log reads, a log entry made by ``link`` and ``fsync``-ed, and
  one more read);
* S3 (a MinIO server started here from the binary ``scripts/build-minio`` built): *plain* is one
  ``upload_file``; *fenced* is ``commit`` (the upload, plus two ``GetObject`` that find no entry, one
  conditional ``PutObject`` and the first use's two-request probe, amortised over the rounds).

Also the claim of a new execution when the log already holds ``--history`` (default 1000) entries: it
reads from the newest snapshot (one every 100 entries), after finding the log's end in about 2·log2 reads;
``reads`` is how many it made.

And, if fsspec is installed, a library-style save (``tmp-checkpoint-<i>/payload`` written, then the
directory renamed to ``checkpoint-<i>``) through ``FencedFileSystem`` against the same calls on the bare
filesystem it wraps (fsspec's local one; s3fs on MinIO, if s3fs is installed), reported as ``ratio``
(fenced / unfenced). The fenced save adds the claim check on each write, the ``fsync`` of the files on a
directory, and the commit entry; on S3 the bare rename is a copy and a delete, the fenced one an entry.

Run: ``python -m bench.fence_bench [--rounds 30] [--dir DIR] [--no-s3]``; prints one JSON object (medians
in milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dispatch.fence import Fence

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"4KiB": 4 << 10, "16MiB": 16 << 20}


def durable_write(directory: Path, data: bytes) -> None:
    with (directory / "payload").open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def median_ms(run: Callable[[int], None], rounds: int) -> float:
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        run(i)
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


def posix(base: Path, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, size in SIZES.items():
        data = os.urandom(size)
        plain_root = base / f"plain-{label}"
        plain_root.mkdir(parents=True)

        def plain(i: int, root: Path = plain_root, data: bytes = data) -> None:
            d = root / f"step-{i}"
            d.mkdir()
            durable_write(d, data)
            fsync_dir(d)
            fsync_dir(root)

        fence = Fence.at(base / "fenced", "bench", label, 1, namespace="bench")
        fence.claim()

        def fenced(i: int, fence: Fence = fence, data: bytes = data) -> None:
            fence.commit(i, lambda d: durable_write(d, data))

        out[label] = {"plain_ms": median_ms(plain, rounds), "fenced_ms": median_ms(fenced, rounds)}
        out[label]["extra_ms"] = round(out[label]["fenced_ms"] - out[label]["plain_ms"], 2)
    return out


def history(root: str, entries: int, client: Any = None) -> dict[str, float]:
    writer = Fence.at(root, "bench", "history", 1, namespace="bench", s3_client=client)
    writer.claim()
    for i in range(entries - 1):
        writer._append("claim")  # a long log of cheap entries
        del i
    start = time.perf_counter()
    newer = Fence.at(root, "bench", "history", 2, namespace="bench", s3_client=client)
    newer.claim()
    return {"entries": entries, "new_execution_claim_ms": round((time.perf_counter() - start) * 1000, 1),
            "reads": newer.reads}


def fsspec_saves(root: str, rounds: int, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Fenced vs unfenced library-style saves through fsspec (None if fsspec is not installed)."""
    try:
        from fsspec.core import url_to_fs

        from dispatch.fencefs import FencedFileSystem
    except ImportError:
        return None
    out: dict[str, Any] = {}
    for label, size in SIZES.items():
        data = os.urandom(size)
        bare, base = url_to_fs(f"{root}/plain-{label}", **(options or {}))

        def unfenced(i: int, bare: Any = bare, base: str = base, data: bytes = data) -> None:
            bare.makedirs(f"{base}/tmp-checkpoint-{i}", exist_ok=True)  # as a library does (no-op on S3)
            bare.pipe_file(f"{base}/tmp-checkpoint-{i}/payload", data)
            if base.startswith("/"):  # a directory: one rename
                bare.mv(f"{base}/tmp-checkpoint-{i}", f"{base}/checkpoint-{i}", recursive=True)
            else:  # S3 has no directories: each object is copied and deleted
                bare.mv(f"{base}/tmp-checkpoint-{i}/payload", f"{base}/checkpoint-{i}/payload")

        fenced_fs = FencedFileSystem.at(f"{root}/fenced-{label}", "bench", label, 1, namespace="bench",
                                        storage_options=options)

        def fenced(i: int, fs: Any = fenced_fs, data: bytes = data) -> None:
            fs.pipe_file(f"tmp-checkpoint-{i}/payload", data)
            fs.mv(f"tmp-checkpoint-{i}", f"checkpoint-{i}")

        if base.startswith("/"):
            Path(base).mkdir(parents=True, exist_ok=True)
        out[label] = {"unfenced_ms": median_ms(unfenced, rounds), "fenced_ms": median_ms(fenced, rounds)}
        out[label]["ratio"] = round(out[label]["fenced_ms"] / out[label]["unfenced_ms"], 2)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3(rounds: int, entries: int) -> dict[str, Any]:
    import boto3

    binary = subprocess.run([str(ROOT / "scripts" / "build-minio")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "MINIO_ROOT_USER": "bench", "MINIO_ROOT_PASSWORD": "bench-secret",
               "MINIO_BROWSER": "off"}
        server = subprocess.Popen([binary, "server", data_dir, "--address", f"127.0.0.1:{port}",
                                   "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=1):
                        break
                except OSError:
                    time.sleep(0.1)
            client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench",
                                  aws_secret_access_key="bench-secret", region_name="us-east-1")
            client.create_bucket(Bucket="bench")
            out: dict[str, Any] = {}
            with tempfile.TemporaryDirectory() as tmp:
                for label, size in SIZES.items():
                    local = Path(tmp) / f"{label}.bin"
                    local.write_bytes(os.urandom(size))
                    data = local.read_bytes()

                    def plain(i: int, local: Path = local, label: str = label) -> None:
                        client.upload_file(str(local), "bench", f"plain/{label}/step-{i}/payload")

                    fence = Fence.at(f"s3://bench/fenced-{label}", "bench", label, 1, namespace="bench",
                                      s3_client=client)
                    fence.claim()

                    def fenced(i: int, fence: Fence = fence, data: bytes = data) -> None:
                        fence.commit(i, lambda d: (d / "payload").write_bytes(data))

                    out[label] = {"plain_ms": median_ms(plain, rounds), "fenced_ms": median_ms(fenced, rounds)}
                    out[label]["extra_ms"] = round(out[label]["fenced_ms"] - out[label]["plain_ms"], 2)
            out["history"] = history("s3://bench/history", entries, client)
            try:
                import s3fs  # noqa: F401

                options = {"key": "bench", "secret": "bench-secret",
                           "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
                out["fsspec"] = fsspec_saves("s3://bench/fsspec", rounds, options)
            except ImportError:
                out["fsspec"] = None
            return out
        finally:
            server.terminate()
            server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--history", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="where the POSIX checkpoints go (default: a temp dir)")
    parser.add_argument("--no-s3", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        result: dict[str, Any] = {"posix": posix(Path(base), args.rounds)}
        result["posix"]["history"] = history(str(Path(base) / "history"), args.history)
        result["posix"]["fsspec"] = fsspec_saves(str(Path(base) / "fsspec"), args.rounds)
    if not args.no_s3:
        result["s3"] = s3(args.rounds, args.history)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
