"""The one module that talks to the Kubernetes API.

A thin JSON layer over an authenticated HTTP client (``_kubeconfig`` says how to build it), so that
every request dispatch makes is explicit: which resourceVersion it reads at, which precondition a write
carries, which patch type a custom resource gets. Errors are mapped here, once, onto the tree in
``dispatch.errors``; nothing else in the package sees HTTP.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

import httpx2
import msgspec

from . import _names as n
from ._api import (  # re-exported: callers name kinds k.PODS, k.TRAINJOBS, ...
    ADMISSION_CHECKS,
    ALL,
    CLUSTER_QUEUES,
    CLUSTER_RUNTIMES,
    CONFIGMAPS,
    EVENTS,
    JOBS,
    JOBSETS,
    LEASES,
    LOCAL_QUEUES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_FLAVORS,
    RUNTIMES,
    TRAINJOBS,
    WORKLOADS,
    Obj,
    Res,
)
from .errors import (
    Conflict,
    DispatchError,
    FieldCause,
    Forbidden,
    NotFound,
    NotServed,
    Refused,
    Unreachable,
)

if TYPE_CHECKING:
    from ._overrides import ConfigOverrides

T = TypeVar("T")

_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder()


def _decode(data: bytes) -> Any:
    """JSON bodies and watch lines. msgspec (already under lightkube) decodes a list of 1,000
    Kubernetes objects several times faster than the standard library, and a controller deciding
    hundreds of Workloads a second spends much of its time decoding."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from exc


MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
NOT_SERVED_TEXTS = ("the server could not find the requested resource", "404 page not found")
"""How kube-apiserver words a 404 for a kind it does not serve (``error_for`` makes it ``NotServed``)."""



__all__ = [
    "ADMISSION_CHECKS", "ALL", "CLUSTER_QUEUES", "CLUSTER_RUNTIMES", "CONFIGMAPS", "EVENTS", "JOBS", "JOBSETS",
    "LEASES", "LOCAL_QUEUES", "NAMESPACES", "NODES", "PODS", "RESOURCE_FLAVORS", "RUNTIMES", "TRAINJOBS",
    "WORKLOADS", "Kube", "ListResult", "Pacing", "RateLimit", "Res", "error_for",
]

_VERB_WORDS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _decode_causes(body: Mapping[str, Any]) -> list[FieldCause]:
    details = body.get("details") or {}
    causes = details.get("causes") or [] if isinstance(details, Mapping) else []
    return [
        FieldCause(str(c.get("field", "")), str(c.get("message", "")), str(c.get("reason", "")))
        for c in causes
        if isinstance(c, Mapping)
    ]


def not_api(method: str, path: str, response: httpx2.Response) -> DispatchError:
    """A reply that is not the Kubernetes API's JSON (an HTML page from a proxy, a login portal or a web
    server): the server URL is wrong, or something stands in front of the API server."""
    code = response.status_code
    kind = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    title = re.search(rb"<title[^>]*>([^<]{1,120})</title>", response.content[:4096], re.IGNORECASE)
    what = f"HTTP {code} and a {kind} body"
    if title:
        what += f" titled {title[1].decode(errors='replace').strip()!r}"
    if response.headers.get("location"):
        what += f", a redirect to {response.headers['location']}"
    message = (f"{response.url.scheme}://{response.url.netloc.decode()} answered {method} {path.split('?')[0]} "
               f"with {what}, not the Kubernetes API's JSON")
    if code == 429 or code >= 500:
        return Unreachable(f"API server unavailable: {message}", reason="NotKubernetesAPI", code=code)
    return Refused(message, reason="NotKubernetesAPI", code=code)


def error_for(method: str, path: str, response: httpx2.Response, *, list_call: bool = False) -> DispatchError:
    """Map one failed response onto the error tree, keeping the API's reason and causes."""
    code = response.status_code
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        if b"<html" in response.content[:1024].lower() or "html" in response.headers.get("content-type", ""):
            return not_api(method, path, response)
        body = {}
    if not isinstance(body, Mapping):
        body = {}
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or " ".join(response.text[:300].split()) or f"HTTP {code}")
    causes = _decode_causes(body)
    verb = "list" if list_call else ("watch" if "watch=" in path else _VERB_WORDS.get(method, method.lower()))
    kw: dict[str, Any] = {"reason": reason, "code": code, "causes": causes}
    if code == 403:
        return Forbidden(f"forbidden: cannot {verb} {_resource_words(path)}: {message}", **kw)
    if code == 404:
        # kube-apiserver's answers for a kind it does not serve: a served group without the resource, or a
        # group it does not know at all (plain text "404 page not found")
        if any(text in message for text in NOT_SERVED_TEXTS):
            return NotServed(f"not found: {message}", **kw)
        return NotFound(f"not found: {message}", **kw)
    if code == 409 and reason == "AlreadyExists":
        return Refused(f"already exists: {message}", **kw)
    if code == 409:
        return Conflict(f"conflict: {message}", **kw)
    if code == 429 or code >= 500:
        return Unreachable(f"API server unavailable (HTTP {code}): {message}", **kw)
    if code == 401:
        return Forbidden(f"unauthorized: the credentials were not accepted: {message}", **kw)
    return Refused(message, **kw)


def _resource_words(path: str) -> str:
    """``pods in namespace ns`` from a request path, for Forbidden messages naming what was denied."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    ns = None
    if "namespaces" in parts:
        i = parts.index("namespaces")
        if i + 1 < len(parts):
            ns = parts[i + 1]
            parts = parts[:i] + parts[i + 2 :]
    if parts and parts[0] == "api":
        rest = parts[2:]
        group = ""
    else:
        rest = parts[3:]
        group = parts[1] if len(parts) > 1 else ""
    plural = rest[0] if rest else "?"
    what = f"{plural}.{group}" if group else plural
    if len(rest) > 2:
        what += f"/{rest[2]}"
    return f"{what} in namespace {ns}" if ns else what


def _words(exc: Exception) -> str:
    """An HTTP client error's text, never empty (a read timeout's own text is)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (no answer in time)"


Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

DEFAULT_QPS = 0.0
"""No client-side limit unless asked: controller-runtime's default since v0.21 (its config getters disable
client-go's limiter, as sig-apimachinery advises for API servers with Priority and Fairness, 1.20+); the
server's 429s, with their ``Retry-After``, pace the client instead."""
DEFAULT_BURST = 30
"""The burst a limit gets when only its QPS is given (controller-runtime's former 20 QPS / 30 burst)."""
RETRY_SECONDS = 30.0
"""The longest one call may take with its retries (client-go's retries are bounded by the request's
context); beyond it the call fails with ``Unreachable`` saying so."""
READ_ATTEMPTS = 3
"""Attempts of a read on a transient failure the server gave no ``Retry-After`` for."""
THROTTLED_ATTEMPTS = 10
"""Attempts of any call the server asked to retry later (429, or 5xx with ``Retry-After``): client-go's
``maxRetries``."""
BACKOFF_BASE = 0.05
BACKOFF_CAP = 5.0


CONFLICT_RETRIES = 5
"""How often a conditioned write is read and tried again when someone else wrote first (a 409)."""


def kept_changing(what: str) -> Conflict:
    """The one ``Conflict`` a conditioned write gives up with: ``what`` changed under every try."""
    return Conflict(f"{what} kept changing; retry", reason="Conflict", code=409)


async def on_conflict(attempt: Callable[[], Awaitable[T]], what: str, *, tries: int = CONFLICT_RETRIES) -> T:
    """``attempt`` (a read, a decision and a write conditioned on what was read) run again while it raises
    ``Conflict``, at most ``tries`` times; then ``kept_changing(what)``. The one retry-on-conflict loop:
    each caller says only what one try is, and a try that must read afresh for any other reason raises
    ``Conflict`` too."""
    for _ in range(tries):
        try:
            return await attempt()
        except Conflict:
            continue
    raise kept_changing(what)


class RateLimit:
    """client-go's token bucket (``flowcontrol.NewTokenBucketRateLimiter``): ``burst`` requests at once, then
    ``qps`` a second.

    Each caller reserves its token at once (the count may go below zero) and sleeps until that token would
    have been there (golang.org/x/time/rate's reservations): waiters are served in arrival order with no
    lock, and a burst of concurrent calls spreads out instead of stampeding the server.
    """

    def __init__(self, qps: float, burst: int, *, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._last = clock()
        self.waits = 0
        """Calls that had to wait for a token."""
        self.waited = 0.0
        """Seconds those calls waited, in all."""

    def reserve(self) -> float:
        """Take one token; the seconds to wait before sending (0: at once)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    async def wait(self) -> float:
        """Wait for a token; the seconds waited."""
        delay = self.reserve()
        if delay > 0:
            self.waits += 1
            self.waited += delay
            await self._sleep(delay)
        return delay


def pacing_problems(qps: float, burst: int, retry_seconds: float) -> list[FieldCause]:
    """What is wrong with a client's rate limit and retry bound (none: []), each naming its option."""
    out = []
    if not (isinstance(qps, int | float) and math.isfinite(qps) and qps >= 0):
        out.append(FieldCause("qps", f"must be a finite number of requests a second, 0 or more "
                                     f"(0: no client-side limit); got {qps!r}", "FieldValueInvalid"))
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        out.append(FieldCause("burst", f"must be a whole number of requests, at least 1; got {burst!r}",
                              "FieldValueInvalid"))
    if not (isinstance(retry_seconds, int | float) and math.isfinite(retry_seconds) and retry_seconds > 0):
        out.append(FieldCause("retry_seconds", f"must be a finite number of seconds above 0; got "
                                               f"{retry_seconds!r}", "FieldValueInvalid"))
    return out


@dataclass
class Pacing:
    """How one connection paces its calls: the client-side rate limit, the retries and their bound, and the
    clock, sleep and random source they run on (tests inject their own: nothing really waits, and nothing
    is timed). Shared by every ``in_namespace`` copy, so a controller serving many namespaces draws from one
    bucket, as one client-go ``rest.Config`` does."""

    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    retry_seconds: float = RETRY_SECONDS
    read_attempts: int = READ_ATTEMPTS
    throttled_attempts: int = THROTTLED_ATTEMPTS
    clock: Clock = time.monotonic
    sleep: Sleep = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)
    limit: RateLimit | None = field(init=False, default=None)
    throttled: int = field(init=False, default=0)
    """429 responses this connection met (the API server's Priority and Fairness, or max-in-flight)."""
    sent: int = field(init=False, default=0)
    """Requests this connection sent, retries included (``Kube.requests`` counts one copy's)."""

    def __post_init__(self) -> None:
        n.check(pacing_problems(self.qps, self.burst, self.retry_seconds))
        if self.qps > 0:
            self.limit = RateLimit(self.qps, self.burst, clock=self.clock, sleep=self.sleep)

    def backoff(self, attempt: int) -> float:
        """The pause before retry ``attempt`` (1, 2, ...) of a failure without ``Retry-After``: exponential,
        capped, and jittered over its upper half so that clients failed together do not return together."""
        ceiling = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** (attempt - 1))
        return ceiling / 2 + self.rng.random() * ceiling / 2

    def after(self, seconds: float) -> float:
        """The pause for a ``Retry-After`` of ``seconds``: never less, plus up to a fifth more (at most a
        second), so that clients told the same second spread out."""
        return seconds + self.rng.random() * min(1.0, seconds / 5 if seconds > 0 else 0.05)


def http_date(value: str | None) -> float | None:
    """An HTTP date (RFC 9110's IMF-fixdate: ``Date``, ``Retry-After``) in seconds since the epoch; None for
    anything else (missing, malformed, without a zone, absurdly long)."""
    if not value or len(value) > 64:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return when.timestamp() if when.tzinfo is not None else None


def retry_after(response: httpx2.Response, now: float | None = None) -> float | None:
    """The seconds a response's ``Retry-After`` asks for (delta-seconds or an HTTP date); None without one.
    An HTTP date is read against the response's own ``Date`` (the server's clock, so no second clock is
    compared), or ``now`` (this machine's) when the answer carries none."""
    value = response.headers.get("retry-after", "").strip()
    if not value or len(value) > 64:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    when = http_date(value)
    if when is None:
        return None
    base = http_date(response.headers.get("date"))
    if base is None:
        base = time.time() if now is None else now
    return max(0.0, when - base)


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: str
    requests: int


class Kube:
    """Async JSON access to one cluster. Used by the adapter and the controller, never elsewhere."""

    def __init__(self, client: httpx2.AsyncClient, namespace: str, *, where: str = "",
                 request_timeout: float | None = None, pacing: Pacing | None = None) -> None:
        self._client = client
        self.namespace = namespace
        self.where = where
        """The server and where its settings came from (``https://host:6443 (kubeconfig F, context C)``),
        so that an unreachable or silent server is named in the error, as kubectl names it."""
        self.request_timeout = request_timeout
        """Seconds one request may take with its retries (``--request-timeout``); None: only the
        per-attempt timeout and the pacing's retry bound limit it."""
        self.pacing = pacing if pacing is not None else Pacing()
        """The rate limit and retries, shared with every ``in_namespace`` copy."""
        self.requests = 0
        self.bytes_received = 0
        self._date: str | None = None
        self._base = str(client.base_url).rstrip("/") + "/"

    @property
    def server_time(self) -> float | None:
        """The API server's clock, from the ``Date`` of its last answer (seconds since the epoch): the clock its
        own timestamps (deletion, creation) are on, so comparing them needs no second clock. None before any
        answer, or for one without a valid ``Date``."""
        return http_date(self._date)

    @property
    def retries(self) -> int:
        """Attempts of a read on a transient failure without ``Retry-After`` (this connection's, shared by
        its ``in_namespace`` copies)."""
        return self.pacing.read_attempts

    @retries.setter
    def retries(self, value: int) -> None:
        self.pacing.read_attempts = value

    # ------------------------------------------------------------------ construction

    @staticmethod
    def connect(
        *,
        namespace: str | None = None,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        timeout: float = 15.0,
        request_timeout: float | None = None,
        overrides: ConfigOverrides | None = None,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        retry_seconds: float = RETRY_SECONDS,
        pacing: Pacing | None = None,
    ) -> Kube:
        """Build from a kubeconfig (or in-cluster credentials), or over a test transport.

        ``request_timeout`` bounds each request with its retries (kubectl's ``--request-timeout``);
        ``overrides`` are kubectl's client flags laid over the kubeconfig. ``qps``/``burst`` are client-go's
        client-side limit (0 QPS: none); ``retry_seconds`` bounds the time one call may spend retrying.
        ``pacing`` (tests: an injected clock and sleep) replaces all three."""
        if pacing is None:
            pacing = Pacing(qps=qps, burst=burst, retry_seconds=retry_seconds)
        if request_timeout is not None:
            timeout = min(timeout, request_timeout)
        if transport is not None:
            client = httpx2.AsyncClient(
                base_url="https://fake.invalid", transport=transport, timeout=timeout
            )
            return Kube(client, namespace or "default", where="https://fake.invalid",
                        request_timeout=request_timeout, pacing=pacing)
        from . import _kubeconfig

        conn = _kubeconfig.load(kubeconfig, context, overrides)
        # keep more connections alive than httpx's default so a busy controller reuses TLS connections
        # instead of handshaking for most requests
        client = httpx2.AsyncClient(
            base_url=conn.server, verify=conn.verify, auth=conn.auth, proxy=conn.proxy,
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(max_connections=64, max_keepalive_connections=32, keepalive_expiry=120.0),
            **conn.client_options(),
        )
        where = f"{conn.server} ({conn.source})" if conn.source else conn.server
        return Kube(client, namespace or conn.namespace, where=where, request_timeout=request_timeout,
                    pacing=pacing)

    @staticmethod
    def connect_inline(text: str, source: str, *, namespace: str, timeout: float = 15.0,
                       pacing: Pacing | None = None) -> Kube:
        """Build from a kubeconfig held in the cluster (a MultiKueue worker's Secret), inline credentials only.
        Each worker is its own API server, so it gets its own pacing (default: as ``connect``'s)."""
        from . import _kubeconfig

        conn = _kubeconfig.load_inline(text, source)
        client = httpx2.AsyncClient(
            base_url=conn.server, verify=conn.verify, auth=conn.auth, proxy=conn.proxy,
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(max_connections=16, max_keepalive_connections=8, keepalive_expiry=120.0),
            **conn.client_options(),
        )
        return Kube(client, namespace, where=f"{conn.server} ({source})", pacing=pacing)

    async def aclose(self) -> None:
        await self._client.aclose()

    def observe(self, on_request: Callable[[Any], Awaitable[None]],
                on_response: Callable[[Any], Awaitable[None]]) -> None:
        """Call these for every request sent and every response received on this connection (shared by
        ``in_namespace`` copies): the controller's API request metrics."""
        self._client.event_hooks["request"].append(on_request)
        self._client.event_hooks["response"].append(on_response)

    def in_namespace(self, namespace: str) -> Kube:
        """The same connection with another default namespace (the controller serves many namespaces).

        Shares the HTTP client, so only the original's ``aclose`` should be called; counters are its own.
        """
        return Kube(self._client, namespace, where=self.where, request_timeout=self.request_timeout,
                    pacing=self.pacing)

    # ------------------------------------------------------------------ core request

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
        list_call: bool = False,
        answer: bool = True,
    ) -> Obj:
        if self.request_timeout is None:
            return await self._attempts(method, path, params=params, body=body, content_type=content_type,
                                        retry=retry, list_call=list_call, answer=answer)
        try:
            async with asyncio.timeout(self.request_timeout):
                return await self._attempts(method, path, params=params, body=body, content_type=content_type,
                                            retry=retry, list_call=list_call, answer=answer)
        except TimeoutError:
            raise Unreachable(f"the API server{self._server()} did not answer {method} {path.split('?')[0]} "
                              f"within the request timeout of {self.request_timeout:g}s", reason="Timeout") from None

    def _server(self) -> str:
        return f" at {self.where}" if self.where else ""

    async def _attempts(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        retry: bool,
        list_call: bool,
        answer: bool = True,
    ) -> Obj:
        """Send with client-go's retry rules: a call the server asked to retry later (429 or a 5xx, with
        ``Retry-After``: APF and max-in-flight reject so before doing anything) is retried whatever its verb,
        after at least the time asked; a read (``retry``) is also retried on other 5xx and on lost
        connections, with jittered backoff. Every attempt waits for the rate limit first. No call retries
        past ``pacing.retry_seconds``: it fails with ``Unreachable`` saying how long it tried."""
        pacing = self.pacing
        started = pacing.clock()
        attempt = 0
        while True:
            attempt += 1
            if pacing.limit is not None:
                await pacing.limit.wait()
            if self._client.is_closed:      # closed while this call waited (a controller stopping)
                raise Unreachable(f"the connection to the API server{self._server()} was closed before "
                                  f"{method} {path.split('?')[0]} was sent", reason="Closed")
            pause: float | None = None
            throttled = False
            try:
                self.requests += 1
                pacing.sent += 1
                response = await self._client.request(
                    method,
                    self._url(path, params),
                    content=_encode(body) if body is not None else None,
                    headers={"Content-Type": content_type, "Accept": "application/json"},
                )
            except httpx2.TimeoutException as exc:
                last: DispatchError = Unreachable(
                    f"timed out talking to the API server{self._server()} ({method} {path}): {_words(exc)}",
                    reason="Timeout")
            except httpx2.TransportError as exc:
                last = Unreachable(
                    f"cannot reach the API server{self._server()} ({method} {path}): {_words(exc)}",
                    reason="ConnectionError",
                )
            else:
                self.bytes_received += len(response.content)
                self._date = response.headers.get("date")
                if response.status_code < 400:
                    if not answer and response.content[:1] == b"{":   # an API object the caller does not read
                        return {}
                    try:
                        result = _decode(response.content) if response.content else {}
                    except ValueError:
                        raise not_api(method, path, response) from None
                    return result if isinstance(result, dict) else {}
                last = error_for(method, path, response, list_call=list_call)
                code = response.status_code
                if code != 429 and code < 500:
                    raise last
                if code == 429:
                    pacing.throttled += 1
                wait = retry_after(response)
                if wait is not None:            # client-go's checkWait: 429 or 5xx, with Retry-After
                    throttled = True
                    pause = pacing.after(wait)
            if not throttled and not retry:
                raise last
            limit = pacing.throttled_attempts if throttled else pacing.read_attempts
            if attempt >= limit:
                raise last
            if pause is None:
                pause = pacing.backoff(attempt)
            spent = pacing.clock() - started
            if spent + pause > pacing.retry_seconds:
                raise Unreachable(
                    f"{last.message}; gave up after {attempt} attempt{'s' if attempt > 1 else ''} in {spent:.1f}s: "
                    f"the next, {pause:.1f}s later, would pass the retry bound of {pacing.retry_seconds:g}s "
                    "(retry later)", reason=last.reason, code=last.code, causes=last.causes)
            await pacing.sleep(pause)

    def _url(self, path: str, params: Mapping[str, str] | None) -> httpx2.URL:
        """The request's absolute URL, parsed once: given a path and params, httpx2 parses the path, joins it to the
        base URL, parses that again and once more with the query (~40 us of a ~150 us request's client CPU,
        issue 37). Joined as httpx2 joins them: the base URL's path, then this one's; the query encoded as
        httpx2 encodes params."""
        if params:   # params replace a query the path holds, as in httpx2
            return httpx2.URL(f"{self._base}{path.split('?', 1)[0].lstrip('/')}?{urlencode(params)}")
        return httpx2.URL(self._base + path.lstrip("/"))

    # ------------------------------------------------------------------ verbs

    def _ns(self, res: Res, namespace: str | None) -> str | None:
        return (namespace or self.namespace) if res.namespaced else None

    async def get(self, res: Res, name: str, namespace: str | None = None, sub: str | None = None) -> Obj:
        return await self._send("GET", res.path(self._ns(res, namespace), name, sub))

    async def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return await self.get(res, name, namespace)
        except NotFound:
            return None

    async def list(
        self,
        res: Res,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
        exact: bool = False,
        all_namespaces: bool = False,
    ) -> ListResult:
        """One consistent list, following ``continue`` pages, every item kept (see ``pages`` for a
        caller that reduces each page as it arrives).

        With ``resource_version`` unset the first page is a quorum read at revision R and every
        continue page belongs to that same snapshot. With ``exact`` the list is pinned to
        ``resource_version`` (resourceVersionMatch=Exact). A continue page never resends the RV. ``fields`` is a
        field selector (``involvedObject.uid=U,reason=R`` for Events), sent with every page as labels are.
        """
        items: list[Obj] = []
        rv = ""
        requests = 0
        async for page in self.pages(res, namespace, labels=labels, fields=fields, limit=limit,
                                     resource_version=resource_version, exact=exact, all_namespaces=all_namespaces):
            items.extend(page.items)
            rv = rv or page.resource_version
            requests += 1
        return ListResult(items, rv, requests)

    async def pages(
        self,
        res: Res,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        limit: int = 500,
        resource_version: str | None = None,
        exact: bool = False,
        all_namespaces: bool = False,
    ) -> AsyncGenerator[ListResult, None]:
        """The pages of one consistent list, one at a time, each with the snapshot's resourceVersion.

        A caller that keeps only a few fields of each item (the controller's informers) holds one page
        of decoded objects at a time, never a whole cluster's. An expired continue token raises
        Unreachable (410): the caller starts the list again.
        """
        ns = None if all_namespaces else self._ns(res, namespace)
        path = res.path(ns)
        selectors = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        params: dict[str, str] = {"limit": str(limit), **selectors}
        if resource_version is not None:
            params["resourceVersion"] = resource_version
            if exact:
                params["resourceVersionMatch"] = "Exact"
        rv = ""
        while True:
            page = await self._send("GET", path, params=params, list_call=True)
            meta = page.get("metadata") or {}
            if not rv:
                rv = str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            items = page.get("items") or []
            del page
            yield ListResult(items, rv, 1)
            del items
            if not token:
                break
            params = {"limit": str(limit), "continue": str(token), **selectors}

    async def create(self, res: Res, obj: Obj, namespace: str | None = None, *, dry_run: bool = False,
                     answer: bool = True) -> Obj:
        """Create; with ``dry_run`` the server validates, defaults and prunes but stores nothing. ``answer=False``:
        the created object is not decoded ({} is returned), for a caller that does not read it."""
        params = {"dryRun": "All"} if dry_run else None
        return await self._send("POST", res.path(self._ns(res, namespace)), body=obj, params=params, retry=False,
                                answer=answer)

    async def replace(self, res: Res, name: str, obj: Obj, namespace: str | None = None) -> Obj:
        return await self._send("PUT", res.path(self._ns(res, namespace), name), body=obj, retry=False)

    async def merge_patch(
        self, res: Res, name: str, patch: Obj, namespace: str | None = None, sub: str | None = None
    ) -> Obj:
        """A JSON merge patch. Put ``metadata.resourceVersion`` in ``patch`` to make it conditional."""
        return await self._send(
            "PATCH", res.path(self._ns(res, namespace), name, sub), body=patch,
            content_type=MERGE, retry=False,
        )

    async def apply(
        self,
        res: Res,
        name: str,
        obj: Obj,
        namespace: str | None = None,
        sub: str | None = None,
        *,
        field_manager: str = n.FIELD_MANAGER,
        force: bool = True,
        answer: bool = True,
    ) -> Obj:
        """Server-side apply of our own fields; list-map entries of others are merged, not replaced.
        ``answer=False``: the object as applied is not decoded ({} is returned), for a caller that does not read
        it (a Workload's status answer is the whole Workload)."""
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        return await self._send(
            "PATCH", res.path(self._ns(res, namespace), name, sub), body=obj, params=params,
            content_type=APPLY, retry=False, answer=answer,
        )

    async def delete(
        self,
        res: Res,
        name: str,
        namespace: str | None = None,
        *,
        grace_seconds: int | None = None,
        propagation: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if propagation:
            body["propagationPolicy"] = propagation
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        return await self._send(
            "DELETE", res.path(self._ns(res, namespace), name), body=body, retry=False
        )

    async def watch(
        self,
        res: Res,
        namespace: str | None = None,
        *,
        resource_version: str,
        labels: str | None = None,
        timeout_seconds: int = 300,
        all_namespaces: bool = False,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Watch events from ``resource_version``. Ends on timeout; raises Unreachable on 410 Gone."""
        ns = None if all_namespaces else self._ns(res, namespace)
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        if labels:
            params["labelSelector"] = labels
        path = res.path(ns)
        if self.pacing.limit is not None:
            await self.pacing.limit.wait()
        self.requests += 1
        self.pacing.sent += 1
        timeout = httpx2.Timeout(15.0, read=timeout_seconds + 30)
        try:
            async with self._client.stream(
                "GET", path, params=params, headers={"Accept": "application/json"}, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_for("GET", path + "?watch=1", response, list_call=False)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = _decode(line.encode())
                    etype = str(event.get("type"))
                    obj = event.get("object") or {}
                    if etype == "ERROR":
                        code = int(obj.get("code") or 500)
                        raise Unreachable(
                            f"watch ended: {obj.get('message', '')}", reason=str(obj.get("reason", "")),
                            code=code,
                        )
                    yield etype, obj
        except httpx2.TimeoutException as exc:
            raise Unreachable(f"watch timed out: {exc}", reason="Timeout") from exc
        except httpx2.TransportError as exc:
            raise Unreachable(f"watch connection lost: {exc}", reason="ConnectionError") from exc

    async def logs(
        self, pod: str, namespace: str | None = None, *, container: str | None = None, follow: bool = False,
        tail: int | None = None, since_seconds: int | None = None, timestamps: bool = False, previous: bool = False,
    ) -> AsyncIterator[str]:
        params = {"follow": "true" if follow else "false"}
        if container:
            params["container"] = container
        if tail is not None:
            params["tailLines"] = str(tail)
        if since_seconds is not None:
            params["sinceSeconds"] = str(since_seconds)
        if timestamps:
            params["timestamps"] = "true"
        if previous:
            params["previous"] = "true"
        path = PODS.path(namespace or self.namespace, pod, "log")
        timeout = httpx2.Timeout(15.0, read=None if follow else 60.0)
        if self.pacing.limit is not None:
            await self.pacing.limit.wait()
        try:
            async with self._client.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_for("GET", path, response)
                async for line in response.aiter_lines():
                    yield line
        except httpx2.TransportError as exc:
            raise Unreachable(f"log stream lost: {exc}", reason="ConnectionError") from exc
