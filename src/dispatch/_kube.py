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
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    "WORKLOADS", "Kube", "ListResult", "Res", "error_for",
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


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: str
    requests: int


def http_date(value: str | None) -> float | None:
    """An HTTP ``Date`` header (RFC 9110's IMF-fixdate) in seconds since the epoch; None for anything else."""
    if not value or len(value) > 64:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return when.timestamp() if when.tzinfo is not None else None


class Kube:
    """Async JSON access to one cluster. Used by the adapter and the controller, never elsewhere."""

    def __init__(self, client: httpx2.AsyncClient, namespace: str, *, retries: int = 3, where: str = "",
                 request_timeout: float | None = None) -> None:
        self._client = client
        self.namespace = namespace
        self.retries = retries
        self.where = where
        """The server and where its settings came from (``https://host:6443 (kubeconfig F, context C)``),
        so that an unreachable or silent server is named in the error, as kubectl names it."""
        self.request_timeout = request_timeout
        """Seconds one request may take with its retries (``--request-timeout``); None: only the
        per-attempt timeout bounds it."""
        self.requests = 0
        self.bytes_received = 0
        self._date: str | None = None

    @property
    def server_time(self) -> float | None:
        """The API server's clock, from the ``Date`` of its last answer (seconds since the epoch): the clock its
        own timestamps (deletion, creation) are on, so comparing them needs no second clock. None before any
        answer, or for one without a valid ``Date``."""
        return http_date(self._date)

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
    ) -> Kube:
        """Build from a kubeconfig (or in-cluster credentials), or over a test transport.

        ``request_timeout`` bounds each request with its retries (kubectl's ``--request-timeout``);
        ``overrides`` are kubectl's client flags laid over the kubeconfig."""
        if request_timeout is not None:
            timeout = min(timeout, request_timeout)
        if transport is not None:
            client = httpx2.AsyncClient(
                base_url="https://fake.invalid", transport=transport, timeout=timeout
            )
            return Kube(client, namespace or "default", where="https://fake.invalid",
                        request_timeout=request_timeout)
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
        return Kube(client, namespace or conn.namespace, where=where, request_timeout=request_timeout)

    @staticmethod
    def connect_inline(text: str, source: str, *, namespace: str, timeout: float = 15.0) -> Kube:
        """Build from a kubeconfig held in the cluster (a MultiKueue worker's Secret), inline credentials only."""
        from . import _kubeconfig

        conn = _kubeconfig.load_inline(text, source)
        client = httpx2.AsyncClient(
            base_url=conn.server, verify=conn.verify, auth=conn.auth, proxy=conn.proxy,
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(max_connections=16, max_keepalive_connections=8, keepalive_expiry=120.0),
            **conn.client_options(),
        )
        return Kube(client, namespace, where=f"{conn.server} ({source})")

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
        return Kube(self._client, namespace, retries=self.retries, where=self.where,
                    request_timeout=self.request_timeout)

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
    ) -> Obj:
        if self.request_timeout is None:
            return await self._attempts(method, path, params=params, body=body, content_type=content_type,
                                        retry=retry, list_call=list_call)
        try:
            async with asyncio.timeout(self.request_timeout):
                return await self._attempts(method, path, params=params, body=body, content_type=content_type,
                                            retry=retry, list_call=list_call)
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
    ) -> Obj:
        attempts = self.retries if retry else 1
        delay = 0.05
        last: DispatchError | None = None
        for attempt in range(attempts):
            try:
                self.requests += 1
                response = await self._client.request(
                    method,
                    path,
                    params=dict(params or {}),
                    content=_encode(body) if body is not None else None,
                    headers={"Content-Type": content_type, "Accept": "application/json"},
                )
            except httpx2.TimeoutException as exc:
                last = Unreachable(f"timed out talking to the API server{self._server()} ({method} {path}): "
                                   f"{_words(exc)}", reason="Timeout")
            except httpx2.TransportError as exc:
                last = Unreachable(
                    f"cannot reach the API server{self._server()} ({method} {path}): {_words(exc)}",
                    reason="ConnectionError",
                )
            else:
                self.bytes_received += len(response.content)
                self._date = response.headers.get("date")
                if response.status_code < 400:
                    try:
                        result = _decode(response.content) if response.content else {}
                    except ValueError:
                        raise not_api(method, path, response) from None
                    return result if isinstance(result, dict) else {}
                last = error_for(method, path, response, list_call=list_call)
                transient = response.status_code == 429 or response.status_code >= 500
                if not transient:
                    raise last
            if attempt + 1 < attempts:
                await asyncio.sleep(delay)
                delay *= 2
        assert last is not None
        raise last

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
        limit: int = 500,
        resource_version: str | None = None,
        exact: bool = False,
        all_namespaces: bool = False,
    ) -> ListResult:
        """One consistent list, following ``continue`` pages, every item kept (see ``pages`` for a
        caller that reduces each page as it arrives).

        With ``resource_version`` unset the first page is a quorum read at revision R and every
        continue page belongs to that same snapshot. With ``exact`` the list is pinned to
        ``resource_version`` (resourceVersionMatch=Exact). A continue page never resends the RV.
        """
        items: list[Obj] = []
        rv = ""
        requests = 0
        async for page in self.pages(res, namespace, labels=labels, limit=limit, resource_version=resource_version,
                                     exact=exact, all_namespaces=all_namespaces):
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
        params: dict[str, str] = {"limit": str(limit)}
        if labels:
            params["labelSelector"] = labels
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
            params = {"limit": str(limit), "continue": str(token)}
            if labels:
                params["labelSelector"] = labels

    async def create(self, res: Res, obj: Obj, namespace: str | None = None, *, dry_run: bool = False) -> Obj:
        """Create; with ``dry_run`` the server validates, defaults and prunes but stores nothing."""
        params = {"dryRun": "All"} if dry_run else None
        return await self._send("POST", res.path(self._ns(res, namespace)), body=obj, params=params, retry=False)

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
    ) -> Obj:
        """Server-side apply of our own fields; list-map entries of others are merged, not replaced."""
        params = {"fieldManager": field_manager}
        if force:
            params["force"] = "true"
        return await self._send(
            "PATCH", res.path(self._ns(res, namespace), name, sub), body=obj, params=params,
            content_type=APPLY, retry=False,
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
        self.requests += 1
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
        try:
            async with self._client.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise error_for("GET", path, response)
                async for line in response.aiter_lines():
                    yield line
        except httpx2.TransportError as exc:
            raise Unreachable(f"log stream lost: {exc}", reason="ConnectionError") from exc
