"""One Workload, one decision: the seed's rule applied through a Kueue admission check.

Each reconcile starts from fresh reads (the Workload, then its TrainJob, then one consistent snapshot of
the object's pods), never from the watch cache, and every write it makes is conditioned on a
resourceVersion it read, so a decision that went stale turns into a 409 and a retry, never into a second
execution:

* pods (or a JobSet/Job that has not yet confirmed its suspension) remain → the check stays ``Pending``
  with ``waiting for pods of the previous execution to go: <pod> on <node>, ...``, written only when that
  message changes; the Workload keeps its reserved quota;
* nothing remains → A is raised on the TrainJob (SSA conditioned on its resourceVersion), then our
  ``admissionChecks`` entry alone is set ``Ready`` by server-side apply with our field manager, ``force``
  and the Workload's resourceVersion, with ``podSetUpdates`` labels carrying (job-id, submission, A).

A crash between the two writes leaves the check Pending and A raised on a still-suspended TrainJob; the
next reconcile raises A again, so a number is skipped, never reused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import structlog

from .. import _decision as d
from .. import _kube as k
from .. import _names as n
from .._adapter import AsyncAdapter, Snapshot
from ..errors import DispatchError, Refused, Unreachable
from ._events import EventRecorder
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

Obj = dict[str, Any]
ForeignPolicy = Literal["ready", "ignore"]

WAITING_PREFIX = "waiting for "
"""Every message dispatch writes while it holds a check Pending starts so (restart-safe episode marker)."""
MESSAGE_LIMIT = 8000
"""Kueue allows 32768 characters; a few thousand name the pods and keep Workloads small."""
READY_RETRIES = 3
LIST_FACTOR = 3
"""A batch lists the namespace's JobSets when it is at least a third of its Workloads, else gets each.
Measured on the testbed: a JobSet is ~3.7 KB and decoding it costs about as much as a third of a small
request's overhead, so listing 1,000 JobSets for 64 of them cost more than 64 gets."""

T = TypeVar("T")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Entry:
    """Our entry of ``status.admissionChecks``."""

    name: str
    state: str
    message: str
    last_transition: str

    @property
    def waiting(self) -> bool:
        """Whether dispatch itself wrote the current Pending message (a waiting episode is under way)."""
        return self.state == "Pending" and self.message.startswith(WAITING_PREFIX)


@dataclass(frozen=True)
class Owner:
    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def is_trainjob(self) -> bool:
        return self.kind == "TrainJob" and self.api_version.split("/")[0] == n.TRAINER_GROUP


@dataclass(frozen=True)
class Raised:
    """A TrainJob after the first admitting write, and the A it now carries."""

    trainjob: Obj
    admission: int
    dispatch_object: bool


@dataclass(frozen=True)
class Outcome:
    """What a reconcile did, for metrics, logs and the controller's event indexes."""

    outcome: str
    retry: bool = False
    """Requeue with the key's backoff (a conflict or a refusal), rather than wait for an event."""
    waiting_nodes: frozenset[str] = field(default_factory=frozenset)
    waiting: bool = False
    error: str = ""


def our_entry(workload: Mapping[str, Any], names: Collection[str]) -> Entry | None:
    """Our entry: the one named after an AdmissionCheck whose controllerName is dispatch's."""
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        if isinstance(check, Mapping) and str(check.get("name", "")) in names:
            return Entry(
                str(check.get("name", "")), str(check.get("state", "")), str(check.get("message", "")),
                str(check.get("lastTransitionTime", "")),
            )
    return None


def controller_owner(obj: Mapping[str, Any]) -> Owner | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(str(ref.get("apiVersion", "")), str(ref.get("kind", "")), str(ref.get("name", "")),
                         str(ref.get("uid", "")))
    return None


def pending_ours(workload: Mapping[str, Any], names: Collection[str]) -> bool:
    entry = our_entry(workload, names)
    return entry is not None and entry.state == "Pending"


def pod_set_names(workload: Mapping[str, Any]) -> list[str]:
    return [str(ps.get("name")) for ps in (workload.get("spec") or {}).get("podSets") or []
            if isinstance(ps, Mapping) and ps.get("name")]


def _truncate(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 20].rsplit(", ", 1)[0] + ", ... (truncated)"


def waiting_text(verdict: d.Verdict) -> str:
    """The Pending message: the seed's exact form for pods, then any JobSet/Job not yet suspended."""
    if verdict.remaining:
        return _truncate(d.waiting_message(verdict.remaining, verdict.blockers))
    return _truncate("waiting for the previous execution to stop: " + "; ".join(verdict.blockers))


async def snapshot(adapter: AsyncAdapter, name: str, job_id: str, submission: str) -> Snapshot:
    """The library's consistent read of an object's JobSet, Jobs, pods (both selections) and Nodes."""
    return await adapter._snapshot(name, job_id, submission)


class Reconciler:
    """Decides and writes for one Workload at a time; safe to run in several workers and replicas."""

    def __init__(
        self,
        kube: k.Kube,
        *,
        check_names: Callable[[], Collection[str]],
        events: EventRecorder,
        metrics: Metrics,
        foreign: ForeignPolicy = "ready",
        field_manager: str = n.FIELD_MANAGER,
        last_gone: Callable[[str, str], float | None] = lambda _ns, _name: None,
    ) -> None:
        self._kube = kube
        self._check_names = check_names
        self._events = events
        self._metrics = metrics
        self.foreign = foreign
        self.field_manager = field_manager
        self._last_gone = last_gone
        self._adapters: dict[str, AsyncAdapter] = {}
        self.on_written: Callable[[str], None] = lambda _key: None
        self.written: dict[str, tuple[str, str]] = {}
        """Per Workload key, the (state, message) of our entry as last written: its echo needs no reconcile."""
        self.before_ready: Callable[[], Any] | None = None
        """Test hook: runs between raising A and setting Ready (a crash point)."""

    def adapter(self, namespace: str) -> AsyncAdapter:
        found = self._adapters.get(namespace)
        if found is None:
            found = self._adapters[namespace] = AsyncAdapter(self._kube.in_namespace(namespace))
        return found

    # ------------------------------------------------------------------ writes

    async def _write_check(self, workload: Obj, entry: Obj) -> Obj:
        """SSA our one entry of status.admissionChecks, conditioned on the Workload's resourceVersion.

        Only our entry is in the body, so Kueue's and other controllers' entries (same list-map, other
        keys) are merged, not replaced, which a merge patch could not do.
        """
        meta = workload.get("metadata") or {}
        body = {
            "apiVersion": k.WORKLOADS.api_version,
            "kind": "Workload",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "status": {"admissionChecks": [entry]},
        }
        result = await self._kube.apply(
            k.WORKLOADS, str(meta.get("name")), body, str(meta.get("namespace")), sub="status",
            field_manager=self.field_manager, force=True,
        )
        self._metrics.writes.labels("workload").inc()
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self.written[key] = (str(entry["state"]), str(entry["message"]))
        self.on_written(key)
        return result

    async def _pending(self, workload: Obj, entry: Entry, message: str) -> None:
        await self._write_check(workload, {
            "name": entry.name, "state": "Pending", "message": message,
            "lastTransitionTime": entry.last_transition or now_text(),
        })

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        started = time.perf_counter()
        try:
            return await self._reconcile(namespace, name)
        finally:
            self._metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        names = self._check_names()
        workload = await self._kube.get_or_none(k.WORKLOADS, name, namespace)
        screened = self._screen(workload, names)
        if isinstance(screened, Outcome):
            return screened
        assert workload is not None
        entry, owner = screened
        if owner is None:
            return await self._foreign(workload, entry, controller_owner(workload))
        trainjob = await self._kube.get_or_none(k.TRAINJOBS, owner.name, namespace)
        refused = self._screen_owner(workload, owner, trainjob)
        if refused is not None:
            return refused
        assert trainjob is not None
        ident = d.identity_of(trainjob)
        snap = await snapshot(self.adapter(namespace), owner.name, ident.job_id, ident.submission)
        verdict = self._decide(owner, trainjob, snap)
        if not verdict.admissible:
            return await self._wait(workload, entry, trainjob, verdict)
        return await self._admit(workload, entry, trainjob, snap)

    def _screen(self, workload: Obj | None, names: Collection[str]) -> Outcome | tuple[Entry, Owner | None]:
        """Whether a Workload is ours to decide now; its owner when that is a TrainJob (None: foreign)."""
        if workload is None:
            return Outcome("gone")
        entry = our_entry(workload, names)
        if entry is None:
            return Outcome("not-ours")
        if entry.state != "Pending":
            return Outcome("not-pending")
        skip = self._not_now(workload)
        if skip:
            return Outcome(skip)
        owner = controller_owner(workload)
        if owner is None or not owner.is_trainjob:
            if self.foreign == "ignore":
                return Outcome("foreign-ignored")
            return entry, None
        return entry, owner

    @staticmethod
    def _screen_owner(workload: Obj, owner: Owner, trainjob: Obj | None) -> Outcome | None:
        if trainjob is None or (owner.uid and (trainjob.get("metadata") or {}).get("uid") != owner.uid):
            return Outcome("owner-missing")
        if d.is_deleting(trainjob):
            return Outcome("owner-deleting")
        if not d.is_suspended(trainjob):
            meta = workload.get("metadata") or {}
            log.warning("check pending but trainjob not suspended; not admitting",
                        workload=f"{meta.get('namespace')}/{meta.get('name')}", trainjob=owner.name)
            return Outcome("owner-running")
        return None

    @staticmethod
    def _decide(owner: Owner, trainjob: Obj, snap: Snapshot) -> d.Verdict:
        ident = d.identity_of(trainjob)
        return d.decide(
            name=owner.name, job_id=ident.job_id, submission=ident.submission, pods=snap.pods,
            nodes=snap.nodes, jobset=snap.jobset, jobs=snap.jobs,
        )

    # ------------------------------------------------------------------ many at once

    async def reconcile_many(
        self, namespace: str, names: Sequence[str], *, known: int = 0, hints: Mapping[str, Obj] | None = None,
    ) -> dict[str, Outcome | Exception]:
        """Decide several Workloads of one namespace from one shared read.

        A queue that holds many Workloads at once (a controller start, a node coming back, a burst of
        preemptions) would otherwise pay the whole read per Workload. Here the Workloads, their
        TrainJobs and the lower layers are read fresh once for the batch, with the same reads in the
        same order as a single reconcile; each Workload is decided by the same pure rule on its own part
        of that read, and every write is still per Workload and conditioned on its own resourceVersion.

        ``hints`` (the caller's cached Workloads, by name) only narrow the reads: Workloads are listed by
        their owners' uids and TrainJobs by the identity labels Kueue copied into the pod sets, so a
        batch reads about its own objects, not the namespace; whatever a hint misses is read by a get.
        ``known`` is how many Workloads the caller knows in the namespace: the JobSets (which carry no
        label to select them by) are listed only when the batch is a large part of it, else got one by
        one (a cost choice, never a correctness one). Errors are per Workload: the value is the
        exception its reconcile would have raised.
        """
        unique = list(dict.fromkeys(names))
        if len(unique) == 1:
            try:
                return {unique[0]: await self.reconcile(namespace, unique[0])}
            except Exception as exc:
                return {unique[0]: exc}
        started = time.perf_counter()
        out: dict[str, Outcome | Exception] = {}
        try:
            await self._reconcile_many(namespace, unique, known, hints or {}, out)
        except Exception as exc:  # the shared read failed: every Workload not yet decided shares the error
            for name in unique:
                out.setdefault(name, exc)
        finally:
            share = (time.perf_counter() - started) / len(unique)
            for _ in unique:
                self._metrics.reconcile_seconds.observe(share)
        return out

    async def _reconcile_many(self, ns: str, names: list[str], known: int, hints: Mapping[str, Obj],
                              out: dict[str, Outcome | Exception]) -> None:
        checks = self._check_names()
        uids = sorted({o.uid for o in (controller_owner(hints[name]) for name in names if name in hints)
                       if o is not None and o.uid and n.label_value_problem(o.uid) is None})
        workloads: dict[str, Obj | None] = {}
        if uids:
            for w in (await self._kube.list(k.WORKLOADS, ns, labels=f"{n.KUEUE_JOB_UID_LABEL} in ({','.join(uids)})")
                      ).items:
                if d.name_of(w) in names:
                    workloads[d.name_of(w)] = w
        missing = [name for name in names if name not in workloads]
        for name, got in zip(missing, await asyncio.gather(
                *(self._kube.get_or_none(k.WORKLOADS, name, ns) for name in missing)), strict=True):
            workloads[name] = got
        jobs: list[tuple[str, Coroutine[Any, Any, Outcome]]] = []
        owned: list[tuple[str, Obj, Entry, Owner]] = []
        for name in names:
            workload = workloads[name]
            screened = self._screen(workload, checks)
            if isinstance(screened, Outcome):
                out[name] = screened
                continue
            assert workload is not None
            entry, owner = screened
            if owner is None:
                jobs.append((name, self._foreign(workload, entry, controller_owner(workload))))
            else:
                owned.append((name, workload, entry, owner))
        trainjobs: dict[str, Obj | None] = {}
        idents = {i for i in (pod_set_identity(w) for _, w, _, _ in owned) if i is not None}
        if idents:
            selector = (f"{n.LABEL_JOB_ID} in ({','.join(sorted({i for i, _ in idents}))}),"
                        f"{n.LABEL_SUBMISSION} in ({','.join(sorted({s for _, s in idents}))})")
            wanted = {owner.name for _, _, _, owner in owned}
            for t in (await self._kube.list(k.TRAINJOBS, ns, labels=selector)).items:
                if d.name_of(t) in wanted:
                    trainjobs[d.name_of(t)] = t
        unhinted = sorted({owner.name for _, _, _, owner in owned} - set(trainjobs))  # no hint, or it missed
        for name, got in zip(unhinted, await asyncio.gather(
                *(self._kube.get_or_none(k.TRAINJOBS, name, ns) for name in unhinted)), strict=True):
            trainjobs[name] = got
        deciding: list[tuple[str, Obj, Entry, Owner, Obj]] = []
        for name, workload, entry, owner in owned:
            trainjob = trainjobs.get(owner.name)
            refused = self._screen_owner(workload, owner, trainjob)
            if refused is not None:
                out[name] = refused
            else:
                assert trainjob is not None
                deciding.append((name, workload, entry, owner, trainjob))
        snaps = await self.adapter(ns)._snapshots(
            [(owner.name, *_ident(tj)) for _, _, _, owner, tj in deciding],
            list_jobsets=len(names) * LIST_FACTOR >= known)
        admits: list[tuple[str, Obj, Entry, Obj, Snapshot]] = []
        for name, workload, entry, owner, trainjob in deciding:
            snap = snaps[owner.name]
            verdict = self._decide(owner, trainjob, snap)
            if verdict.admissible:
                admits.append((name, workload, entry, trainjob, snap))
            else:
                jobs.append((name, self._wait(workload, entry, trainjob, verdict)))
        await _settle(jobs, out)
        if not admits:
            return
        floors = await self.adapter(ns).ledger_floors()
        raising = [(name, self._raise(wl, entry, tj, snap, floors=floors)) for name, wl, entry, tj, snap in admits]
        raised: dict[str, Raised | Outcome | Exception] = {}
        await _settle(raising, raised)
        record = {n.ledger_key(*_ident(r.trainjob)): r.admission for r in raised.values()
                  if isinstance(r, Raised) and r.dispatch_object}
        if record:
            await self.adapter(ns).record_admissions(record)  # before any of them can start
        readying: list[tuple[str, Coroutine[Any, Any, Outcome]]] = []
        for name, workload, entry, _, _ in admits:
            r = raised[name]
            if isinstance(r, Raised):
                readying.append((name, self._ready(workload, entry, r)))
            else:
                out[name] = r
        await _settle(readying, out)

    @staticmethod
    def _not_now(workload: Obj) -> str:
        """Why a Pending check is not ours to decide yet: Kueue decides checks only on reserved quota."""
        if d.is_deleting(workload):
            return "workload-deleting"
        if (workload.get("spec") or {}).get("active") is False:
            return "inactive"
        if d.condition_true(workload, "Finished"):
            return "finished"
        if not d.condition_true(workload, "QuotaReserved"):
            return "no-quota"
        if d.condition_true(workload, "Evicted"):
            return "evicting"
        return ""

    async def _wait(self, workload: Obj, entry: Entry, trainjob: Obj, verdict: d.Verdict) -> Outcome:
        message = waiting_text(verdict)
        nodes = frozenset(p.node for p in verdict.remaining if p.node)
        if message != entry.message:
            await self._pending(workload, entry, message)
            meta = workload.get("metadata") or {}
            log.info("admission waits", workload=f"{meta.get('namespace')}/{meta.get('name')}",
                     trainjob=d.name_of(trainjob), message=message)
            if not entry.waiting:
                await self._events.emit(
                    trainjob, "AdmissionDelayed",
                    f"admission check {entry.name} stays Pending: {message}",
                )
        return Outcome("waiting", waiting_nodes=nodes, waiting=True)

    async def _admit(self, workload: Obj, entry: Entry, trainjob: Obj, snap: Snapshot) -> Outcome:
        raised = await self._raise(workload, entry, trainjob, snap)
        if isinstance(raised, Outcome):
            return raised
        return await self._ready(workload, entry, raised)

    async def _raise(self, workload: Obj, entry: Entry, trainjob: Obj, snap: Snapshot, *,
                     floors: Mapping[str, int] | None = None) -> Raised | Outcome:
        """The first admitting write: A raised on the TrainJob (nothing to raise for a foreign object).

        With ``floors`` (the ledger read once for a batch) the ledger is not written here: the batch
        records every raised A in one write before any check turns Ready.
        """
        ns = str((workload.get("metadata") or {}).get("namespace"))
        tj_name = d.name_of(trainjob)
        ident = d.identity_of(trainjob)
        dispatch_object = bool(ident.job_id and ident.submission and d.patched_replicated_jobs(trainjob))
        if not dispatch_object:
            return Raised(trainjob, 0, False)
        admission = d.next_admission(trainjob, snap.pods)
        try:
            if floors is None:
                raised = await self.adapter(ns).raise_admission(trainjob, admission)
            else:
                raised = await self.adapter(ns).raise_admission(
                    trainjob, admission, floor=floors.get(n.ledger_key(ident.job_id, ident.submission), 0),
                    record=False)
        except Unreachable as exc:
            if exc.code == 409:
                return Outcome("conflict", retry=True, error="TrainJobConflict")
            raise
        except Refused as exc:
            message = _truncate(f"{WAITING_PREFIX}a writable admission number: raising A on trainjob "
                                f"{tj_name} was refused: {exc}")
            if message != entry.message:
                await self._pending(workload, entry, message)
                await self._events.emit(trainjob, "AdmissionRefused", message, warning=True)
            return Outcome("refused", retry=True, error=exc.reason or "Refused")
        self._metrics.writes.labels("trainjob").inc()
        return Raised(raised, d.admission_of(raised), True)  # the ledger may have lifted A

    async def _ready(self, workload: Obj, entry: Entry, r: Raised) -> Outcome:
        """The second write: our check Ready, labels for the new execution's pods, if nothing moved."""
        meta = workload.get("metadata") or {}
        ns, wl_name = str(meta.get("namespace")), str(meta.get("name"))
        raised, admission, dispatch_object = r.trainjob, r.admission, r.dispatch_object
        tj_name = d.name_of(raised)
        ident = d.identity_of(raised)
        updates: list[Obj] | None = None
        if dispatch_object:
            labels = {n.LABEL_JOB_ID: ident.job_id, n.LABEL_SUBMISSION: ident.submission,
                      n.LABEL_ADMISSION: str(admission)}
            updates = [{"name": ps, "labels": dict(labels)} for ps in pod_set_names(workload)]
            message = (f"no pod of the previous execution remains; admitted as "
                       f"{ident.job_id}/{ident.submission}#{admission}")
        else:
            message = ("no pod of a previous execution remains (not a dispatch object, so no admission "
                       "number is raised)")
        if self.before_ready is not None:
            hook = self.before_ready()
            if hasattr(hook, "__await__"):
                await hook
        ready: Obj = {"name": entry.name, "state": "Ready", "message": message, "lastTransitionTime": now_text()}
        if updates:
            ready["podSetUpdates"] = updates
        generation = (raised.get("metadata") or {}).get("generation")
        current = workload
        for _ in range(READY_RETRIES):
            try:
                await self._write_check(current, ready)
                break
            except Unreachable as exc:
                if exc.code != 409:
                    raise
            # The Workload changed since we read it. Kueue touches it often (conditions); what matters is
            # whether the decision still holds: our check still Pending on reserved quota, and the
            # TrainJob still suspended with no spec change since our own write (same generation), so no
            # pod can have started since the consistent read.
            fresh = await self._kube.get_or_none(k.WORKLOADS, wl_name, ns)
            if fresh is None:
                return Outcome("gone")
            fresh_entry = our_entry(fresh, [entry.name])
            if fresh_entry is None or fresh_entry.state != "Pending" or self._not_now(fresh):
                return Outcome("conflict", retry=True, error="WorkloadChanged")
            tj = await self._kube.get_or_none(k.TRAINJOBS, tj_name, ns)
            if (tj is None or not d.is_suspended(tj) or d.is_deleting(tj)
                    or (tj.get("metadata") or {}).get("generation") != generation
                    or (dispatch_object and d.admission_of(tj) != admission)):
                return Outcome("conflict", retry=True, error="TrainJobChanged")
            current = fresh
        else:
            return Outcome("conflict", retry=True, error="WorkloadConflict")
        self._metrics.admissions.inc()
        if entry.waiting:
            since = _parse(entry.last_transition)
            if since is not None:
                self._metrics.wait_seconds.observe(max(0.0, time.time() - since))
            gone = self._last_gone(ns, tj_name)
            if gone is not None:
                self._metrics.pod_gone_to_ready.observe(max(0.0, time.monotonic() - gone))
        log.info("admitted", workload=f"{ns}/{wl_name}", trainjob=tj_name, admission=admission,
                 waited=entry.waiting)
        await self._events.emit(raised, "AdmissionProceeds", f"admission check {entry.name} Ready: {message}")
        return Outcome("admitted")

    async def _foreign(self, workload: Obj, entry: Entry, owner: Owner | None) -> Outcome:
        """A Workload not owned by a TrainJob: dispatch's rule (and A) are defined for TrainJobs only.

        With ``foreign="ready"`` the check passes it at once, so a ClusterQueue shared with other kinds
        is not starved by a check that can never decide for them; with ``"ignore"`` it is left Pending
        untouched (route such kinds to a ClusterQueue without the check).
        """
        what = f"{owner.kind} {owner.name}" if owner else "a Workload without a controller owner"
        message = f"{what} is not a TrainJob: dispatch's rule covers TrainJobs only, so this check passes it"
        try:
            await self._write_check(workload, {"name": entry.name, "state": "Ready", "message": message,
                                               "lastTransitionTime": now_text()})
        except Unreachable as exc:
            if exc.code == 409:
                return Outcome("conflict", retry=True, error="WorkloadConflict")
            raise
        return Outcome("foreign-ready")


def pod_set_identity(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(job-id, submission) as Kueue copied them from dispatch's pod template into the Workload's pod
    sets: a hint to select the TrainJobs of a batch by label, never trusted beyond that."""
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        labels = (((ps or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
        job_id, sub = labels.get(n.LABEL_JOB_ID), labels.get(n.LABEL_SUBMISSION)
        if (isinstance(job_id, str) and isinstance(sub, str) and job_id and sub
                and n.label_value_problem(job_id) is None and n.label_value_problem(sub) is None):
            return job_id, sub
    return None


def _ident(trainjob: Obj) -> tuple[str, str]:
    ident = d.identity_of(trainjob)
    return ident.job_id, ident.submission


async def _settle(jobs: Sequence[tuple[str, Coroutine[Any, Any, T]]], out: dict[str, T | Exception]) -> None:
    """Run per-Workload writes concurrently; each Workload gets its result or its own exception."""
    results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
    for (name, _), result in zip(jobs, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        out[name] = result


def error_reason(exc: DispatchError) -> str:
    if exc.code == 409:
        return "Conflict"
    return exc.reason or type(exc).__name__
