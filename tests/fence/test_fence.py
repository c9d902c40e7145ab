"""The fence's promise on each store (a local directory, and a real MinIO server): claims, commits, resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dispatch
from dispatch.errors import InvalidInput, Refused
from dispatch.fence import Checkpoint, Fence, Fenced, S3Store

from ._log import counting, read_log
from .conftest import BUCKET, Location, Minio


def save(text: str) -> Any:
    return lambda directory: (directory / "payload").write_text(text)


def payload(checkpoint: Checkpoint | None) -> str:
    assert checkpoint is not None
    with checkpoint.open() as directory:
        return (directory / "payload").read_text()


def test_a_new_execution_resumes_from_the_newest_checkpoint_of_the_highest_a(location: Location) -> None:
    first = location.fence(1)
    assert first.claim() is None
    first.commit(10, save("a1 s10"))
    first.commit(20, save("a1 s20"))
    second = location.fence(2)
    resume = second.claim()
    assert resume is not None and (resume.admission, resume.step) == (1, 20)
    assert payload(resume) == "a1 s20"
    second.commit(30, save("a2 s30"))
    third = location.fence(3)
    assert payload(third.claim()) == "a2 s30"
    # An execution that claimed but never committed leaves the resume point where it was.
    assert payload(location.fence(4).claim()) == "a2 s30"


def test_a_stale_commit_fails_loudly_and_leaves_the_newer_checkpoints_intact(location: Location) -> None:
    stale = location.fence(1)
    stale.claim()
    stale.commit(1, save("a1 s1"))
    newer = location.fence(2)
    newer.claim()
    mine = newer.commit(2, save("a2 s2"))
    with pytest.raises(Fenced) as err:
        stale.commit(3, save("a1 s3"))
    assert (err.value.admission, err.value.newer) == (1, 2)
    assert "execution A=1 may not commit step 3" in str(err.value)
    assert "execution A=2 has claimed it" in str(err.value)
    assert isinstance(err.value, Refused)
    assert payload(mine) == "a2 s2"
    assert payload(location.fence(3).latest()) == "a2 s2"
    # check() says the same without writing anything
    with pytest.raises(Fenced):
        stale.check()
    assert [e.kind for e in read_log(location.fence(9).store)] == ["claim", "commit", "claim", "commit"]


def test_a_lower_execution_may_not_start_after_a_higher_one_claimed(location: Location) -> None:
    location.fence(5).claim()
    with pytest.raises(Fenced) as err:
        location.fence(4).claim()
    assert "execution A=4 may not start" in str(err.value) and "A=5" in str(err.value)
    # the refused claim wrote nothing
    assert [(e.kind, e.admission) for e in read_log(location.fence(9).store)] == [("claim", 5)]


def test_a_commit_that_raced_a_higher_claim_does_not_count(location: Location) -> None:
    """The window between the stale writer's last check and its commit entry: the claim lands inside it."""
    stale, newer = location.fence(1), location.fence(2)
    stale.claim()
    stale.commit(1, save("a1 s1"))

    original_advance = stale._advance
    calls = {"n": 0}

    def advance_and_let_the_newer_claim_land() -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the check between the data and the commit entry: the claim is not yet made
            original_advance()
            newer.claim()
            return
        original_advance()

    stale._advance = advance_and_let_the_newer_claim_land  # type: ignore[method-assign]
    with pytest.raises(Fenced) as err:
        stale.commit(2, save("a1 s2"))
    assert (err.value.admission, err.value.newer) == (1, 2)
    entries = read_log(location.fence(9).store)
    # the stale commit entry was made (after the claim) and does not count; its data was removed
    assert [(e.kind, e.admission) for e in entries] == [("claim", 1), ("commit", 1), ("claim", 2), ("commit", 1)]
    assert [e.seq for e in counting(entries)] == [2]
    assert payload(location.fence(3).claim()) == "a1 s1"
    assert newer.resume is not None and newer.resume.step == 1


def test_a_restarted_container_of_the_same_execution_resumes_from_its_own_checkpoint(location: Location) -> None:
    first = location.fence(1)
    first.claim()
    first.commit(5, save("a1 s5"))
    again = location.fence(1)
    assert payload(again.claim()) == "a1 s5"
    again.commit(6, save("a1 s6"))
    assert payload(location.fence(2).claim()) == "a1 s6"


def test_the_context_manager_claims_and_commits(location: Location) -> None:
    with location.fence(1) as fence:
        assert fence.resume is None
        for step in range(3):
            fence.commit(step, save(f"a1 s{step}"))
    with location.fence(2) as fence:
        assert fence.resume is not None and fence.resume.step == 2
    with pytest.raises(Fenced), location.fence(1):
        pass


def test_checkpoints_keep_directories(location: Location) -> None:
    def write(directory: Path) -> None:
        (directory / "model").mkdir()
        (directory / "model" / "weights.bin").write_bytes(bytes(range(256)) * 64)
        (directory / "meta.json").write_text("{}")

    fence = location.fence(1)
    fence.claim()
    fence.commit(7, write)
    with location.fence(2).claim().open() as directory:  # type: ignore[union-attr]
        assert (directory / "model" / "weights.bin").read_bytes() == bytes(range(256)) * 64
        assert (directory / "meta.json").read_text() == "{}"


def test_from_env_reads_the_variables_dispatch_sets(location: Location, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"DISPATCH_NAMESPACE": "team-a", "DISPATCH_JOB_ID": "llama", "DISPATCH_SUBMISSION": "s1",
           "DISPATCH_ADMISSION": "3"}
    fence = Fence.from_env(location.root, environ=env, s3_client=location.client)
    assert fence.admission == 3 and fence.store.location.endswith("llama/s1")
    with pytest.raises(InvalidInput, match="DISPATCH_ADMISSION not set"):
        Fence.from_env(location.root, environ={**env, "DISPATCH_ADMISSION": ""})
    with pytest.raises(InvalidInput, match="is not a number"):
        Fence.from_env(location.root, environ={**env, "DISPATCH_ADMISSION": "x"})
    with pytest.raises(InvalidInput, match="at least 1"):
        Fence.from_env(location.root, environ={**env, "DISPATCH_ADMISSION": "0"}, s3_client=location.client)
    with pytest.raises(InvalidInput, match="cannot name a directory"):
        Fence.from_env(location.root, environ={**env, "DISPATCH_JOB_ID": ".."})
    monkeypatch.setattr("os.environ", {**env})
    assert Fence.from_env(location.root, s3_client=location.client).admission == 3


def test_misuse_is_refused(location: Location) -> None:
    fence = location.fence(1)
    with pytest.raises(RuntimeError, match="claim the location first"):
        fence.commit(1, save("x"))
    with pytest.raises(RuntimeError, match="claim the location first"):
        _ = fence.resume
    fence.claim()
    with pytest.raises(InvalidInput, match="non-negative"):
        fence.commit(-1, save("x"))


def test_importing_the_fence_loads_no_kubernetes_or_http_client() -> None:
    code = ("import sys, dispatch.fence; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('httpx', 'httpx2', 'lightkube', 'asyncio', 'boto3', 'botocore', 'fsspec', 's3fs', 'aiohttp')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert {"Fence", "Fenced", "Checkpoint", "PosixStore", "S3Store"} <= set(dispatch.__all__)
    assert dispatch.Adapter.__name__ == "Adapter"  # the adapter still comes on first use


@pytest.mark.minio
def test_an_s3_store_that_ignores_if_none_match_is_refused(minio: Minio) -> None:
    class IgnoresConditions:
        """MinIO reached through a client that drops If-None-Match, as a store that ignores it would."""

        def __init__(self, client: Any) -> None:
            self.client = client

        def put_object(self, **kwargs: Any) -> Any:
            kwargs.pop("IfNoneMatch", None)
            return self.client.put_object(**kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

    fence = Fence(S3Store(BUCKET, "ignores", client=IgnoresConditions(minio.client())), 1)
    with pytest.raises(Refused, match="does not honour If-None-Match"):
        fence.claim()
    honest = Fence(S3Store(BUCKET, "honours", client=minio.client()), 1)
    assert honest.claim() is None


def test_a_write_that_fails_leaves_nothing_behind(location: Location) -> None:
    fence = location.fence(1)
    fence.claim()
    fence.commit(1, save("a1 s1"))

    def broken(directory: Path) -> None:
        (directory / "payload").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fence.commit(2, broken)
    store = location.fence(9).store
    assert [(e.kind, e.step) for e in read_log(store)] == [("claim", -1), ("commit", 1)]
    if location.kind == "posix":
        data = Path(location.root) / "team-a" / "llama" / "s1" / "data" / "a-000000000001"
        assert [p.name[:17] for p in data.iterdir()] == ["step-000000000001"]
    assert payload(location.fence(2).claim()) == "a1 s1"
