"""The guard: a validating admission webhook, so the API server itself refuses an unsafe start.

dispatch's verbs and its Kueue check only start an execution once no pod of the previous one may run,
but any writer with patch on TrainJobs could unsuspend one by hand. The API server sends every write
that could start an execution of a dispatch TrainJob, or touch its identity, here first (the
ValidatingWebhookConfiguration in ``deploy/base/guard.yaml``, ``failurePolicy: Fail``), and this server
answers with the same consistent read the admission protocol takes (``_read.Reader.read``, with the
controller's own ServiceAccount) and the pure decision ``_decision.guard``.

* **stateless**: every replica serves (leader or not); each answer is one fresh read.
* **within the API server's timeout**: the read gets most of the ``timeout`` the API server puts in the
  URL; a read that does not finish in time is a denial naming why, never a silent allow.
* **pods**: ``/validate-pod`` judges each create of a dispatch object's pod (the Job controller's, after
  JobSet or Trainer re-created a deleted Job or JobSet, or its own replacement of a deleting pod) with
  ``_decision.pod_start_problem`` over one read of the submission's pods and their Nodes: no rank starts
  again, and no other execution starts, while a pod that may run it remains.
* **enrolment**: the same server answers ``/mutate-trainjob`` (MutatingWebhookConfiguration
  ``dispatch-guard``, only for namespaces labelled ``dispatch.phpboyscout.uk/enrol=true``): a TrainJob
  created there is brought under dispatch with the JSONPatch of the pure ``_enrol.enrol``; this file
  only reads the runtime the TrainJob names and encodes the answer.
* **TLS**: ``--guard-cert-dir`` holding ``tls.crt``/``tls.key`` (cert-manager's Secret, mounted) is used
  as is; otherwise the controller makes its own CA and serving certificate there and adds the CA to the
  ``caBundle`` of its webhook configuration (each replica its own CA; the bundle keeps the newest few, and
  each replica re-adds its own periodically).
* **never expired**: with ``failurePolicy: Fail`` an expired serving certificate would refuse every start,
  so the served certificate is reloaded when its files change (cert-manager renews them in place), and a
  certificate of the controller's own is renewed ``RENEW_BEFORE`` ahead of its end: the new CA is
  published beside the old one first, then served.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import os
import ssl
import tempfile
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry, Counter, Histogram

from .. import _api as api
from .. import _decision as d
from .. import _enrol as e
from .. import _kube as k
from .._api import Obj
from .._core import Cores, Target
from .._read import by_identity
from .._trainer import TrainJobView
from .._views import PodView
from ..errors import Conflict, DispatchError, NotFound
from . import _http as http
from . import _tls as tls
from ._metrics import WebhookMetrics

T = TypeVar("T")

log = structlog.get_logger("dispatch.guard")


PATH = "/validate-trainjob"
POD_PATH = "/validate-pod"
"""Pod creates of dispatch objects: the one point where a process starts, whoever creates the pod."""
MUTATE_PATH = "/mutate-trainjob"
BUNDLE_KEEP = 8
"""CAs kept in the caBundle: every live replica's, across a few restarts."""
REPUBLISH_SECONDS = 60.0
DEFAULT_TIMEOUT = 10.0
"""The API server's webhook timeout when its URL names none (``timeoutSeconds`` defaults to 10)."""
MAX_BODY = 8 * 1024 * 1024
MAX_HEAD = 16 * 1024
"""An AdmissionReview's request line and headers are a few hundred bytes; a longer head is nobody's review."""
MAX_CONNECTIONS = 128
"""Connections at once: the API server keeps a few alive per replica; more come from no API server."""
MAX_BUFFERED = 48 * 1024 * 1024
"""Body bytes held at once over every connection: with the head bound and the connection cap, what any client
that reaches the port can make the guard hold stays far below its container's 384Mi limit."""
RENEW_BEFORE = dt.timedelta(days=30)
"""A certificate of the controller's own is replaced this long before it ends (it lasts 365 days)."""
SWITCH_DELAY = 5.0
"""Seconds between publishing a renewed CA and serving the certificate it signed (the API server reloads a
changed webhook configuration within about a second)."""


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certs:
    """The serving certificate's files, and the CA to publish (None: someone else publishes it)."""

    cert: Path
    key: Path
    ca_pem: bytes | None


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def generate_certs(directory: Path, hosts: Sequence[str], *, days: int = 365) -> Certs:
    """A fresh CA and a serving certificate for ``hosts`` (DNS names or IP addresses) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    made = tls.issue(hosts, ca_name="dispatch-guard-ca", days=days)
    _write(directory / "tls.key", made.key_pem, 0o600)
    _write(directory / "ca.crt", made.ca_pem, 0o644)
    _write(directory / "tls.crt", made.cert_pem, 0o644)
    return Certs(directory / "tls.crt", directory / "tls.key", made.ca_pem)


def renewal_due(cert: Path, *, now: dt.datetime | None = None, before: dt.timedelta | None = None) -> bool:
    """Whether the certificate in ``cert`` ends within ``before`` (default ``RENEW_BEFORE``), has ended,
    or cannot be read."""
    try:
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    except (OSError, ValueError):
        return True
    margin = RENEW_BEFORE if before is None else before
    return leaf.not_valid_after_utc - (now or dt.datetime.now(dt.UTC)) < margin


def renewable(directory: Path) -> bool:
    """Whether the certificates in ``directory`` are the controller's own to replace: a writable directory
    (an emptyDir). A mounted Secret (cert-manager's) is read-only and renewed by its owner."""
    return os.access(directory, os.W_OK)


def load_or_generate(directory: Path | None, hosts: Sequence[str], *, renew: bool = True) -> Certs:
    """``tls.crt``/``tls.key`` already in ``directory`` (cert-manager, or an earlier start) are used, with
    its ``ca.crt`` if present, unless they are the controller's own and due for renewal (``renew``: the
    controller publishes its CA, so a new one will be trusted); otherwise a new CA and certificate are made
    there (a private temporary directory when none is given)."""
    if directory is not None and (directory / "tls.crt").is_file() and (directory / "tls.key").is_file():
        if not (renew and renewal_due(directory / "tls.crt") and renewable(directory)):
            ca = directory / "ca.crt"
            return Certs(directory / "tls.crt", directory / "tls.key", ca.read_bytes() if ca.is_file() else None)
        log.info("guard certificate due for renewal; making a new one", directory=str(directory))
    return generate_certs(directory or Path(tempfile.mkdtemp(prefix="dispatch-guard-")), hosts)


def merged_bundle(existing: bytes, ours: bytes, *, keep: int = BUNDLE_KEEP) -> bytes:
    """``existing`` with ``ours`` added: expired CAs dropped, the newest ``keep`` kept (ours always)."""
    now = dt.datetime.now(dt.UTC)
    mine = x509.load_pem_x509_certificate(ours)
    try:
        others = x509.load_pem_x509_certificates(existing) if existing.strip() else []
    except ValueError:
        others = []  # an unparseable bundle is replaced: the API server could not have used it either
    kept = [c for c in others if c != mine and c.not_valid_after_utc > now]
    kept.sort(key=lambda c: c.not_valid_before_utc, reverse=True)
    chosen = [mine, *kept[: max(0, keep - 1)]]
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chosen)


async def publish_ca(kube: k.Kube, webhook: str, ca_pem: bytes, res: k.Res = api.VALIDATING_WEBHOOKS) -> bool:
    """Make every webhook of configuration ``webhook`` (of kind ``res``) trust ``ca_pem``; True if anything
    was written."""
    for _ in range(5):
        obj = await kube.get(res, webhook)
        hooks = list(obj.get("webhooks") or [])
        changed = False
        for hook in hooks:
            client = hook.setdefault("clientConfig", {})
            current = base64.b64decode(client.get("caBundle") or "")
            bundle = merged_bundle(current, ca_pem)
            if bundle != current:
                client["caBundle"] = base64.b64encode(bundle).decode()
                changed = True
        if not changed:
            return False
        body = {"metadata": {"resourceVersion": obj.get("metadata", {}).get("resourceVersion")}, "webhooks": hooks}
        try:
            await kube.merge_patch(res, webhook, body)
            return True
        except Conflict:
            continue
    return False


# --------------------------------------------------------------------------- the review


def _view(obj: object) -> TrainJobView | None:
    return TrainJobView.from_obj(obj) if isinstance(obj, dict) and obj else None


def response(uid: str, denial: str | None, patch: Sequence[Obj] = (), warnings: Sequence[str] = ()) -> Obj:
    out: Obj = {"uid": uid, "allowed": denial is None}
    if denial is not None:
        out["status"] = {"code": 403, "reason": "Forbidden", "message": denial}
    elif patch:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
    if warnings:
        out["warnings"] = list(warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": out}


class Guard:
    """Answers AdmissionReviews of TrainJob writes with ``_decision.guard`` over a fresh read."""

    def __init__(self, kube: k.Kube, registry: CollectorRegistry | None = None, *, worker: bool = False) -> None:
        self.kube = kube
        self.worker = worker
        """This cluster is a MultiKueue worker (``--multikueue-worker``): copies are judged as copies."""
        self._core = Cores(kube)
        self.reviews = 0
        self.denials = 0
        reg = registry if registry is not None else CollectorRegistry()
        self._answers = Counter("dispatch_guard_reviews", "Writes the guard answered, by answer.",
                                ["answer"], registry=reg)
        self._seconds = Histogram("dispatch_guard_review_seconds", "Time to answer one AdmissionReview.",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
                                  registry=reg)
        self.webhook_metrics = WebhookMetrics.create(reg)


    async def decide(self, request: Obj) -> str | None:
        """The denial for one AdmissionRequest, or None."""
        operation = str(request.get("operation") or "")
        new = _view(request.get("object"))
        old = _view(request.get("oldObject"))
        if new is None:
            return None  # a DELETE (or a connect): nothing starts
        if not (new.labelled or (old is not None and old.labelled)):
            return None
        if not d.starts_execution(operation, old, new) or not new.labelled:
            return d.guard(operation, old, new, None, None)
        core = self._core(str(request.get("namespace") or new.ref.namespace))
        target = Target.of(new)
        snap, record, workload, jobs = await asyncio.gather(
            core.read_one(target), core.record(new.job_id, new.submission),
            (core.copy_workload(new) if d.multikueue_copy(new, worker=self.worker) else core.workload_of(new))
            if operation == "UPDATE" else _none(), core.runtime_jobs_of(new))
        # a NonIndexed Job's pods could not be told apart from replacements (issue 35 item 6): said first
        return d.nonindexed_text(f"trainjob {new.name} cannot start", d.jobs_nonindexed(snap.jobs, new.name)) \
            or d.guard(operation, old, new, snap.verdict(target), record, workload, jobs, worker=self.worker)

    async def decide_pod(self, request: Obj) -> str | None:
        """The denial for one pod create, or None (``_decision.pod_start_problem`` over a fresh read)."""
        obj = request.get("object")
        if str(request.get("operation") or "") != "CREATE" or not isinstance(obj, dict):
            return None  # the configuration sends creates only
        new = PodView.from_obj(obj)
        problem = d.pod_create_problem(new)  # judged on the pod alone, before any read
        if problem is not None or new.mirror or not new.job_id or not new.submission:
            return problem  # a static pod's mirror runs nothing: its kubelet runs the static pod regardless
        core = self._core(str(request.get("namespace") or new.namespace))
        pods, nodes = await core.submission_pods(new.job_id, new.submission)
        return d.pod_start_problem(new, pods, nodes)

    async def _within(self, work: Coroutine[Any, Any, T], timeout: float, what: str) -> tuple[T | None, str | None]:
        """One review's reads under the webhook's deadline, counted and timed; a read that fails or runs
        out of time is a denial naming ``what`` could not be read (the guard fails closed)."""
        self.reviews += 1
        started = time.monotonic()
        try:
            return await asyncio.wait_for(work, timeout), None
        except TimeoutError:
            return None, f"the guard could not read {what} within {timeout:.1f}s; retry"
        except DispatchError as exc:
            return None, f"the guard could not read {what}: {exc}"
        finally:
            self._seconds.observe(time.monotonic() - started)

    async def review(self, body: Obj, timeout: float, *, pod: bool = False) -> Obj:
        """Answer one AdmissionReview of a TrainJob write (``pod``: of a pod create)."""
        request, uid = _request_of(body)
        work = self.decide_pod(request) if pod else self.decide(request)
        decided, failure = await self._within(work, timeout, "the submission's pods" if pod else "the object's pods")
        denial = failure if failure is not None else decided
        self._answers.labels("error" if failure is not None else "allowed" if denial is None else "denied").inc()
        if denial is not None:
            self.denials += 1
            obj = request.get("object") or {}
            log.info("guard denied", kind="Pod" if pod else "TrainJob", operation=request.get("operation"),
                     namespace=request.get("namespace"),
                     name=request.get("name") or obj.get("metadata", {}).get("name"),
                     user=(request.get("userInfo") or {}).get("username"), denial=denial)
        return response(uid, denial)

    async def enrolment(self, request: Obj) -> e.Enrolment:
        """``_enrol.enrol`` over the object and the runtime it names (read only when it is needed)."""
        obj = request.get("object")
        if not isinstance(obj, dict) or str(request.get("operation") or "") != "CREATE":
            return e.Enrolment()  # the configuration sends creates only; anything else is left alone
        uid = str(request.get("uid") or "")
        ref = e.runtime_ref(obj)
        runtime = None
        if ref is not None and not e.is_dispatch(obj):
            kind, name = ref
            if kind == "TrainingRuntime":
                namespace = str(request.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "")
                runtime = await self.kube.get_or_none(api.RUNTIMES, name, namespace)
            else:
                runtime = await self.kube.get_or_none(api.CLUSTER_RUNTIMES, name)
        got = e.enrol(obj, uid, runtime)
        if got.denial is None and got.job_id and got.submission:
            name = str((obj.get("metadata") or {}).get("name") or "")
            denial = await self._collision(request, name, got.job_id, got.submission)
            if denial:
                return e.Enrolment(denial=denial)
        return got

    async def _collision(self, request: Obj, name: str, job_id: str, submission: str) -> str | None:
        """``_enrol.collision`` over the submission's record and its live TrainJobs (a get and a list)."""
        namespace = str(request.get("namespace") or "")
        core = self._core(namespace)
        record, listed = await asyncio.gather(core.record(job_id, submission),
                                              core.trainjobs(by_identity([(job_id, submission)])))
        live = [v.name for v in listed if not v.deleting]
        return e.collision(name, job_id, submission, record.trainjob if record is not None else "", live)

    async def mutate(self, body: Obj, timeout: float) -> Obj:
        """Answer one AdmissionReview of a TrainJob create in an enrolled namespace (a JSONPatch, or a
        denial naming the field; a runtime that cannot be read in time is a denial too: failing closed)."""
        request, uid = _request_of(body)
        enrolled, failure = await self._within(self.enrolment(request), timeout, "the TrainJob's runtime")
        if enrolled is None or failure is not None:
            got, answer = e.Enrolment(denial=failure), "error"
        else:
            got = enrolled
            answer = "enrolled" if got.patch else ("denied" if got.denial else "unchanged")
        self._answers.labels(answer).inc()
        obj = request.get("object") or {}
        name = request.get("name") or obj.get("metadata", {}).get("name")
        if got.denial is not None:
            self.denials += 1
            log.info("enrolment denied", namespace=request.get("namespace"), name=name,
                     user=(request.get("userInfo") or {}).get("username"), denial=got.denial)
        elif got.patch:
            log.info("trainjob enrolled", namespace=request.get("namespace"), name=name, job_id=got.job_id,
                     submission=got.submission)
        return response(uid, got.denial, got.patch, got.warnings)


async def _none() -> None:
    return None


def _request_of(body: Obj) -> tuple[Obj, str]:
    """The AdmissionRequest of a review and its uid (the answer must carry it back)."""
    request = body.get("request")
    if not isinstance(request, dict):
        raise ValueError("not an AdmissionReview: no request")
    return request, str(request.get("uid") or "")


# --------------------------------------------------------------------------- HTTPS


def _timeout_of(target: str) -> float:
    """Most of the time the API server allows (``?timeout=10s``), so an answer arrives before it gives up."""
    raw = parse_qs(urlsplit(target).query).get("timeout", [""])[0]
    try:
        seconds = float(raw.rstrip("s")) if raw.endswith("s") else DEFAULT_TIMEOUT
    except ValueError:
        seconds = DEFAULT_TIMEOUT
    return max(0.5, seconds * 0.8)


JSON = "application/json"


def _context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


def tls_context(certs: Certs) -> tls.Reloading:
    """The server's TLS context, which :meth:`~._tls.Reloading.reload` switches to new files for new
    connections."""
    return tls.Reloading(_context, certs.cert, certs.key, what="guard")


async def serve(guard: Guard, host: str, port: int, certs: Certs,
                context: tls.Reloading | None = None) -> asyncio.Server:
    """Serve AdmissionReviews on ``PATH`` over TLS, keeping connections alive; the caller closes it."""
    served = context or tls_context(certs)

    async def route(request: http.Request) -> http.Answer:
        m = guard.webhook_metrics
        m.in_flight.labels(request.path).inc()
        started = time.monotonic()
        code = 500
        try:
            review = _parse_review(request.body)
            timeout = _timeout_of(request.target)
            answer = await (guard.mutate(review, timeout) if request.path == MUTATE_PATH
                            else guard.review(review, timeout, pod=request.path == POD_PATH))
            code = 200
        except ValueError as exc:
            code = 400
            return 400, JSON, json.dumps({"error": str(exc)}).encode(), ""
        finally:
            m.in_flight.labels(request.path).dec()
            m.requests.labels(request.path, str(code)).inc()
            m.latency.labels(request.path).observe(time.monotonic() - started)
        return 200, JSON, json.dumps(answer).encode(), ""

    listener = http.Listener(
        route, methods=frozenset({"POST"}), paths=frozenset({PATH, POD_PATH, MUTATE_PATH}), keep_alive=True,
        max_head=MAX_HEAD, max_body=MAX_BODY, timeout=120, max_connections=MAX_CONNECTIONS,
        max_buffered=MAX_BUFFERED,
        not_found=(404, JSON, b'{"error":"not found"}', ""),
        not_allowed=(405, JSON, b'{"error":"POST an AdmissionReview"}', ""),
        too_large=(413, JSON, b'{"error":"too large"}', ""))
    return await http.start(listener, host, port, context=served.context)


def _parse_review(body: bytes) -> Obj:
    """The AdmissionReview in ``body`` (an object; anything else reads as an empty one), or ``ValueError``
    for JSON nested deeper than the parser's recursion allows (200,000 ``[`` once escaped as an unhandled
    ``RecursionError``); a Kubernetes object nests a few dozen levels at most."""
    try:
        review = json.loads(body)
    except RecursionError:
        raise ValueError("the request body nests too deep to be an AdmissionReview") from None
    return review if isinstance(review, dict) else {}


async def _publish(kube: k.Kube, webhook: str, ca_pem: bytes) -> bool:
    """Our CA into the validating configuration ``webhook`` and, when installed, enrolment's mutating one
    of the same name (enrolment is optional: its absence is no warning). True once the API server can
    trust this replica: the CA is in the validating bundle, or there is no such configuration to call it."""
    trusted = True
    try:
        if await publish_ca(kube, webhook, ca_pem):
            log.info("guard CA published", webhook=webhook)
    except NotFound:
        log.warning("guard webhook configuration not found; its caBundle is not kept", webhook=webhook)
    except DispatchError as exc:
        trusted = False
        log.warning("guard CA not published", webhook=webhook, error=str(exc))
    try:
        if await publish_ca(kube, webhook, ca_pem, api.MUTATING_WEBHOOKS):
            log.info("guard CA published", webhook=webhook, kind=api.MUTATING_WEBHOOKS.kind)
    except NotFound:
        log.debug("no mutating webhook configuration of enrolment; none kept", webhook=webhook)
    except DispatchError as exc:
        log.warning("guard CA not published", webhook=webhook, kind=api.MUTATING_WEBHOOKS.kind, error=str(exc))
    return trusted


@dataclass
class Running:
    """A started guard: its server, the port it listens on, and the background job keeping its
    certificate fresh and its CA published."""

    guard: Guard
    server: asyncio.Server
    port: int
    certs: Certs
    publisher: asyncio.Task[None] | None
    context: tls.Reloading | None = None
    webhook: str = ""
    hosts: tuple[str, ...] = ()
    kube: k.Kube | None = None
    reloads: int = 0
    loaded: tuple[tuple[int, int], ...] = ()
    """The files' signature when last loaded (a change means someone replaced them)."""
    trusted: bool = False
    """Whether the API server can trust our certificate: the CA we keep is in the webhook's bundle (set by
    the first upkeep round), or another party (cert-manager) keeps the bundle."""

    def ready(self) -> tuple[bool, str]:
        """Whether this replica can answer the API server now, for ``/readyz``: a replica whose CA is not yet
        trusted would fail every review (failurePolicy Fail), so it must not receive them."""
        if not self.loaded:
            return False, "guard certificate not loaded"
        if self.webhook and not self.trusted:
            return False, f"guard CA not yet in the caBundle of {self.webhook}"
        return True, "guard serving"

    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.publisher
        self.server.close()
        await self.server.wait_closed()

    async def refresh(self, *, switch_delay: float = SWITCH_DELAY) -> None:
        """One round of upkeep: renew a certificate of our own that is due (publishing its CA before
        serving it), reload files that someone else replaced, and re-publish our CA."""
        directory = self.certs.cert.parent
        if self.context is None:
            return
        # Only a certificate whose CA this replica publishes is its own to renew: nobody would trust
        # another one.
        if self.webhook and renewal_due(self.certs.cert) and renewable(directory):
            fresh = generate_certs(directory, self.hosts)
            if self.kube is not None and fresh.ca_pem is not None:
                self.trusted = await _publish(self.kube, self.webhook, fresh.ca_pem)
                await asyncio.sleep(switch_delay)
            self.certs = fresh
            if self._load():
                log.info("guard certificate renewed", cert=str(fresh.cert))
        elif tls.signature(self.certs.cert, self.certs.key) != self.loaded and self._load():
            log.info("guard certificate reloaded", cert=str(self.certs.cert))
        if self.webhook and self.kube is not None and self.certs.ca_pem is not None:
            self.trusted = await _publish(self.kube, self.webhook, self.certs.ca_pem) or self.trusted

    def _load(self) -> bool:
        """Serve the current files; False (the old pair still served, a warning logged) when they do not
        load, as a half-written rotation does: the next round tries again."""
        assert self.context is not None
        if not self.context.reload(self.certs.cert, self.certs.key):
            return False
        ca = self.certs.cert.parent / "ca.crt"
        if self.certs.ca_pem is not None and ca.is_file():
            self.certs = Certs(self.certs.cert, self.certs.key, ca.read_bytes())
        self.loaded = self.context.loaded
        self.reloads += 1
        return True


async def _upkeep(running: Running, every: float) -> None:
    while True:
        try:
            await running.refresh()
        except Exception as exc:   # upkeep must never stop: the next round tries again
            log.warning("guard certificate upkeep failed", error=str(exc))
        await asyncio.sleep(every)


async def start(kube: k.Kube, *, host: str, port: int, cert_dir: str, hosts: Sequence[str],
                webhook: str, registry: CollectorRegistry | None = None,
                every: float = REPUBLISH_SECONDS, worker: bool = False) -> Running:
    """Serve the guard on ``host:port`` (0: any free port), keep its certificate fresh and, when
    ``webhook`` names the configuration, keep this replica's CA in its caBundle. ``worker``: this cluster is a
    MultiKueue worker (``Guard.worker``)."""
    certs = load_or_generate(Path(cert_dir) if cert_dir else None, hosts, renew=bool(webhook))
    if renewal_due(certs.cert, before=dt.timedelta(0)):
        log.warning("guard certificate has expired: the API server will refuse to call the guard",
                    cert=str(certs.cert))
    guard = Guard(kube, registry, worker=worker)
    context = tls_context(certs)
    server = await serve(guard, host, port, certs, context)
    sock = server.sockets[0] if server.sockets else None
    bound = int(sock.getsockname()[1]) if sock is not None else port
    running = Running(guard, server, bound, certs, None, context=context,
                      webhook=webhook if certs.ca_pem is not None else "", hosts=tuple(hosts), kube=kube)
    running.loaded = context.loaded
    running.publisher = asyncio.create_task(_upkeep(running, every))
    log.info("guard serving", port=bound, path=PATH, pod_path=POD_PATH, mutate_path=MUTATE_PATH,
             webhook=webhook or None, cert=str(certs.cert))
    return running
