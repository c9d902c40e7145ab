"""The real node's Python image, without the testbed: it carries everything a fenced process loads.

The image is unpacked into a directory and its command run there under ``chroot`` (root only), so nothing of
this machine's filesystem is in reach: two real processes of ``dispatch.fence`` (A=1, then A=2, then A=1
again) on one checkpoint location inside it, judged by their reports and the log they left.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dispatch.testbed import _pyimage
from dispatch.testbed._node import _arch


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pyimage")
    _, size = _pyimage.archive(tmp / "image.tar", _arch())
    root = tmp / "rootfs"
    root.mkdir()
    with tarfile.open(tmp / "image.tar") as outer:
        index = json.loads(outer.extractfile("index.json").read())  # type: ignore[union-attr]

        def blob(digest: str) -> bytes:
            return outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}").read()  # type: ignore[union-attr]

        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        assert config["config"]["Entrypoint"] == _pyimage.entrypoint()
        (root / "image-config.json").write_text(json.dumps(config["config"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as t:
                t.extractall(root, filter="tar")
    assert size < 200 * 2**20, f"the image holds {size} bytes: more than the interpreter and what it loads"
    return root


def test_the_image_holds_the_fence_and_the_script_but_no_site_packages(rootfs: Path) -> None:
    assert (rootfs / "app/dispatch/fence.py").read_bytes() == \
        (Path(_pyimage.__file__).parents[1] / "fence.py").read_bytes()
    assert (rootfs / _pyimage.SCRIPT.lstrip("/")).is_file()
    assert not list(rootfs.rglob("site-packages")), "only the stdlib and dispatch: no third-party package"
    assert not (rootfs / "app/dispatch/_kube.py").exists(), "the fence loads no Kubernetes client"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chroot") is None, reason="chroot needs root")
def test_two_executions_fence_one_location_inside_the_image_alone(rootfs: Path) -> None:
    config = json.loads((rootfs / "image-config.json").read_text())
    base = dict(e.split("=", 1) for e in config["Env"])
    (rootfs / "out").mkdir()

    def run(admission: int, steps: int) -> int:
        env = {**base, "DISPATCH_NAMESPACE": "team-a",
               "DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1", "DISPATCH_ADMISSION": str(admission),
               "CHECKPOINT_ROOT": "/ckpt", "ORACLE_FILE": "/out/oracle.log", "FENCE_REPORT": "/out/fence.jsonl",
               "STEPS": str(steps), "COMMIT_EVERY": "0"}
        chroot = str(shutil.which("chroot"))
        done = subprocess.run([chroot, str(rootfs), *config["Entrypoint"]], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode in (0, 3), done.stderr
        return done.returncode

    assert run(1, 3) == 0
    assert run(2, 5) == 0
    assert run(1, 9) == 3, "the stale execution is refused at its claim"
    events = [json.loads(line) for line in (rootfs / "out/fence.jsonl").read_text().splitlines()]
    assert [(e["event"], e["a"]) for e in events if e["event"] != "commit"] == \
        [("claim", 1), ("claim", 2), ("refused", 1)]
    assert next(e for e in events if e["event"] == "claim" and e["a"] == 2)["resume"]["step"] == 2
    assert [e["step"] for e in events if e["event"] == "commit" and e["a"] == 2] == [3, 4]
    log = sorted((rootfs / "ckpt/team-a/llama/s1/log").iterdir())
    assert [json.loads(p.read_text())["admission"] for p in log] == [1, 1, 1, 1, 2, 2, 2]
