"""A property: random interleavings of claims and commits from several A values, including claims that land
inside another execution's commit (between any two of its store operations), never leave a counting
checkpoint of a lower A after a higher A's claim, and every caller is told the truth.

The oracle does not use the fence's rule: it is the real-time order in which the store accepted entries
(recorded by a wrapper around the store), and what each call returned.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from dispatch.fence import SNAPSHOT_EVERY, Checkpoint, Fence, Fenced, FenceStore

from .conftest import Location

ADMISSIONS = (1, 2, 3, 4)


@dataclass
class Interleaver:
    """A store that, before its n-th operation, lets a scheduled execution claim (nested, once)."""

    store: FenceStore
    schedule: dict[int, Callable[[], None]]
    accepted: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    nested: bool = False

    @property
    def location(self) -> str:
        return self.store.location

    def _tick(self) -> None:
        self.calls += 1
        action = self.schedule.pop(self.calls, None)
        if action is not None and not self.nested:
            self.nested = True
            try:
                action()
            finally:
                self.nested = False

    def create(self, key: str, body: bytes) -> bool:
        self._tick()
        made = self.store.create(key, body)
        if made and key.startswith("log/"):  # snapshots are made by exclusive create too, but are no entries
            self.accepted.append({"key": key, **json.loads(body)})
        return made

    def read(self, key: str) -> bytes | None:
        self._tick()
        return self.store.read(key)

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        self._tick()
        self.store.write_data(prefix, write)

    def open_data(self, prefix: str) -> AbstractContextManager[Path]:
        return self.store.open_data(prefix)

    def discard_data(self, prefix: str) -> None:
        self.store.discard_data(prefix)


def save(text: str, directory: Path) -> None:
    (directory / "payload").write_text(text)


ops = st.lists(st.tuples(st.sampled_from(ADMISSIONS), st.sampled_from(["claim", "commit", "commit"])),
               min_size=1, max_size=10)
schedules = st.dictionaries(st.integers(1, 40), st.sampled_from(ADMISSIONS), max_size=6)


def run(location: Location, plan: list[tuple[int, str]], injected: dict[int, int],
        snapshot_every: int = SNAPSHOT_EVERY) -> list[str]:
    """Play ``plan`` with ``injected`` claims, check every outcome against the store's order; what happened."""
    happened: list[str] = []
    base = location.fence(99).store
    outcomes: list[tuple[str, int, int, object]] = []  # (kind, A, step, Checkpoint | Fenced)
    claims: list[tuple[int, int, Checkpoint | None]] = []  # claims let through: (log number, A, resume)
    steps = iter(range(1_000_000))
    wrapper = Interleaver(base, {})
    fences = {a: Fence(wrapper, a, snapshot_every=snapshot_every) for a in ADMISSIONS}

    def claim(fence: Fence) -> None:
        try:
            resume = fence.claim()
            claims.append((fence._claim_seq or 0, fence.admission, resume))
        except Fenced as err:
            assert err.newer > fence.admission
            outcomes.append(("claim", fence.admission, -1, err))

    # An injected claim is another process's: a fence of its own (a fence is for one thread).
    wrapper.schedule = {n: functools.partial(claim, Fence(wrapper, a, snapshot_every=snapshot_every))
                        for n, a in injected.items()}
    for a, kind in plan:
        if kind == "claim" or fences[a]._claim_seq is None:
            claim(fences[a])
            continue
        step = next(steps)
        try:
            outcomes.append(("commit", a, step, fences[a].commit(step, functools.partial(save, f"{a}/{step}"))))
        except Fenced as err:
            outcomes.append(("commit", a, step, err))

    accepted = wrapper.accepted
    # The store's order of acceptance is the log's order: no gap, no reordering.
    assert [e["key"] for e in accepted] == [f"log/{i:012d}" for i in range(1, len(accepted) + 1)]
    position = {(e["kind"], e["admission"], e.get("step", -1), e["nonce"]): i for i, e in enumerate(accepted)}

    def index_of_commit(a: int, step: int) -> int | None:
        found = [i for (k, adm, s, _n), i in position.items() if k == "commit" and adm == a and s == step]
        return found[0] if found else None

    ok_commits: list[tuple[int, int, int]] = []  # (position, A, step)
    for kind, a, step, result in outcomes:
        if kind != "commit":
            continue
        at = index_of_commit(a, step)
        higher_before = at is not None and any(e["kind"] == "claim" and e["admission"] > a for e in accepted[:at])
        if isinstance(result, Checkpoint):
            # told it counts: its entry exists and no higher claim came before it
            assert at is not None and not higher_before, (a, step, accepted)
            ok_commits.append((at, a, step))
        else:
            # told it does not count: a higher claim came before its entry (or before it wrote one)
            assert isinstance(result, Fenced) and result.newer > a
            assert at is None or higher_before, (a, step, accepted)
            happened.append("raced: its entry was made after a higher claim and does not count" if at is not None
                            else "refused before its entry")
            if currently_in_test_context():
                event(f"a commit {happened[-1]}")

    def expected_resume(before: int) -> tuple[int, int] | None:
        """The newest checkpoint of the highest A among commits that were told they succeeded."""
        done = [(a, at, step) for at, a, step in ok_commits if at < before]
        if not done:
            return None
        top = max(a for a, _at, _step in done)
        return top, max((at, step) for a, at, step in done if a == top)[1]

    for seq, a, resume in claims:
        # a claim that was let through had no higher claim before it, and resumed from the right checkpoint
        assert accepted[seq - 1]["kind"] == "claim" and accepted[seq - 1]["admission"] == a
        assert not any(e["kind"] == "claim" and e["admission"] > a for e in accepted[:seq - 1])
        assert (None if resume is None else (resume.admission, resume.step)) == expected_resume(seq - 1)
    for at, a, _step in ok_commits:  # the promise itself
        assert not any(e["kind"] == "claim" and e["admission"] > a for e in accepted[:at])

    latest = Fence(base, 99, snapshot_every=snapshot_every).latest()
    want = expected_resume(len(accepted) + 1)
    assert (None if latest is None else (latest.admission, latest.step)) == want
    if latest is not None:
        with latest.open() as directory:
            assert (directory / "payload").read_text() == f"{latest.admission}/{latest.step}"
    return happened


@pytest.mark.parametrize("kind", ["posix", pytest.param("s3", marks=pytest.mark.minio)])
def test_a_claim_at_every_point_of_two_commits(kind: str, make_location: Callable[[str], Location]) -> None:
    """Exhaustively: A=2 claims before each store operation of A=1's claim and two commits."""
    seen: set[str] = set()
    for tick in range(1, 16):
        seen.update(run(make_location(kind), [(1, "claim"), (1, "commit"), (1, "commit")], {tick: 2}))
    assert seen == {"raced: its entry was made after a higher claim and does not count",
                    "refused before its entry"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=ops, injected=schedules)
def test_random_interleavings_on_a_directory(tmp_path_factory: pytest.TempPathFactory,
                                             make_location: Callable[[str], Location],
                                             plan: list[tuple[int, str]], injected: dict[int, int]) -> None:
    run(make_location("posix"), plan, injected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=ops, injected=schedules, every=st.sampled_from([2, 3]))
def test_random_interleavings_with_a_snapshot_every_few_entries(make_location: Callable[[str], Location],
                                                               plan: list[tuple[int, str]], injected: dict[int, int],
                                                               every: int) -> None:
    """The same promise when every second or third entry is followed by a snapshot that new fences start from."""
    run(make_location("posix"), plan, injected, snapshot_every=every)


@pytest.mark.minio
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=ops, injected=schedules)
def test_random_interleavings_on_s3(make_location: Callable[[str], Location],
                                    plan: list[tuple[int, str]], injected: dict[int, int]) -> None:
    run(make_location("s3"), plan, injected)


