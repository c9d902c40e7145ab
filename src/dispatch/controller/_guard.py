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
* **TLS** and **never expired**: the certificate's lifecycle (cert-manager's mounted, or the controller's
  own: made, its CA published in the webhook configurations' caBundle, renewed before it ends, files
  replaced by someone else reloaded) is ``_tls.Upkeep``; this file serves with it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from .. import _api as api
from .. import _decision as d
from .. import _enrol as e
from .. import _kube as k
from .._api import Obj
from .._read import Readers, WorkloadRead, by_identity
from .._trainer import TrainJobView
from .._views import PodView
from ..errors import DispatchError
from . import _http as http
from . import _tls as tls
from ._metrics import WebhookMetrics
from ._tls import Certs

T = TypeVar("T")

log = structlog.get_logger("dispatch.guard")


PATH = "/validate-trainjob"
POD_PATH = "/validate-pod"
"""Pod creates of dispatch objects: the one point where a process starts, whoever creates the pod."""
MUTATE_PATH = "/mutate-trainjob"
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
        self._read = Readers(kube)
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
        """The denial for one AdmissionRequest, or None.

        Only an update that would start an execution is judged over a read. Its denial names what the read
        found (pods, Nodes, the identity record) only when the review's old object is the TrainJob stored
        under that name (its uid): the API server sends exactly that, and anyone else who can name the uid
        could read the object anyway. A review made up by another caller (any namespace, any identity) gets
        the denial without them (``_unstored``)."""
        operation = str(request.get("operation") or "")
        new = _view(request.get("object"))
        old = _view(request.get("oldObject"))
        if new is None:
            return None  # a DELETE (or a connect): nothing starts
        if not (new.labelled or (old is not None and old.labelled)):
            return None
        if not d.starts_execution(operation, old, new) or not new.labelled or operation != "UPDATE" or old is None:
            # judged on the write alone; a create that would start is refused whatever its pods, unread
            return d.guard(operation, old, new, None, None, worker=self.worker)
        namespace = str(request.get("namespace") or new.ref.namespace)
        reader = self._read(namespace)
        workload: WorkloadRead = "copy" if d.multikueue_copy(new, worker=self.worker) else "own"
        got = (await reader.inputs([new], workload=workload, runtime=True))[new.name]
        # a NonIndexed Job's pods could not be told apart from replacements (issue 35 item 6): said first
        jobs = d.jobs_nonindexed(got.snapshot.jobs, new.name)
        denial = d.nonindexed_text(f"trainjob {new.name} cannot start", jobs) \
            or d.guard(operation, old, new, got.verdict(), got.record, got.workload, got.runtime_jobs,
                       worker=self.worker)
        if denial is None:
            return None
        live = await reader.trainjob_or_none(new.name)
        if live is not None and old.ref.uid and live.ref.uid == old.ref.uid:
            return denial
        return _unstored(f"trainjob {new.name} cannot start",
                         f"namespace {namespace} holds no TrainJob {new.name} of uid {old.ref.uid or '(none)'}")

    async def decide_pod(self, request: Obj) -> str | None:
        """The denial for one pod create, or None (``_decision.pod_start_problem`` over a fresh read).

        A denial names the submission's pods and their Nodes only when the pod's controller is a Job of the
        same submission stored in the namespace (its ownerReference's uid): the Job controller's creates, which
        the API server sends, always are; a review made up by another caller gets the denial without them."""
        obj = request.get("object")
        if str(request.get("operation") or "") != "CREATE" or not isinstance(obj, dict):
            return None  # the configuration sends creates only
        new = PodView.from_obj(obj)
        problem = d.pod_create_problem(new)  # judged on the pod alone, before any read
        if problem is not None or new.mirror or not new.job_id or not new.submission:
            return problem  # a static pod's mirror runs nothing: its kubelet runs the static pod regardless
        namespace = str(request.get("namespace") or new.namespace)
        reader = self._read(namespace)
        pods, nodes = await reader.submission_pods(new.job_id, new.submission)
        denial = d.pod_start_problem(new, pods, nodes)
        if denial is None:
            return None
        owner = _controller_job_uid(obj)
        if owner:
            listed = await reader.kube.list(api.JOBS, labels=by_identity([(new.job_id, new.submission)]))
            if any((j.get("metadata") or {}).get("uid") == owner for j in listed.items):
                return denial
        who = f"pod {new.name or 'of ' + new.job_id + '/' + new.submission}"
        return _unstored(f"{who} cannot start while a pod of submission {new.job_id}/{new.submission} may still run",
                         f"namespace {namespace} holds no Job of that submission of uid {owner or '(none)'} "
                         "controlling it")

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

    async def review(self, body: Obj, timeout: float, *, pod: bool = False, caller: str | None = None) -> Obj:
        """Answer one AdmissionReview of a TrainJob write (``pod``: of a pod create). ``caller``: the name in
        the client certificate the connection was verified with (``ClientAuth``), None when unauthenticated."""
        request, uid = _request_of(body)
        work = self.decide_pod(request) if pod else self.decide(request)
        decided, failure = await self._within(work, timeout, "the submission's pods" if pod else "the object's pods")
        denial = failure if failure is not None else decided
        self._answers.labels("error" if failure is not None else "allowed" if denial is None else "denied").inc()
        if denial is not None:
            self.denials += 1
            log.info("guard denied", kind="Pod" if pod else "TrainJob", **_said(request, caller),
                     denial=_bounded(denial, d.MESSAGE_LIMIT))
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
            namespace = str(request.get("namespace") or (obj.get("metadata") or {}).get("namespace") or "")
            runtime = await self._read(namespace).runtime_or_none(kind, name)
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
        reader = self._read(namespace)
        record, listed = await asyncio.gather(reader.record(job_id, submission),
                                              reader.trainjobs(by_identity([(job_id, submission)])))
        live = [v.name for v in listed if not v.deleting]
        return e.collision(name, job_id, submission, record.trainjob if record is not None else "", live)

    async def mutate(self, body: Obj, timeout: float, *, caller: str | None = None) -> Obj:
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
        if got.denial is not None:
            self.denials += 1
            log.info("enrolment denied", **_said(request, caller), denial=_bounded(got.denial, d.MESSAGE_LIMIT))
        elif got.patch:
            said = _said(request, caller)
            log.info("trainjob enrolled", namespace=said["namespace"], name=said["name"],
                     job_id=_bounded(got.job_id), submission=_bounded(got.submission))
        return response(uid, got.denial, got.patch, got.warnings)


CLAIM_LIMIT = 256
"""Characters of one field of a review the guard logs (a Kubernetes name has at most 253)."""


def _bounded(value: object, limit: int = CLAIM_LIMIT) -> str:
    """``value`` as text for a log line: control characters escaped (a forged name cannot start a line of
    its own in a log read as text), at most ``limit`` characters."""
    text = value if isinstance(value, str) else "" if value is None else json.dumps(value, default=str)
    if len(text) > limit:
        text = f"{text[:limit]}...({len(text) - limit} more)"
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _said(request: Obj, caller: str | None) -> dict[str, str]:
    """What a review says of its write, for a log line, bounded: who wrote is what the review *claims*
    (``claimed_user``) unless the connection was verified as the API server's (``caller``, the name in its
    client certificate), when ``userInfo`` is the API server's word (``user``). Anyone who reaches the port
    can send a review naming any user, namespace and object."""
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = request.get("name") or (meta.get("name") if isinstance(meta, dict) else None)
    info = request.get("userInfo")
    user = info.get("username") if isinstance(info, dict) else None
    out = {"operation": _bounded(request.get("operation")), "namespace": _bounded(request.get("namespace")),
           "name": _bounded(name)}
    if caller is None:
        out["claimed_user"] = _bounded(user)
    else:
        out["user"] = _bounded(user)
        out["caller"] = _bounded(caller)
    return out


def _unstored(refusal: str, why: str) -> str:
    """A denial of a review that is not of a stored object's write, so that it tells its sender nothing the
    guard read: the API server sends a review of the object being written, so this sender is someone else
    (or the object changed meanwhile, and the API server's write fails anyway)."""
    return (f"{refusal}; the guard names what stands in the way only in a review of a stored object's write "
            f"({why}); `dispatch status` shows it to whoever may read the namespace")


def _controller_job_uid(obj: Obj) -> str:
    """The uid of the Job that controls this pod (its ownerReference with ``controller: true``), or ""."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs if isinstance(refs, list) else []:
        if (isinstance(ref, dict) and ref.get("controller") is True and ref.get("kind") == "Job"
                and str(ref.get("apiVersion") or "").startswith("batch/")):
            return str(ref.get("uid") or "")
    return ""


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


@dataclass(frozen=True)
class ClientAuth:
    """Which callers the guard answers (``--guard-client-ca``, ``--guard-client-names``): the API server
    presents a client certificate to a webhook only when its admission configuration's ``kubeConfigFile``
    gives it one, so this is an opt-in. A caller without a certificate signed by a CA in ``ca_pem`` is
    refused during the TLS handshake (no system CA counts); with ``names``, a certificate whose subject
    common name and DNS names are none of them is answered 403 before its review is read. Without names,
    every certificate the CA signed passes: use a CA that signs nothing else (not the cluster's client CA,
    which signs every kubelet's and user's certificate), or name the API server's."""

    ca_pem: bytes
    names: frozenset[str] = frozenset()

    @staticmethod
    def load(ca_file: str, names: str = "") -> ClientAuth:
        """From a PEM file of one or more CA certificates and a comma-separated list of names; a clear
        ValueError naming what is wrong (no such file, no certificate in it)."""
        pem = tls.read_ca_file(ca_file, option="--guard-client-ca")
        return ClientAuth(pem, frozenset(n.strip() for n in names.split(",") if n.strip()))

    def context(self, base: ssl.SSLContext) -> ssl.SSLContext:
        """``base`` made to require a client certificate signed by our CA, and only ours."""
        base.verify_mode = ssl.CERT_REQUIRED
        base.load_verify_locations(cadata=self.ca_pem.decode("ascii", "replace"))
        return base

    @staticmethod
    def names_of(peer: Mapping[str, Any] | None) -> list[str]:
        """The subject common names and DNS names of a verified certificate (``getpeercert()``'s form)."""
        if not peer:
            return []
        out = [str(value) for rdn in peer.get("subject") or () for key, value in rdn if key == "commonName"]
        out += [str(value) for kind, value in peer.get("subjectAltName") or () if kind == "DNS"]
        return out

    def caller(self, peer: Mapping[str, Any] | None) -> str | None:
        """The name this caller is let through as, or None when its certificate names none of ``names``."""
        names = self.names_of(peer)
        if peer is None:
            return None
        if not self.names:
            return names[0] if names else "(a certificate without a name)"
        return next((n for n in names if n in self.names), None)


def _context(clients: ClientAuth | None = None) -> ssl.SSLContext:
    if clients is not None:
        # a bare server context, our CA its only one: the system's trust store (load_default_certs) would let
        # through a client certificate any public or corporate CA signed
        return clients.context(_alpn(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)))
    return tls.server_context()


def _alpn(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


def tls_context(certs: Certs, clients: ClientAuth | None = None) -> tls.Reloading:
    """The server's TLS context, which :meth:`~._tls.Reloading.reload` switches to new files for new
    connections (each with the same client verification)."""
    return tls.Reloading(lambda: _context(clients), certs.cert, certs.key, what="guard")


CALLER_REFUSED: http.Answer = (403, JSON, b'{"error":"this client certificate names none of the callers the guard '
                               b'answers (--guard-client-names)"}', "")


async def serve(guard: Guard, host: str, port: int, certs: Certs,
                context: tls.Reloading | None = None, *, clients: ClientAuth | None = None) -> asyncio.Server:
    """Serve AdmissionReviews on ``PATH`` over TLS, keeping connections alive; the caller closes it.
    ``clients``: answer only callers with a client certificate it accepts (pass the same to
    :func:`tls_context` when giving ``context``)."""
    served = context or tls_context(certs, clients)

    async def route(request: http.Request) -> http.Answer:
        m = guard.webhook_metrics
        m.in_flight.labels(request.path).inc()
        started = time.monotonic()
        code = 500
        try:
            caller = clients.caller(request.peer) if clients is not None else None
            if clients is not None and caller is None:
                code = 403
                return CALLER_REFUSED
            review = _parse_review(request.body)
            timeout = _timeout_of(request.target)
            answer = await (guard.mutate(review, timeout, caller=caller) if request.path == MUTATE_PATH
                            else guard.review(review, timeout, pod=request.path == POD_PATH, caller=caller))
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


@dataclass
class Running:
    """A started guard: its server, the port it listens on, and the upkeep of its certificate (``_tls``)."""

    guard: Guard
    server: asyncio.Server
    port: int
    upkeep: tls.Upkeep
    publisher: asyncio.Task[None] | None = None

    @property
    def certs(self) -> Certs:
        return self.upkeep.certs

    @property
    def reloads(self) -> int:
        return self.upkeep.reloads

    def ready(self) -> tuple[bool, str]:
        """Whether this replica can answer the API server now (``_tls.Upkeep.ready``), for ``/readyz``."""
        return self.upkeep.ready()

    async def refresh(self, *, switch_delay: float = tls.SWITCH_DELAY) -> None:
        """One round of the certificate's upkeep (``_tls.Upkeep.refresh``)."""
        await self.upkeep.refresh(switch_delay=switch_delay)

    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.publisher
        self.server.close()
        await self.server.wait_closed()


async def start(kube: k.Kube, *, host: str, port: int, cert_dir: str, hosts: Sequence[str],
                webhook: str, registry: CollectorRegistry | None = None,
                every: float = REPUBLISH_SECONDS, worker: bool = False, clients: ClientAuth | None = None) -> Running:
    """Serve the guard on ``host:port`` (0: any free port), keep its certificate fresh and, when
    ``webhook`` names the configuration, keep this replica's CA in its caBundle. ``worker``: this cluster is a
    MultiKueue worker (``Guard.worker``). ``clients``: answer only callers whose client certificate it accepts."""
    upkeep = tls.Upkeep.start(cert_dir, hosts, webhook, kube, make=lambda: _context(clients))
    guard = Guard(kube, registry, worker=worker)
    server = await serve(guard, host, port, upkeep.certs, upkeep.context, clients=clients)
    sock = server.sockets[0] if server.sockets else None
    bound = int(sock.getsockname()[1]) if sock is not None else port
    running = Running(guard, server, bound, upkeep)
    running.publisher = asyncio.create_task(upkeep.run(every))
    log.info("guard serving", port=bound, path=PATH, pod_path=POD_PATH, mutate_path=MUTATE_PATH,
             webhook=webhook or None, cert=str(upkeep.certs.cert),
             client_certificates=("required" + (f" naming {', '.join(sorted(clients.names))}" if clients.names
                                                else "") if clients is not None else "not asked for"))
    return running
