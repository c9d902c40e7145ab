"""``rest_client_*`` series from the controller's API requests, as controller-runtime exports them, and
dispatch's own ``dispatch_api_*`` by resource.

The hooks sit on the HTTP client the ``Kube`` wraps, so every request any part of the controller sends
(informers, reconciles, the guard's reads, the Lease) is counted once: by status code, method and host
(client-go's labels), and by status code, method and resource (dispatch's), with its latency to the
response's headers. A request that gets no response (a refused
connection, a timeout) has no code and is not counted here: the reconcile errors and the logs show it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._metrics import Metrics

STARTED = "dispatch.started"


def resource_of(path: str) -> str:
    """The resource (``pods``, ``pods/status``, ``workloads``) a request path names; the path's first
    segment for non-resource paths (``version``, ``healthz``)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts:
        return "other"
    if parts[0] == "api":
        rest = parts[2:]
    elif parts[0] == "apis":
        rest = parts[3:]
    else:
        return parts[0]
    if rest[:1] == ["watch"]:
        rest = rest[1:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    if not rest:
        return "other"
    return f"{rest[0]}/{rest[2]}" if len(rest) >= 3 else rest[0]


def hooks(metrics: Metrics) -> tuple[Callable[[Any], Awaitable[None]], Callable[[Any], Awaitable[None]]]:
    """(on request, on response) for the client's event hooks."""

    async def on_request(request: Any) -> None:
        request.extensions[STARTED] = time.monotonic()

    series: dict[tuple[int, str, str, bytes], tuple[Any, Any, Any, Any]] = {}
    """The four series of each (code, method, resource, host), looked up once: a label look-up costs a few us,
    and a busy controller has thousands of responses a second, of a few dozen kinds."""

    def series_of(code: int, method: str, resource: str, netloc: bytes) -> tuple[Any, Any, Any, Any]:
        key = (code, method, resource, netloc)
        found = series.get(key)
        if found is None:
            host = netloc.decode()
            found = series[key] = (metrics.api_requests.labels(str(code), method, resource),
                                   metrics.rest_requests.labels(str(code), host, method),
                                   metrics.api_seconds.labels(method, resource),
                                   metrics.rest_seconds.labels(method, host))
        return found

    async def on_response(response: Any) -> None:
        request = response.request
        url = request.url
        api_count, rest_count, api_seconds, rest_seconds = series_of(
            response.status_code, request.method, resource_of(url.path), url.netloc)
        api_count.inc()
        rest_count.inc()
        started = request.extensions.get(STARTED)
        if isinstance(started, float):
            seconds = time.monotonic() - started
            api_seconds.observe(seconds)
            rest_seconds.observe(seconds)

    return on_request, on_response

