"""Fixtures of the fence tests: a fenced location on each store, the S3 one on a real MinIO server.

The MinIO server is built from its Go module by ``scripts/build-minio`` (cached outside the repository),
started on a free loopback port for the session, and stopped after it. Without it the S3 tests skip, except
under CI (``CI=true``), where a server that cannot be built or started fails them.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch.fence import Fence

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD, BUCKET = "fence-test", "fence-test-secret", "checkpoints"
NAMESPACE = "team-a"


def unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: the S3 fence tests must run)")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Minio:
    endpoint: str
    env: dict[str, str]
    """What a process needs to reach the server with boto3's defaults."""

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=USER,
                            aws_secret_access_key=PASSWORD, region_name="us-east-1")


@pytest.fixture(scope="session")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Minio]:
    try:
        import boto3  # noqa: F401
    except ImportError:
        unavailable("boto3 is not installed (pip install -e '.[test]')")
    started = time.monotonic()
    build = subprocess.run([str(ROOT / "scripts" / "build-minio")], capture_output=True, text=True)
    if build.returncode != 0:
        unavailable(f"MinIO could not be built: {build.stderr[-2000:]}")
    binary = build.stdout.strip().splitlines()[-1]
    built = time.monotonic() - started
    port, console = free_port(), free_port()
    data = tmp_path_factory.mktemp("minio")
    log = (data.parent / "minio.log").open("wb")
    env = {**os.environ, "MINIO_ROOT_USER": USER, "MINIO_ROOT_PASSWORD": PASSWORD, "MINIO_BROWSER": "off",
           "MINIO_UPDATE": "off"}
    server = subprocess.Popen([binary, "server", str(data), "--address", f"127.0.0.1:{port}",
                               "--console-address", f"127.0.0.1:{console}", "--quiet"],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                unavailable(f"MinIO did not start: {(data.parent / 'minio.log').read_text()[-2000:]}")
            time.sleep(0.1)
        print(f"\nMinIO: build step {built:.1f} s, started in {time.monotonic() - started - built:.1f} s")
        server_env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": USER, "AWS_SECRET_ACCESS_KEY": PASSWORD,
                      "AWS_DEFAULT_REGION": "us-east-1"}
        minio = Minio(endpoint, server_env)
        minio.client().create_bucket(Bucket=BUCKET)
        yield minio
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@dataclass(frozen=True)
class Location:
    """A fresh fenced location: ``root`` for ``Fence.at``/``from_env``, plus what a process needs to reach it."""

    kind: str
    root: str
    env: dict[str, str]
    client: Any = None

    def fence(self, admission: int) -> Fence:
        return Fence.at(self.root, "llama", "s1", admission, namespace=NAMESPACE, s3_client=self.client)


def posix_location(tmp_path: Path) -> Location:
    return Location("posix", str(tmp_path / "ckpt"), {})


def s3_location(minio: Minio) -> Location:
    return Location("s3", f"s3://{BUCKET}/{secrets.token_hex(6)}", minio.env, minio.client())


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.minio)])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "posix":
        return posix_location(tmp_path)
    return s3_location(request.getfixturevalue("minio"))


@pytest.fixture
def make_location(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Location]:
    """A second fresh location of a kind, for tests that need several."""
    count = iter(range(1_000_000))

    def make(kind: str) -> Location:
        if kind == "posix":
            return posix_location(tmp_path / f"l{next(count)}")
        return s3_location(request.getfixturevalue("minio"))

    return make
