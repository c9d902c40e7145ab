"""A location's identity (namespace and cluster), a damaged entry's way out, dead writers' files, and snapshots
that bound what a claim reads (issue 35, items 4 and 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from dispatch.errors import Refused
from dispatch.fence import Fence, Fenced, FenceStore, PosixStore, main

from ._log import counting, read_log
from .conftest import Location

WRITER = Path(__file__).with_name("_writer.py")


def env(namespace: str, admission: int, cluster: str | None = None) -> dict[str, str]:
    out = {"DISPATCH_NAMESPACE": namespace, "DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1",
           "DISPATCH_ADMISSION": str(admission)}
    if cluster is not None:
        out["DISPATCH_CLUSTER"] = cluster
    return out


def save(text: str) -> Callable[[Path], object]:
    return lambda directory: (directory / "payload").write_text(text)


def payload(fence: Fence) -> str | None:
    checkpoint = fence.resume
    if checkpoint is None:
        return None
    with checkpoint.open() as directory:
        return (directory / "payload").read_text()


# ------------------------------------------------------------------------------------------ identity


def test_two_namespaces_with_one_job_id_and_submission_never_share_checkpoints(location: Location) -> None:
    """The docs' own llama/s1 in two namespaces on one root: each counts A from 1 and resumes only its own."""
    a1 = Fence.from_env(location.root, environ=env("team-a", 1), s3_client=location.client)
    a1.claim()
    a1.commit(10, save("team-a A=1 step 10"))
    # equal A: before, team-b's A=1 resumed team-a's checkpoint
    b1 = Fence.from_env(location.root, environ=env("team-b", 1), s3_client=location.client)
    assert b1.claim() is None
    b1.commit(5, save("team-b A=1 step 5"))
    # higher A in one namespace does not fence a lower one of the other: before, team-b's A=1 was "stale"
    a3 = Fence.from_env(location.root, environ=env("team-a", 3), s3_client=location.client)
    a3.claim()
    assert payload(a3) == "team-a A=1 step 10"
    b1.commit(6, save("team-b A=1 step 6"))
    b2 = Fence.from_env(location.root, environ=env("team-b", 2), s3_client=location.client)
    b2.claim()
    assert payload(b2) == "team-b A=1 step 6"


def test_a_location_is_bound_to_its_first_cluster_and_refuses_another(location: Location) -> None:
    first = Fence.from_env(location.root, environ=env("team-a", 1, cluster="uid-east"), s3_client=location.client)
    first.claim()
    first.commit(1, save("east"))
    other = Fence.from_env(location.root, environ=env("team-a", 1, cluster="uid-west"), s3_client=location.client)
    with pytest.raises(Refused) as err:
        other.claim()
    assert err.value.reason == "FenceIdentity"
    assert "cluster=uid-east namespace=team-a job-id=llama submission=s1" in str(err.value)
    assert "cluster=uid-west namespace=team-a job-id=llama submission=s1" in str(err.value)
    # a higher A of the other cluster is refused too, and fences nobody: the first cluster's A=1 commits on
    with pytest.raises(Refused, match="is bound to cluster=uid-east"):
        Fence.from_env(location.root, environ=env("team-a", 7, cluster="uid-west"), s3_client=location.client).claim()
    first.commit(2, save("east 2"))
    again = Fence.from_env(location.root, environ=env("team-a", 2, cluster="uid-east"), s3_client=location.client)
    again.claim()
    assert payload(again) == "east 2"


class Interposer:
    """A store that runs ``before_create`` once, just before its first create (another process's claim)."""

    def __init__(self, store: FenceStore, before_create: Callable[[], object]) -> None:
        self.store, self.before_create, self.reads = store, before_create, 0

    @property
    def location(self) -> str:
        return self.store.location

    def create(self, key: str, body: bytes) -> bool:
        action, self.before_create = self.before_create, lambda: None
        action()
        return self.store.create(key, body)

    def read(self, key: str) -> bytes | None:
        self.reads += 1
        return self.store.read(key)

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        self.store.write_data(prefix, write)

    def open_data(self, prefix: str) -> AbstractContextManager[Path]:
        return self.store.open_data(prefix)

    def discard_data(self, prefix: str) -> None:
        self.store.discard_data(prefix)


def test_two_identities_claiming_a_fresh_location_at_once_bind_it_to_the_first(location: Location) -> None:
    east = Fence.from_env(location.root, environ=env("team-a", 1, cluster="uid-east"), s3_client=location.client)
    west = Fence.from_env(location.root, environ=env("team-a", 5, cluster="uid-west"), s3_client=location.client)
    assert east.identity is not None
    racing = Fence(Interposer(west.store, east.claim), 5, identity=west.identity)
    with pytest.raises(Refused, match="bound to cluster=uid-east"):
        racing.claim()  # its entry was made (after east's) and is ignored: A=5 of another count fences nobody
    east.commit(1, save("east"))
    entries = read_log(east.store)
    assert [(e.kind, e.admission) for e in entries] == [("claim", 1), ("claim", 5), ("commit", 1)]
    assert Fence.from_env(location.root, environ=env("team-a", 2, cluster="uid-east"),
                          s3_client=location.client).claim() is not None


def test_the_namespace_comes_from_the_service_account_file_or_the_fence_refuses(tmp_path: Path) -> None:
    base = {"DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1", "DISPATCH_ADMISSION": "1"}
    ns_file = tmp_path / "namespace"
    ns_file.write_text("team-c\n")
    fence = Fence.from_env(tmp_path / "ckpt", environ=base, namespace_file=ns_file)
    assert fence.store.location == str(tmp_path / "ckpt" / "team-c" / "llama" / "s1")
    with pytest.raises(Refused, match="the pod's namespace is unknown: neither DISPATCH_NAMESPACE"):
        Fence.from_env(tmp_path / "ckpt", environ=base, namespace_file=tmp_path / "absent")
    with pytest.raises(Refused, match=r"namespace '\.\.' cannot name a directory"):
        Fence.from_env(tmp_path / "ckpt", environ={**base, "DISPATCH_NAMESPACE": ".."})
    assert not (tmp_path / "ckpt").exists(), "a refused fence writes nothing"


def test_a_location_of_before_namespaces_is_named_not_silently_ignored(tmp_path: Path) -> None:
    """A location written without the namespace: a new execution must not start from nothing beside it."""
    old = Fence(PosixStore(tmp_path / "ckpt" / "llama" / "s1"), 1)
    old.claim()
    old.commit(3, save("old"))
    with pytest.raises(Refused) as err:
        Fence.from_env(tmp_path / "ckpt", environ=env("team-a", 2)).claim()
    assert err.value.reason == "FenceLegacyLocation"
    assert f"move it to {tmp_path / 'ckpt' / 'team-a' / 'llama' / 's1'}" in str(err.value)
    (tmp_path / "ckpt" / "team-a").mkdir()
    (tmp_path / "ckpt" / "llama").rename(tmp_path / "ckpt" / "team-a" / "llama")
    moved = Fence.from_env(tmp_path / "ckpt", environ=env("team-a", 2))
    moved.claim()
    assert payload(moved) == "old"


# ------------------------------------------------------------------------------------------ a damaged entry


def damage(location: Location, seq: int, body: bytes) -> None:
    """Write a log entry by hand, as a torn write or another program would."""
    key = f"log/{seq:012d}"
    store: Any = location.fence(99).store
    if location.kind == "posix":
        path = Path(store.location) / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    else:
        location.client.put_object(Bucket=store.bucket, Key=store._key(key), Body=body)


def test_a_damaged_entry_names_its_way_out_and_the_repair_is_fenced(location: Location,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    first = location.fence(1)
    first.claim()
    first.commit(1, save("a1 s1"))
    damage(location, 3, b'{"kind": "cla')  # e.g. a claim of A=2, torn
    with pytest.raises(Refused) as err:
        location.fence(2).claim()
    where = location.fence(99).store.location
    assert err.value.reason == "FenceLogCorrupt"
    assert f"python -m dispatch.fence repair {where} --entry 3 --admission A" in str(err.value)
    # the repair is itself fenced: an A below a claim the log holds is refused, and nothing is written
    damage(location, 4, json.dumps({"kind": "claim", "admission": 5, "nonce": "n"}).encode())
    client_env = {**os.environ, **location.env}
    if location.kind == "s3":
        refused = subprocess.run([sys.executable, "-m", "dispatch.fence", "repair", where, "--entry", "3",
                                  "--admission", "4"], capture_output=True, text=True, env=client_env)
        assert refused.returncode == 2 and "entry 4 is a claim of A=5" in refused.stdout
    else:
        assert main(["repair", where, "--entry", "3", "--admission", "4"]) == 2
        assert "entry 4 is a claim of A=5" in capsys.readouterr().out
    with pytest.raises(Refused, match="does not parse"):
        location.fence(6).claim()
    # with the current A (6) the way out works; a second repair finds the first
    argv = ["repair", where, "--entry", "3", "--admission", "6"]
    if location.kind == "s3":
        done = subprocess.run([sys.executable, "-m", "dispatch.fence", *argv], capture_output=True, text=True,
                              env=client_env)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert main(argv) == 0
        assert main(argv) == 0 and "repaired before" in capsys.readouterr().out
    # the entry now counts as a claim of A=6: lower executions are fenced, A=6 starts and resumes A=1's
    with pytest.raises(Fenced) as fenced:
        location.fence(5).claim()
    assert fenced.value.newer == 6
    with pytest.raises(Fenced):
        first.commit(2, save("a1 s2"))
    current = location.fence(6)
    resume = current.claim()
    assert resume is not None and (resume.admission, resume.step) == (1, 1)
    current.commit(7, save("a6 s7"))
    assert location.fence(7).claim().step == 7  # type: ignore[union-attr]


def test_a_repair_of_an_entry_that_parses_is_refused(location: Location) -> None:
    location.fence(1).claim()
    with pytest.raises(Refused, match="entry 1 parses"):
        location.fence(3).repair(1)
    with pytest.raises(Refused, match="entry 2 does not exist"):
        location.fence(3).repair(2)


# ------------------------------------------------------------------------------------------ tmp/


def test_a_claim_removes_dead_writers_temporary_files_and_only_those(tmp_path: Path) -> None:
    fence = Fence.at(tmp_path, "llama", "s1", 1, namespace="team-a")
    fence.claim()
    tmp = tmp_path / "team-a" / "llama" / "s1" / "tmp"
    dead, fresh = tmp / "123-dead.entry", tmp / "456-fresh.entry"
    for f in (dead, fresh):
        f.write_text('{"kind": "claim"')
    old = time.time() - 3600
    os.utime(dead, (old, old))
    Fence.at(tmp_path, "llama", "s1", 2, namespace="team-a").claim()
    assert sorted(p.name for p in tmp.iterdir()) == ["456-fresh.entry"]


def test_a_writer_whose_temporary_file_was_removed_makes_no_entry(tmp_path: Path) -> None:
    """Why the sweep is safe whatever the writer's A: without its file, its link fails and no entry appears."""
    store = PosixStore(tmp_path / "loc")
    store.create("log/000000000001", b"x")
    real_link = os.link

    def swept_first(src: Any, dst: Any, **kw: Any) -> None:
        os.unlink(src)
        real_link(src, dst, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "link", swept_first)
        with pytest.raises(FileNotFoundError):
            store.create("log/000000000002", b"y")
    assert store.read("log/000000000002") is None


# ------------------------------------------------------------------------------------------ snapshots


class Counting(Interposer):
    def __init__(self, store: FenceStore) -> None:
        super().__init__(store, lambda: None)


def long_log(location: Location, entries: int, every: int) -> Fence:
    writer = Fence(location.fence(1).store, 1, identity=location.fence(1).identity, snapshot_every=every)
    writer.claim()
    writer.commit(0, save("a1 s0"))
    for _ in range(entries - 2):
        writer._append("claim")  # a long log of cheap entries
    return writer


def test_a_claim_reads_a_bounded_number_of_entries_however_long_the_log(tmp_path: Path) -> None:
    """5,000 entries: before, a new execution read all of them (5,001 reads); a snapshot bounds it."""
    location = Location("posix", str(tmp_path / "ckpt"), {})
    long_log(location, 5000, every=100)
    store = Counting(location.fence(2).store)
    newer = Fence(store, 2, identity=location.fence(2).identity)
    resume = newer.claim()
    assert resume is not None and (resume.admission, resume.step) == (1, 0)
    assert store.reads <= 100 + 2 * 13 + 4, store.reads
    entries = read_log(location.fence(99).store)
    assert len(entries) == 5001 and [e.seq for e in counting(entries)] == [2]
    assert len(list((tmp_path / "ckpt" / "team-a" / "llama" / "s1" / "snap").iterdir())) == 50


def test_a_snapshot_holds_what_the_log_before_it_says(location: Location) -> None:
    """Claims, commits, raced commits and deletes across many snapshots: every snapshot agrees with the log."""
    every = 3
    fences = {a: Fence(location.fence(a).store, a, identity=location.fence(a).identity, snapshot_every=every)
              for a in (1, 2, 3)}
    fences[1].claim()
    for step in range(4):
        fences[1].commit(step, save(f"a1 s{step}"))
    fences[1].rotate(2)
    fences[2].claim()
    with pytest.raises(Fenced):
        fences[1].commit(9, save("stale"))
    fences[2].commit(10, save("a2 s10"))
    fences[3].claim()
    fences[3].commit(11, save("a3 s11"))
    fences[3].rotate(1)
    by_hand = len(read_log(location.fence(99).store)) + 1  # a lower claim made by another program: harmless
    damage(location, by_hand, json.dumps({"kind": "claim", "admission": 2, "nonce": "x"}).encode())
    fences[3].commit(12, save("a3 s12"))
    entries = read_log(location.fence(99).store)
    for upto in range(every, len(entries) + 1, every):
        fresh = Fence(location.fence(9).store, 9, snapshot_every=10**9)
        fresh._advance()
        want = fresh._state(before=upto + 1)
        body = location.fence(9).store.read(f"snap/{upto:012d}")
        if upto == by_hand:
            continue  # no fence made that entry, so none wrote its snapshot
        assert body is not None
        got = json.loads(body)
        assert got["highest_claim"] == want.highest_claim
        assert [e["seq"] for e in got["live"]] == list(want.live)
    latest = Fence(location.fence(9).store, 9, snapshot_every=every).latest()
    assert latest is not None and (latest.admission, latest.step) == (3, 12)
    assert [c.step for c in Fence(location.fence(9).store, 9, snapshot_every=every).checkpoints()] == [11, 12]


def test_a_damaged_or_missing_snapshot_is_read_past(tmp_path: Path) -> None:
    location = Location("posix", str(tmp_path / "ckpt"), {})
    long_log(location, 350, every=100)
    snap = tmp_path / "ckpt" / "team-a" / "llama" / "s1" / "snap"
    (snap / f"{300:012d}").write_text("{torn")
    (snap / f"{200:012d}").unlink()
    store = Counting(location.fence(2).store)
    resume = Fence(store, 2, identity=location.fence(2).identity, snapshot_every=100).claim()
    assert resume is not None and resume.step == 0
    assert store.reads <= 250 + 2 * 10 + 5, store.reads


@pytest.mark.parametrize("kind", ["posix", pytest.param("s3", marks=pytest.mark.minio)])
def test_racing_processes_across_snapshot_boundaries(kind: str, make_location: Any, tmp_path: Path) -> None:
    """Four real processes (A=1..4) append at once with a snapshot every 5 entries; a snapshot is made by
    whoever made its entry, by exclusive create: each one must hold the state of the log before it."""
    location: Location = make_location(kind)
    go = tmp_path / "go"
    runs = []
    for a in (1, 2, 3, 4):
        result = tmp_path / f"a{a}.json"
        process_env = {**os.environ, **location.env, **env("team-a", a), "FENCE_SNAPSHOT_EVERY": "5"}
        argv = [sys.executable, str(WRITER), location.root, str(result), "20", "0.001", str(go), ""]
        runs.append((subprocess.Popen(argv, env=process_env), result))
    time.sleep(0.5)
    go.write_text("go")
    results = []
    for process, result in runs:
        assert process.wait(timeout=120) == 0
        results.append(json.loads(result.read_text()))
    entries = read_log(location.fence(99).store)
    told_ok = sorted(seq for r in results for _step, seq in r["committed"])
    assert [e.seq for e in counting(entries)] == told_ok
    store = location.fence(99).store
    snapshots = 0
    for upto in range(5, len(entries) + 1, 5):
        body = store.read(f"snap/{upto:012d}")
        if body is None:
            continue
        snapshots += 1
        raw = json.loads(body)
        prefix = entries[:upto]
        assert raw["highest_claim"] == max(e.admission for e in prefix if e.kind == "claim")
        assert [e["seq"] for e in raw["live"]] == [e.seq for e in counting(prefix)]
    assert snapshots == len(entries) // 5  # the writer of entry 5n writes it, even if it is then fenced
    resume = Fence(store, 5, identity=location.fence(5).identity, snapshot_every=5).claim()
    assert resume is not None and (resume.admission, resume.step) == (4, 19)


def test_a_snapshot_lists_at_most_the_newest_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits without rotation: the state (and so each snapshot) keeps the newest few, whoever reads."""
    monkeypatch.setattr("dispatch.fence.LISTED_MAX", 4)
    location = Location("posix", str(tmp_path / "ckpt"), {})
    writer = Fence(location.fence(1).store, 1, identity=location.fence(1).identity, snapshot_every=5)
    writer.claim()
    for step in range(12):
        writer.commit(step, save(f"a1 s{step}"))
    assert [c.step for c in writer.checkpoints()] == [8, 9, 10, 11]
    from_snapshot = Fence(location.fence(2).store, 2, identity=location.fence(2).identity, snapshot_every=5)
    assert [c.step for c in from_snapshot.checkpoints()] == [8, 9, 10, 11]
    assert from_snapshot._base_seq == 10
    snap = json.loads((tmp_path / "ckpt" / "team-a" / "llama" / "s1" / "snap" / f"{10:012d}").read_text())
    assert [e["step"] for e in snap["live"]] == [5, 6, 7, 8]


def test_a_long_running_execution_folds_a_bounded_tail_and_agrees_with_a_fresh_reader(tmp_path: Path) -> None:
    """One execution committing on and on: what it decides on stays bounded, and equals a fresh reader's view."""
    location = Location("posix", str(tmp_path / "ckpt"), {})
    writer = Fence(location.fence(1).store, 1, identity=location.fence(1).identity, snapshot_every=5)
    writer.claim()
    for step in range(60):
        writer.commit(step, save(f"a1 s{step}"))
        assert len(writer._tail) < 2 * 5 + 2
    writer.rotate(3)
    fresh = Fence(location.fence(9).store, 9, snapshot_every=10**9)
    assert [c.seq for c in writer.checkpoints()] == [c.seq for c in fresh.checkpoints()]
    assert [c.step for c in fresh.checkpoints()] == [57, 58, 59]
    stale = writer
    Fence(location.fence(2).store, 2, identity=location.fence(2).identity).claim()
    with pytest.raises(Fenced):
        stale.commit(60, save("stale"))
