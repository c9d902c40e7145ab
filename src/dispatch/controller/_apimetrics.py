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

    async def on_response(response: Any) -> None:
        request = response.request
        resource = resource_of(request.url.path)
        code, host = str(response.status_code), request.url.netloc.decode()
        metrics.api_requests.labels(code, request.method, resource).inc()
        metrics.rest_requests.labels(code, host, request.method).inc()
        started = request.extensions.get(STARTED)
        if isinstance(started, float):
            seconds = time.monotonic() - started
            metrics.api_seconds.labels(request.method, resource).observe(seconds)
            metrics.rest_seconds.labels(request.method, host).observe(seconds)

    return on_request, on_response

