"""The Workload reconciler: the seed's rule applied through a Kueue admission check.

One pipeline decides one Workload or a batch of them (a controller start, a node coming back or a
burst of preemptions queues hundreds at once), always from fresh reads, never from the watch cache:
the Workloads, their TrainJobs, then one consistent read of the objects' lower layers through the
admission core. Each Workload is decided alone by the pure rule on its own part of that read, and every
write is per Workload and conditioned on a resourceVersion it read, so a decision that went stale turns
into a 409 and a retry, never into a second execution:

* pods (or a JobSet/Job that has not yet confirmed its suspension) remain → the check stays ``Pending``
  with ``waiting for pods of the previous execution to go: <pod> on <node>, ...``, written only when that
  message changes; the Workload keeps its reserved quota;
* nothing remains → A is issued in the submission's identity record, raised on the TrainJob, then our
  ``admissionChecks`` entry alone is set ``Ready`` (server-side apply, our field manager, the Workload's
  resourceVersion), with ``podSetUpdates`` labels carrying (job-id, submission, A).

The admission token of a raise is the Workload's uid and the TrainJob generation it was made on: a
second replica, or this one after a crash, deciding before anything else changed the TrainJob finds
that raise and reuses its A, so A rises once per admission and the pods carry the A the TrainJob reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import structlog

from .. import _api as api
from .. import _decision as d
from .. import _kueue as kq
from .. import _names as n
from .. import _trainer as tr
from .._api import Obj
from .._core import Admitted, Cores, Inputs
from .._fleet import Fleet
from .._kube import Kube
from .._read import EarlyRead, Target
from ..errors import Conflict, DispatchError, Refused
from ._events import EventRecorder
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

ForeignPolicy = Literal["ready", "ignore"]

WAITING_PREFIX = d.WAITING_PREFIX
READY_RETRIES = 3
LIST_FACTOR = 3
"""A batch lists the namespace's JobSets when it is at least a third of its Workloads, else gets each that the list
by its submissions' identity labels did not find (``Reader.read``).
Measured on the testbed: a JobSet is ~3.7 KB and decoding it costs about as much as a third of a small
request's overhead, so listing 1,000 JobSets for 64 of them cost more than 64 gets."""

FLEET_RECHECK = 5.0
"""Seconds between two looks at a MultiKueue worker the decision waits on (the manager watches no worker)."""

T = TypeVar("T")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Raised:
    """A TrainJob after the first admitting write, and the A it now carries."""

    trainjob: tr.TrainJobView
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
    recheck: float | None = None
    """Decide again after this many seconds: it waits on a MultiKueue worker, which no watch here follows."""


@dataclass
class _Case:
    """One Workload on its way through the pipeline."""

    name: str
    workload: kq.WorkloadView
    entry: kq.CheckEntry
    owner: kq.Owner
    trainjob: tr.TrainJobView | None = None
    inputs: Inputs | None = None
    marks: dict[str, float] = field(default_factory=dict)
    """When (monotonic) its decision began, its inputs were read and A was raised: the "admitted" log line
    says where an admission's time went."""


@dataclass(frozen=True)
class _Early:
    """An early read in flight (``Reader.early``), with the TrainJob and version it was sent for."""

    task: asyncio.Task[EarlyRead]
    target: Target
    version: str


class Reconciler:
    """Decides and writes for Workloads of one namespace at a time; safe in several workers and replicas."""

    def __init__(
        self,
        kube: Kube,
        *,
        check_names: Callable[[], Collection[str]],
        events: EventRecorder,
        metrics: Metrics,
        foreign: ForeignPolicy = "ready",
        field_manager: str = n.FIELD_MANAGER,
        last_gone: Callable[[str, str], float | None] = lambda _ns, _name: None,
        fleet: Fleet | None = None,
        seen_trainjob: Callable[[str, str], tuple[str, str] | None] = lambda _ns, _name: None,
    ) -> None:
        self._kube = kube
        self._check_names = check_names
        self._events = events
        self._metrics = metrics
        self.foreign = foreign
        self.field_manager = field_manager
        self._last_gone = last_gone
        self._seen_trainjob = seen_trainjob
        """A TrainJob's uid and the version a watch last showed of it (``_versions``), or None."""
        self.core = Cores(kube, on_write=self._wrote)
        self.fleet = fleet if fleet is not None else Fleet(kube)
        """The MultiKueue workers, read for a TrainJob MultiKueue dispatches (never for any other)."""
        self.on_written: Callable[[str, str, str], None] = lambda _key, _state, _message: None
        """Told (key, state, message) of each entry written, so that its echo needs no reconcile."""
        self.before_ready: Callable[[], Any] | None = None
        """Test hook: runs between raising A and setting Ready (a crash point)."""


    # ------------------------------------------------------------------ writes

    def _wrote(self, kind: str) -> None:
        self._metrics.writes.labels(kind).inc()

    async def _write_check(self, workload: kq.Addressed, entry: Obj) -> None:
        await self.core(workload.ref.namespace).write_check(workload, entry, field_manager=self.field_manager)
        key = f"{workload.ref.namespace}/{workload.ref.name}"
        self.on_written(key, str(entry["state"]), str(entry["message"]))

    async def _pending(self, workload: kq.Addressed, entry: kq.CheckEntry, message: str) -> None:
        await self._write_check(workload, kq.entry_body(entry.name, "Pending", message,
                                                        entry.last_transition or now_text()))

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        """Decide one Workload (the same pipeline as a batch of one); its error is raised."""
        result = (await self.reconcile_many(namespace, [name]))[name]
        if isinstance(result, Exception):
            raise result
        return result

    async def reconcile_many(
        self, namespace: str, names: Sequence[str], *, known: int = 0,
        hints: Mapping[str, kq.WorkloadHint] | None = None, decidable: Collection[str] | None = None,
    ) -> dict[str, Outcome | Exception]:
        """Decide Workloads of one namespace from one shared read; errors are per Workload.

        ``hints`` (what the caller's cache knows of each Workload, by name) only narrow the reads:
        Workloads are listed by their owners' uids and TrainJobs by the identity labels Kueue copied
        into the pod sets, so a batch reads about its own objects, not the namespace; whatever a hint
        misses is read by a get.
        ``known`` is how many Workloads the caller knows in the namespace: the JobSets (which carry no
        label to select them by) are listed only when the batch is a large part of it, else got one by
        one (a cost choice, never a correctness one). If a shared read fails, every Workload not yet
        decided gets that error and nothing more is written. ``decidable`` names the Workloads the caller's cache
        shows past screening (quota reserved, active, our check Pending): only for one of those alone are the
        lower layers read early (``_early``; None: any hinted one), so that the many reconciles of a Workload
        held, evicted or without quota read no more than the Workload and its TrainJob.
        """
        unique = list(dict.fromkeys(names))
        started = time.perf_counter()
        out: dict[str, Outcome | Exception] = {}
        try:
            await self._pipeline(namespace, unique, known, hints or {}, out, decidable)
        except Exception as exc:
            for name in unique:
                out.setdefault(name, exc)
            if isinstance(exc, DispatchError):
                await self._explain_failure(unique, hints or {}, exc, out)
        finally:
            share = (time.perf_counter() - started) / max(1, len(unique))
            for _ in unique:
                self._metrics.reconcile_seconds.observe(share)
        return out

    async def _explain_failure(self, names: Sequence[str], hints: Mapping[str, kq.WorkloadHint],
                               exc: DispatchError, out: Mapping[str, Outcome | Exception]) -> None:
        """A decision that failed says so in the Workload's own check message and a Warning Event, so
        ``dispatch status`` explains the stall (a 403 of a missing RBAC rule, say), not only a log line.
        Best effort: written only when the message changes, conditioned on the cached resourceVersion
        (the hint's: what the cache last saw of the Workload's check entries and version)."""
        checks = self._check_names()
        message = d.failed_text(exc)
        for name in names:
            if out.get(name) is not exc or name not in hints:
                continue
            hint = hints[name]
            entry = hint.entry(checks)
            if entry is None or entry.state != "Pending" or entry.message == message:
                continue
            try:
                await self._pending(hint, entry, message)
            except DispatchError:
                continue
            await self._events.emit(api.WORKLOADS, hint.ref, "AdmissionStalled", message, warning=True)

    async def _workloads(self, ns: str, names: list[str],
                         hints: Mapping[str, kq.WorkloadHint]) -> dict[str, Obj | None]:
        owners = [hints[name].owner_uid for name in names if name in hints]
        return await self.core(ns).reader.workloads_named(names, owners)

    async def _trainjobs(self, ns: str, wanted: Mapping[str, tuple[str, str] | None]
                         ) -> dict[str, tr.TrainJobView | None]:
        """The Workloads' owners alone (``Reader.inputs`` without the lower layers), to screen them first."""
        got = await self.core(ns).reader.inputs(list(wanted), identities=wanted, lower=False)
        return {name: got[name].trainjob if name in got else None for name in wanted}

    async def _read_workloads(self, ns: str, names: list[str], hints: Mapping[str, kq.WorkloadHint]
                              ) -> tuple[dict[str, Obj | None], dict[str, tr.TrainJobView | None]]:
        """The Workloads, and at the same time the TrainJobs their hints name as owners: two independent
        reads, so one round trip instead of two. Each TrainJob is still read before the lower layers and
        its raise is conditioned on the version read, so reading it early changes nothing but latency; a
        Workload whose fresh owner differs from its hint has that owner read afterwards."""
        wanted = {h.trainjob: h.pod_set_identity for name in names if (h := hints.get(name)) is not None
                  and h.trainjob}
        if not wanted:
            return await self._workloads(ns, names, hints), {}
        workloads, trainjobs = await asyncio.gather(self._workloads(ns, names, hints),
                                                    self._trainjobs(ns, wanted))
        return workloads, trainjobs

    def _early(self, ns: str, names: list[str], hints: Mapping[str, kq.WorkloadHint],
               decidable: Collection[str] | None) -> _Early | None:
        """One Workload alone (a quiet queue, where latency is what counts) whose TrainJob a watch has shown: its
        lower layers and identity record are sent now, beside the Workload and TrainJob reads, for that version
        (``EarlyRead``); the decision uses them only if the TrainJob it reads is still at it."""
        hint = hints.get(names[0]) if len(names) == 1 and (decidable is None or names[0] in decidable) else None
        seen = self._seen_trainjob(ns, hint.trainjob) if hint is not None and hint.trainjob else None
        if hint is None or seen is None:
            return None
        uid, version = seen
        # Selected by the identity Kueue copied into the pod sets: a TrainJob of another identity is not served.
        job_id, submission = hint.pod_set_identity or ("", "")
        target = Target(hint.trainjob, job_id, submission, uid)
        return _Early(asyncio.ensure_future(self.core(ns).reader.early(
            target, version, records=bool(job_id and submission))), target, version)

    async def _pipeline(self, ns: str, names: list[str], known: int, hints: Mapping[str, kq.WorkloadHint],
                        out: dict[str, Outcome | Exception], decidable: Collection[str] | None = None) -> None:
        early = self._early(ns, names, hints, decidable)
        try:
            await self._decide(ns, names, known, hints, out, early)
        finally:
            if early is not None:
                early.task.cancel()
                # Retrieved here whatever became of it: an early read not used is only dropped.
                await asyncio.gather(early.task, return_exceptions=True)

    async def _early_inputs(self, early: _Early | None, lone: tr.TrainJobView | None) -> dict[str, EarlyRead] | None:
        """The early read, if it stands for ``lone`` as just read (counted: used, stale or failed). Whether it can
        is known before it answers: one that cannot is dropped at once, and the layers are read after the
        TrainJob without waiting for it."""
        if early is None or lone is None:
            return None
        if not EarlyRead.fits(early.target, early.version, lone):
            early.task.cancel()
            self._metrics.early_reads.labels("stale").inc()
            return None
        try:
            got = await early.task
        except DispatchError:
            self._metrics.early_reads.labels("failed").inc()
            return None
        self._metrics.early_reads.labels("used").inc()
        return {lone.name: got}

    async def _decide(self, ns: str, names: list[str], known: int, hints: Mapping[str, kq.WorkloadHint],
                      out: dict[str, Outcome | Exception], early: _Early | None) -> None:
        checks = self._check_names()
        began = time.monotonic()
        raw, trainjobs = await self._read_workloads(ns, names, hints)
        later: list[tuple[str, Coroutine[Any, Any, Outcome]]] = []
        owned: list[_Case] = []
        for name in names:
            obj = raw.get(name)
            if obj is None:
                out[name] = Outcome("gone")
                continue
            workload = kq.WorkloadView.from_obj(obj)
            entry = workload.entry(checks)
            if entry is None:
                out[name] = Outcome("not-ours")
            elif entry.state != "Pending":
                out[name] = Outcome("not-pending")
            elif skip := d.not_now(workload):
                out[name] = Outcome(skip)
            elif workload.owner is None or not workload.owner.is_trainjob:
                if self.foreign == "ignore":
                    out[name] = Outcome("foreign-ignored")
                else:
                    later.append((name, self._foreign(workload, entry)))
            else:
                owned.append(_Case(name, workload, entry, workload.owner, marks={"began": began}))
        missing = {c.owner.name: c.workload.pod_set_identity for c in owned if c.owner.name not in trainjobs}
        if missing:
            trainjobs.update(await self._trainjobs(ns, missing))
        for c in owned:
            c.trainjob = trainjobs.get(c.owner.name)
        deciding: list[_Case] = []
        for c in owned:
            refusal = d.owner_refusal(c.owner, c.trainjob)
            if refusal == "owner-running":
                log.warning("check pending but trainjob not suspended; not admitting", workload=c.workload.key,
                            trainjob=c.owner.name)
            if refusal:
                out[c.name] = Outcome(refusal)
            else:
                deciding.append(c)
        lone = deciding[0].trainjob if len(names) == 1 and len(deciding) == 1 else None
        # One Workload alone (a quiet queue, where latency is what counts): its identity record is read together
        # with the lower layers rather than after them. Every write to the record is conditioned on the version
        # read, so when it is read changes nothing but the time. In a batch (a busy queue) records are read only
        # for the Workloads found admissible. MultiKueue's workers are read for the objects it dispatches.
        got = await self.core(ns).reader.inputs([c.trainjob for c in deciding if c.trainjob is not None],
                                  records="all" if lone is not None and lone.dispatch_object else "admissible",
                                  list_jobsets=len(names) > 1 and len(names) * LIST_FACTOR >= known,
                                  fleet=self.fleet, early=await self._early_inputs(early, lone))
        read = time.monotonic()
        for c in deciding:
            assert c.trainjob is not None
            c.inputs = got[c.trainjob.name]
            c.marks["read"] = read
        later.extend((c.name, self._admit(c)) for c in deciding)
        await _settle(later, out)

    async def _wait(self, c: _Case, verdict: d.Verdict, *, recheck: bool = False) -> Outcome:
        message = d.waiting_text(verdict)
        nodes = frozenset(p.node for p in verdict.remaining if p.node and not p.cluster)
        if message != c.entry.message:
            await self._pending(c.workload, c.entry, message)
            log.info("admission waits", workload=c.workload.key, trainjob=c.owner.name, check_message=message)
            if not c.entry.waiting_episode:
                await self._events.emit_for(c.trainjob, "AdmissionDelayed", d.delayed_event(c.entry.name, message))
        return Outcome("waiting", waiting_nodes=nodes, waiting=True, recheck=FLEET_RECHECK if recheck else None)

    async def _admit(self, c: _Case) -> Outcome:
        """``Core.admission`` (the verdict, and A issued in the identity record and raised on the TrainJob), then
        our check: Ready, or Pending with what it waits for or why it is refused."""
        tj, inputs = c.trainjob, c.inputs
        assert tj is not None and inputs is not None
        core = self.core(c.workload.ref.namespace)
        uid, generation = c.workload.ref.uid, tj.ref.generation
        own = {d.kueue_raise_token(uid, generation - 1)} if generation else set()
        try:
            got = await core.admission(inputs, token=d.kueue_raise_token(uid, generation), own=own, plain=False)
        except Conflict:
            return Outcome("conflict", retry=True, error="TrainJobConflict")
        except Refused as exc:
            message = (d.record_text(exc.message) if exc.reason == "RecordInvalid"
                       else d.refused_text(tj.name, exc))
            if message != c.entry.message:
                await self._pending(c.workload, c.entry, message)
                await self._events.emit_for(tj, "AdmissionRefused", message, warning=True)
            return Outcome("refused", retry=True, error=exc.reason or "Refused")
        if got.admitted is None:
            return await self._wait(c, got.verdict, recheck=inputs.workers is not None)
        c.marks["raised"] = time.monotonic()
        return await self._ready(c, Raised(got.admitted.trainjob, got.admitted.admission,
                                           got.admitted.trainjob.dispatch_object))

    async def _ready(self, c: _Case, r: Raised) -> Outcome:
        """The last write: our check Ready, labels for the new execution's pods, if nothing moved."""
        ns, entry = c.workload.ref.namespace, c.entry
        tj = r.trainjob
        updates: list[Obj] | None = None
        if r.dispatch_object:
            updates = kq.pod_set_updates(c.workload, tr.identity_labels(tj.job_id, tj.submission, r.admission))
            message = d.admitted_text(tj.job_id, tj.submission, r.admission)
        else:
            message = d.FOREIGN_READY_TEXT
        if self.before_ready is not None:
            hook = self.before_ready()
            if hasattr(hook, "__await__"):
                await hook
        ready = kq.entry_body(entry.name, "Ready", message, now_text(), updates)
        try:
            why = await self.core(ns).write_check(c.workload, ready, field_manager=self.field_manager,
                                                  admitted=Admitted(tj, r.admission), tries=READY_RETRIES)
        except Conflict:
            return Outcome("conflict", retry=True, error="WorkloadConflict")
        if why == "gone":
            return Outcome("gone")
        if why:
            return Outcome("conflict", retry=True, error=why)
        self.on_written(f"{ns}/{c.workload.ref.name}", "Ready", message)
        self._metrics.admissions.inc()
        if entry.waiting_episode:
            since = kq.parse_time(entry.last_transition)
            if since is not None:
                self._metrics.wait_seconds.observe(max(0.0, time.time() - since))
        gone = self._last_gone(ns, tj.name) if entry.waiting_episode else None
        if gone is not None:
            self._metrics.pod_gone_to_ready.observe(max(0.0, time.monotonic() - gone))
        log.info("admitted", workload=c.workload.key, trainjob=tj.name, admission=r.admission,
                 waited=entry.waiting_episode, **_steps_ms(c.marks, time.monotonic(), gone))
        await self._events.emit_for(tj, "AdmissionProceeds", d.ready_event(entry.name, message))
        return Outcome("admitted")

    async def _foreign(self, workload: kq.WorkloadView, entry: kq.CheckEntry) -> Outcome:
        """A Workload not owned by a TrainJob: dispatch's rule (and A) are defined for TrainJobs only.

        With ``foreign="ready"`` the check passes it at once, so a ClusterQueue shared with other kinds
        is not starved by a check that can never decide for them; with ``"ignore"`` it is left Pending
        untouched (route such kinds to a ClusterQueue without the check).
        """
        try:
            await self._write_check(workload, kq.entry_body(entry.name, "Ready", d.foreign_text(workload.owner),
                                                            now_text()))
        except Conflict:
            return Outcome("conflict", retry=True, error="WorkloadConflict")
        return Outcome("foreign-ready")


def _steps_ms(marks: Mapping[str, float], ready: float, gone: float | None) -> dict[str, float]:
    """Where an admission's time went, in ms: from the last pod's end (as the pod watch saw it) to the decision's
    start, its reads (the Workload, its TrainJob and what the rule reads), the raise (the floor, the identity
    record and A on the TrainJob) and our check's Ready write."""
    points = (gone, marks.get("began"), marks.get("read"), marks.get("raised"), ready)
    names = ("gone_to_decision_ms", "read_ms", "raise_ms", "ready_ms")
    return {name: round((b - a) * 1000, 1) for name, a, b in zip(names, points, points[1:], strict=False)
            if a is not None and b is not None}


async def _settle(jobs: Sequence[tuple[str, Coroutine[Any, Any, T]]], out: dict[str, T | Exception]) -> None:
    """Run per-Workload steps concurrently; each Workload gets its result or its own exception."""
    results = await asyncio.gather(*(job for _, job in jobs), return_exceptions=True)
    for (name, _), result in zip(jobs, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        out[name] = result

