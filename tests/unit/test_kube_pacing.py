"""How ``_kube`` paces its calls: client-go's token bucket, retries with jitter, ``Retry-After`` honoured on
429 and 503, and a bound on the time one call may spend retrying.

Every test runs on an injected clock and sleep (the sleep advances the clock and records the pause), so
nothing really waits and nothing is timed: the pauses asked for are the assertions.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
from collections.abc import Callable

import httpx2
import pytest

from dispatch import Adapter
from dispatch import _kube as k
from dispatch._controller_options import ControllerOptions, parse
from dispatch.errors import InvalidInput, Refused, Unreachable
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")


class Clock:
    """A clock only the recorded sleeps move."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


Reply = Callable[[httpx2.Request], httpx2.Response]


def kube(reply: Reply, clock: Clock, *, seed: int = 1, **pacing: float) -> tuple[k.Kube, list[httpx2.Request]]:
    seen: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return reply(request)

    p = k.Pacing(clock=clock, sleep=clock.sleep, rng=random.Random(seed), **pacing)  # type: ignore[arg-type]
    return k.Kube.connect(namespace="default", transport=httpx2.MockTransport(handle), pacing=p), seen


def ok(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, json={"kind": "Pod", "metadata": {"name": "p"}})


def status(code: int, reason: str, **headers: str) -> httpx2.Response:
    return httpx2.Response(code, headers=headers, json={"kind": "Status", "code": code, "reason": reason,
                                                        "message": f"{reason} (test)"})


def then_ok(first: list[httpx2.Response]) -> Reply:
    """The given replies in turn, then 200s."""
    def reply(request: httpx2.Request) -> httpx2.Response:
        return first.pop(0) if first else ok(request)
    return reply


def test_a_burst_then_qps_and_copies_share_one_bucket() -> None:
    clock = Clock()
    sent: list[float] = []

    def stamped(request: httpx2.Request) -> httpx2.Response:
        sent.append(clock.now - 1000.0)
        return ok(request)

    kb, seen = kube(stamped, clock, qps=2.0, burst=3)
    other = kb.in_namespace("team-b")           # the controller's per-namespace copies: one bucket

    async def calls() -> None:
        await asyncio.gather(*(c.get(k.PODS, "p") for c in (kb, other, kb, other, kb, other, kb)))

    asyncio.run(calls())
    assert len(seen) == 7
    # three at once, then one each 1/qps
    assert sent == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.0]
    assert kb.pacing.limit is not None and kb.pacing.limit.waits == 4


def test_no_limit_by_default() -> None:
    clock = Clock()
    kb, seen = kube(ok, clock)

    async def calls() -> None:
        await asyncio.gather(*(kb.get(k.PODS, "p") for _ in range(100)))

    asyncio.run(calls())
    assert len(seen) == 100 and clock.slept == [] and kb.pacing.limit is None


@pytest.mark.parametrize(("code", "reason"), [(429, "TooManyRequests"), (503, "ServiceUnavailable")])
def test_retry_after_is_honoured_even_for_a_write(code: int, reason: str) -> None:
    """APF and max-in-flight refuse with Retry-After before doing anything, so client-go retries any verb."""
    clock = Clock()
    kb, seen = kube(then_ok([status(code, reason, **{"Retry-After": "2"})]), clock)
    asyncio.run(kb.merge_patch(k.PODS, "p", {"metadata": {"labels": {"a": "b"}}}))
    assert [r.method for r in seen] == ["PATCH", "PATCH"]
    [pause] = clock.slept
    assert 2.0 <= pause <= 2.4                   # never sooner than asked; jittered so clients spread out
    assert kb.pacing.throttled == (1 if code == 429 else 0)


def test_an_http_date_retry_after_is_honoured() -> None:
    when = email.utils.formatdate(timeval=1_900_000_000 + 7, usegmt=True)
    response = httpx2.Response(429, headers={"Retry-After": when})
    assert k.retry_after(response, now=1_900_000_000) == 7.0
    assert k.retry_after(httpx2.Response(429, headers={"Retry-After": "soon"})) is None
    assert k.retry_after(httpx2.Response(429)) is None


def test_a_write_without_retry_after_is_not_retried() -> None:
    """A 503 without Retry-After may come after the write was done: the caller re-reads and decides."""
    clock = Clock()
    kb, seen = kube(then_ok([status(503, "ServiceUnavailable")]), clock)
    with pytest.raises(Unreachable):
        asyncio.run(kb.merge_patch(k.PODS, "p", {"metadata": {"labels": {"a": "b"}}}))
    assert len(seen) == 1 and clock.slept == []


def test_a_read_retries_with_jittered_backoff() -> None:
    pauses = []
    for seed in (1, 2):
        clock = Clock()
        kb, seen = kube(then_ok([status(500, "InternalError"), status(500, "InternalError")]), clock, seed=seed)
        assert asyncio.run(kb.get(k.PODS, "p"))["metadata"]["name"] == "p"
        assert len(seen) == 3
        first, second = clock.slept
        assert k.BACKOFF_BASE / 2 <= first <= k.BACKOFF_BASE and k.BACKOFF_BASE <= second <= 2 * k.BACKOFF_BASE
        pauses.append(clock.slept)
    assert pauses[0] != pauses[1]                # jitter: two clients failed together return apart


def test_the_retry_bound_fails_the_call_retryably_saying_so() -> None:
    clock = Clock()
    kb, seen = kube(lambda r: status(429, "TooManyRequests", **{"Retry-After": "5"}), clock, retry_seconds=12.0)
    with pytest.raises(Unreachable) as err:
        asyncio.run(kb.apply(k.PODS, "p", {"metadata": {"name": "p"}}))
    assert len(seen) == 3 and len(clock.slept) == 2           # 0 s, ~5 s, ~10 s; the next would pass 12 s
    assert sum(clock.slept) <= 12.0
    text = str(err.value)
    assert err.value.code == 429 and err.value.reason == "TooManyRequests"
    assert "API server unavailable (HTTP 429)" in text and "gave up after 3 attempts" in text
    assert "the retry bound of 12s" in text and "retry later" in text
    assert kb.pacing.throttled == 3


def test_throttled_attempts_are_capped_as_client_gos() -> None:
    clock = Clock()
    kb, seen = kube(lambda r: status(429, "TooManyRequests", **{"Retry-After": "0"}), clock)
    with pytest.raises(Unreachable):
        asyncio.run(kb.get(k.PODS, "p"))
    assert len(seen) == k.THROTTLED_ATTEMPTS


def test_a_refusal_is_never_retried() -> None:
    clock = Clock()
    kb, seen = kube(lambda r: status(403, "Forbidden", **{"Retry-After": "1"}), clock)
    with pytest.raises(Refused):
        asyncio.run(kb.get(k.PODS, "p"))
    assert len(seen) == 1 and clock.slept == []


@pytest.mark.parametrize(("kw", "field"), [({"qps": -1.0}, "qps"), ({"qps": float("nan")}, "qps"),
                                           ({"burst": 0}, "burst"), ({"retry_seconds": 0.0}, "retry_seconds")])
def test_bad_pacing_is_refused_naming_it_before_any_request(kw: dict[str, float], field: str) -> None:
    cluster = FakeCluster()
    before = cluster.server.requests if hasattr(cluster.server, "requests") else None
    with pytest.raises(InvalidInput) as err:
        Adapter.connect("default", transport=cluster.transport(roles=WRITER), **kw)  # type: ignore[arg-type]
    assert [c.field for c in err.value.causes] == [field]
    assert field in str(err.value)
    if before is not None:
        assert cluster.server.requests == before


def test_the_library_takes_a_limit() -> None:
    cluster = FakeCluster()
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER), qps=20, burst=30) as a:
        limit = a._async.kube.pacing.limit
        assert limit is not None and (limit.qps, limit.burst) == (20, 30)


def test_the_controller_options() -> None:
    assert (ControllerOptions().kube_api_qps, ControllerOptions().kube_api_burst) == (None, 30)
    got = parse(["--kube-api-qps", "20", "--kube-api-burst", "40"], environ=[])
    assert (got.kube_api_qps, got.kube_api_burst) == (20.0, 40)
    got = parse([], environ=[("DISPATCH_KUBE_API_QPS", "5"), ("DISPATCH_KUBE_API_BURST", "10")])
    assert (got.kube_api_qps, got.kube_api_burst) == (5.0, 10)
    with pytest.raises(ValueError, match="--kube-api-burst: must be at least 1"):
        ControllerOptions(kube_api_burst=0)
    with pytest.raises(ValueError, match="--kube-api-qps: must be at least 0"):
        ControllerOptions(kube_api_qps=-1.0)


def test_a_call_waiting_for_a_token_when_the_connection_closes_fails_retryably() -> None:
    """A controller stopping closes its connection while calls (best-effort Events) wait for tokens: each
    fails as ``Unreachable``, which its caller handles, not as the HTTP client's RuntimeError."""
    clock = Clock()
    kb, seen = kube(ok, clock, qps=1.0, burst=1)

    async def calls() -> None:
        await kb.get(k.PODS, "p")                       # the burst
        real_sleep = clock.sleep

        async def close_meanwhile(seconds: float) -> None:
            await kb.aclose()
            await real_sleep(seconds)
        kb.pacing.sleep = close_meanwhile
        assert kb.pacing.limit is not None
        kb.pacing.limit._sleep = close_meanwhile
        with pytest.raises(Unreachable, match="was closed before GET"):
            await kb.get(k.PODS, "p")

    asyncio.run(calls())
    assert len(seen) == 1


def test_a_retry_after_date_is_read_on_the_servers_clock() -> None:
    """An HTTP-date ``Retry-After`` is measured against the answer's own ``Date``, not this machine's clock (a
    machine 120 s ahead would otherwise not wait at all); without a ``Date``, against ``now``."""
    retry_after = k.retry_after
    dated = httpx2.Response(429, headers={"Retry-After": "Thu, 03 Dec 2026 17:00:05 GMT",
                                          "Date": "Thu, 03 Dec 2026 17:00:00 GMT"})
    ahead = 1796317200.0 + 120  # this machine's clock, two minutes ahead of the server's
    assert retry_after(dated, now=ahead) == 5.0
    undated = httpx2.Response(429, headers={"Retry-After": "Thu, 03 Dec 2026 17:00:05 GMT"})
    assert retry_after(undated, now=1796317200.0) == 5.0
    assert retry_after(httpx2.Response(429, headers={"Retry-After": "soon"})) is None
