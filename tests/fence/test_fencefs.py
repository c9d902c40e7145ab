"""The fenced fsspec filesystem (issue 39): on a local directory and on a real MinIO server through s3fs, and
real processes racing on it, killed at random points."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatch.errors import InvalidInput, Refused
from dispatch.fence import Fenced

from ._log import counting, read_log
from .conftest import BUCKET, PASSWORD, USER, Minio, unavailable

WRITER = Path(__file__).with_name("_fs_writer.py")


def fencefs() -> Any:
    try:
        import fsspec  # noqa: F401

        from dispatch import fencefs as module
    except ImportError:
        unavailable("fsspec is not installed (pip install -e '.[test]')")
    return module


class FsLocation:
    """A fresh fenced root for the filesystem, plus how a process reaches it."""

    def __init__(self, kind: str, root: str, options: dict[str, Any]) -> None:
        self.kind, self.root, self.options = kind, root, options

    def fs(self, admission: int, namespace: str = "team-a") -> Any:
        return fencefs().FencedFileSystem.at(self.root, "llama", "s1", admission, namespace=namespace,
                                             storage_options=self.options)


def s3_options(minio: Minio) -> dict[str, Any]:
    try:
        import s3fs  # noqa: F401
    except ImportError:
        unavailable("s3fs is not installed (pip install -e '.[test]')")
    return {"key": USER, "secret": PASSWORD, "client_kwargs": {"endpoint_url": minio.endpoint,
                                                               "region_name": "us-east-1"}}


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.minio)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> FsLocation:
    fencefs()
    if request.param == "posix":
        return FsLocation("posix", str(tmp_path / "ckpt"), {})
    options = s3_options(request.getfixturevalue("minio"))
    return FsLocation("s3", f"s3://{BUCKET}/fs-{secrets.token_hex(6)}", options)


def save_hf_style(fs: Any, step: int, text: str) -> None:
    """What Hugging Face's Trainer does: write a temporary checkpoint directory, then rename it into place."""
    fs.pipe_file(f"tmp-checkpoint-{step}/model.bin", text.encode())
    with fs.open(f"tmp-checkpoint-{step}/config.json", "wb") as f:
        f.write(json.dumps({"step": step}).encode())
    fs.mv(f"tmp-checkpoint-{step}", f"checkpoint-{step}")


def test_a_stale_execution_can_write_rename_or_delete_nothing_visible(where: FsLocation) -> None:
    old = where.fs(1)
    for step in (1, 2, 3):
        save_hf_style(old, step, f"A=1 step={step}")
    assert old.ls("", detail=False) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert old.cat_file("checkpoint-2/model.bin") == b"A=1 step=2"
    # A=2 claims on its first write, not before: reading is free and never fenced
    new = where.fs(2)
    assert new.resume() == "checkpoint-3" and new.cat_file("checkpoint-3/model.bin") == b"A=1 step=3"
    assert not new.fence.claimed
    new.pipe_file("tmp-checkpoint-4/model.bin", b"A=2 step=4")
    assert new.fence.claimed
    # the stale execution: every write, rename and delete is refused, naming both A values
    attempts: list[Callable[[], object]] = [lambda: old.pipe_file("tmp-checkpoint-9/model.bin", b"stale"),
                    lambda: old.open("checkpoint-3/extra", "wb"),
                    lambda: old.rm("checkpoint-1", recursive=True),
                    lambda: old.rotate(1),
                    lambda: old.mkdir("tmp-checkpoint-9")]
    for attempt in attempts:
        with pytest.raises(Fenced) as err:
            attempt()
        assert (err.value.admission, err.value.newer) == (1, 2)
        assert "execution A=1 may not" in str(err.value) and "execution A=2 has claimed it" in str(err.value)
    # ... and a stale reader still reads
    assert old.cat_file("checkpoint-1/model.bin") == b"A=1 step=1"
    # A=2's checkpoint being written is invisible to others until its rename
    assert where.fs(3).ls("", detail=False) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    new.pipe_file("tmp-checkpoint-4/config.json", b"{}")
    new.mv("tmp-checkpoint-4", "checkpoint-4")
    assert where.fs(3).resume() == "checkpoint-4"
    assert where.fs(3).cat_file("checkpoint-4/model.bin") == b"A=2 step=4"


def test_a_commit_that_raced_a_higher_claim_is_refused_and_its_files_never_visible(where: FsLocation) -> None:
    """The stale writer checked, then the newer execution claimed, then it renamed: the rename does not count."""
    old = where.fs(1)
    save_hf_style(old, 1, "A=1 step=1")
    old.pipe_file("tmp-checkpoint-2/model.bin", b"A=1 step=2")
    real_append = old.fence._append

    def newer_claims_then_append(kind: str, **fields: Any) -> int:
        if kind == "commit":  # after every check the stale writer makes, just before its commit entry
            where.fs(2).fence.claim()
        seq: int = real_append(kind, **fields)
        return seq

    old.fence._append = newer_claims_then_append
    with pytest.raises(Fenced) as err:
        old.mv("tmp-checkpoint-2", "checkpoint-2")
    assert err.value.newer == 2 and "may not commit checkpoint-2" in str(err.value)
    reader = where.fs(9)
    assert reader.ls("", detail=False) == ["checkpoint-1"] and reader.resume() == "checkpoint-1"
    entries = read_log(reader.fence.store)
    assert [(e.kind, e.admission) for e in entries] == [("claim", 1), ("commit", 1), ("claim", 2), ("commit", 1)]
    assert not reader.fs.exists(f"{reader.location}/{entries[-1].data}"), "a refused commit's files were removed"


def test_a_dcp_style_marker_rename_is_the_commit(where: FsLocation) -> None:
    """PyTorch Distributed Checkpoint's files: shards, then .metadata.tmp renamed to .metadata (the commit)."""
    fs = where.fs(1)
    for rank in (0, 1):
        with fs.open(f"step-100/__{rank}_0.distcp", "wb") as f:
            f.write(f"shard {rank}".encode())
    fs.pipe_file("step-100/.metadata.tmp", b"metadata")
    assert where.fs(2).ls("", detail=False) == [], "nothing is visible before the marker's rename"
    fs.mv("step-100/.metadata.tmp", "step-100/.metadata")
    reader = where.fs(2)
    assert reader.resume() == "step-100"
    assert sorted(reader.ls("step-100", detail=False)) == ["step-100/.metadata", "step-100/__0_0.distcp",
                                                          "step-100/__1_0.distcp"]
    assert reader.cat_file("step-100/.metadata") == b"metadata"
    assert reader.checkpoints()[-1].step == 100
    # the same names written again by a newer execution: its own prefix, and the newest commit is what is read
    newer = where.fs(2)
    with newer.open("step-100/__0_0.distcp", "wb") as f:
        f.write(b"shard 0 of A=2")
    newer.pipe_file("step-100/.metadata.tmp", b"metadata of A=2")
    assert where.fs(3).cat_file("step-100/__0_0.distcp") == b"shard 0", "A=2's rewrite is invisible until committed"
    newer.mv("step-100/.metadata.tmp", "step-100/.metadata")
    assert where.fs(3).cat_file("step-100/__0_0.distcp") == b"shard 0 of A=2"
    assert sorted(where.fs(3).ls("step-100", detail=False)) == ["step-100/.metadata", "step-100/__0_0.distcp"]


def test_rotation_keeps_the_last_n_and_never_a_higher_a_or_what_resume_returns(where: FsLocation) -> None:
    first = where.fs(1)
    for step in range(5):
        save_hf_style(first, step, f"A=1 step={step}")
    assert first.rotate(2) == ["checkpoint-0", "checkpoint-1", "checkpoint-2"]
    assert first.ls("", detail=False) == ["checkpoint-3", "checkpoint-4"]
    assert not first.exists("checkpoint-0/model.bin")
    # what resume returns is never removed, by rotation or by hand
    with pytest.raises(Refused, match="is the one a new execution resumes from"):
        first.rm("checkpoint-4", recursive=True)
    second = where.fs(2)
    save_hf_style(second, 10, "A=2 step=10")
    # a lower execution never deletes a higher one's checkpoint (it is stale: nothing at all)
    with pytest.raises(Fenced):
        first.rotate(1)
    assert where.fs(9).ls("", detail=False) == ["checkpoint-10", "checkpoint-3", "checkpoint-4"]
    assert second.rotate(1) == ["checkpoint-3", "checkpoint-4"]
    assert where.fs(9).resume() == "checkpoint-10"
    with pytest.raises(InvalidInput, match="at least 1"):
        second.rotate(0)


def test_bad_paths_and_modes_are_refused_clearly(where: FsLocation) -> None:
    fs = where.fs(1)
    save_hf_style(fs, 1, "x")
    with pytest.raises(InvalidInput, match="write <name>/<file>"):
        fs.pipe_file("model.bin", b"x")
    with pytest.raises(InvalidInput, match="a committed checkpoint is never changed"):
        fs.mv("checkpoint-1", "checkpoint-2")
    with pytest.raises(InvalidInput, match="a committed checkpoint is never changed"):
        fs.rm("checkpoint-1/model.bin")
    with pytest.raises(InvalidInput, match="written whole"):
        fs.open("tmp-checkpoint-2/model.bin", "ab")
    with pytest.raises(InvalidInput, match=r"'\.' and '\.\.'"):
        fs.cat_file("checkpoint-1/../x")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("checkpoint-7/model.bin")


def test_another_namespace_sees_nothing_of_this_one(where: FsLocation) -> None:
    save_hf_style(where.fs(1, "team-a"), 1, "team-a")
    other = where.fs(1, "team-b")
    assert other.resume() is None and other.ls("", detail=False) == []


# ------------------------------------------------------------------------------------------ racing processes


def start(where: FsLocation, admission: int, result: Path, go: Path, size: int,
          steps: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DISPATCH_NAMESPACE": "team-a", "DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1",
           "DISPATCH_ADMISSION": str(admission)}
    argv = [sys.executable, str(WRITER), where.root, str(result), str(steps), str(size), json.dumps(where.options),
            str(go)]
    return subprocess.Popen(argv, env=env)


def model(admission: int, step: int, size: int) -> bytes:
    unit = f"A={admission} step={step};".encode()
    return (unit * (size // len(unit) + 1))[:size]


@pytest.mark.parametrize("kind", ["posix", pytest.param("s3", marks=pytest.mark.minio)])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_two_executions_saving_at_once_killed_at_random_points(kind: str, seed: int, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    """A=1 (stale) and A=2 (current) save through the filesystem at once; each is SIGKILLed at a random point
    (or finishes). Afterwards every visible checkpoint is complete, was committed before any higher claim (no
    byte of a stale execution visible), and ``resume`` names the newest checkpoint of the highest A."""
    fencefs()
    if kind == "posix":
        where = FsLocation("posix", str(tmp_path / "ckpt"), {})
    else:
        where = FsLocation("s3", f"s3://{BUCKET}/race-{secrets.token_hex(6)}",
                           s3_options(request.getfixturevalue("minio")))
    rng = random.Random(seed)
    size = rng.choice([4 << 10, 256 << 10])
    go1, go2 = tmp_path / "go1", tmp_path / "go2"
    old = start(where, 1, tmp_path / "a1.json", go1, size, steps=10_000)
    new = start(where, 2, tmp_path / "a2.json", go2, size, steps=20)  # loads its interpreter meanwhile
    go1.write_text("go")
    deadline = time.monotonic() + 60
    while where.fs(99).resume() is None:  # A=1 has committed a checkpoint, and saves on
        assert old.poll() is None and time.monotonic() < deadline, "A=1 did not commit"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    go2.write_text("go")  # A=2 starts saving while A=1 still does
    # kill each at a random point of its saving, in a random order (or let it run on)
    for process in rng.sample([old, new], 2):
        time.sleep(rng.uniform(0.0, 0.4))
        if rng.random() < 0.8:
            process.send_signal(signal.SIGKILL)
    for process in (old, new):
        try:
            process.wait(timeout=20)  # A=2 ends by itself; A=1 once fenced (or never, if A=2 died unclaimed)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()

    reader = where.fs(99)
    entries = read_log(reader.fence.store)
    counted = counting(entries)
    claims = {e.admission: e.seq for e in entries if e.kind == "claim"}
    visible = reader.ls("", detail=False)
    by_name = {c.name: c for c in reader.checkpoints()}
    for name in visible:
        checkpoint = by_name[name]
        # it counts: no higher claim came before its commit
        assert all(seq > checkpoint.seq for a, seq in claims.items() if a > checkpoint.admission), name
        step = checkpoint.step
        # complete, and every byte is its own execution's
        assert reader.cat_file(f"{name}/model.bin") == model(checkpoint.admission, step, size), name
        assert json.loads(reader.cat_file(f"{name}/meta.json")) == {"A": checkpoint.admission, "step": step}
        assert sorted(reader.ls(name, detail=False)) == [f"{name}/meta.json", f"{name}/model.bin"]
    if counted:
        newest = counted[-1]
        assert newest.admission == max(e.admission for e in counted), "the highest A that committed"
        assert reader.resume() == newest.name and newest.name in visible
        assert reader.cat_file(f"{newest.name}/model.bin") == model(newest.admission, newest.step, size)
        # rotation keeps the last two; each writer killed mid-rotation may leave one more (the next rotation's
        # doomed list then holds two, and a kill there leaves one): seen, both writers killed, four visible
        killed = sum(p.returncode == -signal.SIGKILL for p in (old, new))
        assert len(visible) <= 2 + killed, (visible, old.returncode, new.returncode)
    else:
        assert reader.resume() is None and visible == []
    # the next execution, claiming on its first write, resumes from that checkpoint
    after = where.fs(3)
    after.pipe_file("tmp-checkpoint-999/model.bin", b"A=3")
    assert (after.fence.resume.name if after.fence.resume else None) == (counted[-1].name if counted else None)
    print(f"seed {seed} ({kind}, {size} B): {len(entries)} entries, visible {visible}, "
          f"A=1 exit {old.returncode}, A=2 exit {new.returncode}")


def test_the_how_to_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fsspec block of docs/how-to/fence-checkpoints.md (shown there, as the docs' runner has no fsspec)."""
    fencefs()
    page = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "fence-checkpoints.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in page.split("```python")[1:]]
    code = next(b.split("```", 1)[0] for b in blocks if "FencedFileSystem.from_env" in b)
    for name, value in {"DISPATCH_NAMESPACE": "team-a", "DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1",
                        "DISPATCH_ADMISSION": "1", "CHECKPOINT_ROOT": str(tmp_path / "ckpt")}.items():
        monkeypatch.setenv(name, value)
    exec(compile(code, "fence-checkpoints.md", "exec"), {})
    # the next execution resumes from what the example left, and the stale one is refused
    monkeypatch.setenv("DISPATCH_ADMISSION", "2")
    exec(compile(code.replace("(100, 200, 300)", "(400,)").replace(
        'assert fs.resume() == "checkpoint-300" and fs.ls("", detail=False) == ["checkpoint-200", "checkpoint-300"]',
        'assert fs.resume() == "checkpoint-400" and (restore / "checkpoint-300" / "model.safetensors").exists()'),
        "fence-checkpoints.md", "exec"), {})
    monkeypatch.setenv("DISPATCH_ADMISSION", "1")
    with pytest.raises(Fenced, match="execution A=2 has claimed it"):
        exec(compile(code, "fence-checkpoints.md", "exec"), {})


def test_files_written_from_a_thread_pool_make_one_claim(where: FsLocation) -> None:
    """Libraries write shards from threads (DCP's writer does): one filesystem object, one claim, one commit."""
    from concurrent.futures import ThreadPoolExecutor

    fs = where.fs(1)

    def shard(rank: int) -> None:
        with fs.open(f"step-5/__{rank}_0.distcp", "wb") as f:
            f.write(f"shard {rank}".encode())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(shard, range(16)))
    fs.pipe_file("step-5/.metadata.tmp", b"m")
    fs.mv("step-5/.metadata.tmp", "step-5/.metadata")
    entries = read_log(fs.fence.store)
    assert [(e.kind, e.admission) for e in entries] == [("claim", 1), ("commit", 1)]
    assert len(where.fs(2).ls("step-5", detail=False)) == 17
