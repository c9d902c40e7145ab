"""The adapter: open, release, hold, inspect, find, ceased, close, wait, logs.

``AsyncAdapter`` holds the user verbs only; the admission protocol they share with the controller
(consistent reads, the identity record, raising A, unsuspending) is ``_core``, and what to decide from
a read is ``_decision``. ``Adapter`` is a synchronous facade that runs the same core on a private event
loop thread (as lightkube pairs ``Client`` with ``AsyncClient``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2

from . import _core
from . import _decision as d
from . import _kube as k
from . import _names as n
from . import _trainer as tr
from ._api import Obj
from ._core import Core
from ._overrides import ConfigOverrides
from ._read import TRAINER_MISSING, Reader, Target
from ._records import Cessation, Identity, JobSpec, PodEnd, RemainingPod, State, Status, Worker
from ._views import PodView, annotations_of, labels_of, name_of
from .errors import FieldCause, InvalidInput, NotFound, PodsRemain, ReadOnly, Refused, Unreachable

if TYPE_CHECKING:
    from ._fleet import WorkerView
    from ._follow import Follower

# What only opening, writing, following, the fleet and administration use is imported by the method that uses it:
# ``status NAME`` reads without them (issue 37: the command's start).

T = TypeVar("T")
SETTLE_SECONDS = 10.0
"""How long a release waits for lower layers to acknowledge a suspension before it reports them."""


def _validate_spec(spec: JobSpec) -> str:
    """``_validate.validate_spec``, imported when a spec is opened (``dispatch.validate_spec`` is that one)."""
    from ._validate import validate_spec

    return validate_spec(spec)


def find_selector(*, job_id: str | None = None, submission: str | None = None, unmanaged: bool = False,
                  selector: str | None = None) -> str | None:
    """The label selector ``find`` lists TrainJobs with; invalid filters are refused naming them."""
    problems = []
    for field, value in (("job_id", job_id), ("submission", submission)):
        if value is not None and n.label_value_problem(value):
            problems.append(FieldCause(field, f"{value!r} is not a valid label value", "FieldValueInvalid"))
    if selector is not None and (not selector.strip() or any(ord(c) < 32 or ord(c) == 127 for c in selector)):
        problems.append(FieldCause("selector", f"{selector!r} is not a label selector", "FieldValueInvalid"))
    n.check(problems)
    parts = [f"{n.LABEL_JOB_ID}={job_id}" if job_id else n.LABEL_JOB_ID]
    if submission:
        parts.append(f"{n.LABEL_SUBMISSION}={submission}")
    if unmanaged and not (job_id or submission):
        parts = []
    if selector:
        parts.append(selector.strip())
    return ",".join(parts) or None


class AsyncAdapter:
    """The dispatch adapter for one namespace. A writer may admit; a read-only adapter only reads."""

    def __init__(self, kube: k.Kube, *, read_only: bool = False, conflict_retries: int = 5) -> None:
        self._kube = kube
        self.core = Core(kube)
        self.read_only = read_only
        self.conflict_retries = conflict_retries
        self.settle_seconds = SETTLE_SECONDS

    @classmethod
    def connect(
        cls,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        read_only: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
        request_timeout: float | None = None,
        overrides: ConfigOverrides | None = None,
        qps: float = k.DEFAULT_QPS,
        burst: int = k.DEFAULT_BURST,
        retry_seconds: float = k.RETRY_SECONDS,
    ) -> AsyncAdapter:
        """Connect with a kubeconfig (default: KUBECONFIG, ~/.kube/config, then in-cluster).

        ``request_timeout`` bounds each request with its retries, in seconds (kubectl's ``--request-timeout``);
        ``overrides`` are kubectl's client flags (``--server``, ``--token``, ``--as``, ...) laid over the
        kubeconfig. ``qps`` and ``burst`` are client-go's client-side rate limit (0 QPS, the default: none, the
        API server's Priority and Fairness paces the client through 429s and their ``Retry-After``, which are
        always honoured); ``retry_seconds`` bounds how long one call may retry before it fails with
        ``Unreachable``."""
        if namespace is not None:
            problem = n.dns1123_subdomain_problem(namespace)
            if problem:
                n.check([FieldCause("namespace", f"{namespace!r} {problem}", "FieldValueInvalid")])
        problems = k.pacing_problems(qps, burst, retry_seconds)
        if problems:
            n.check(problems)
        kube = k.Kube.connect(namespace=namespace, kubeconfig=kubeconfig, context=context, transport=transport,
                              request_timeout=request_timeout, overrides=overrides, qps=qps, burst=burst,
                              retry_seconds=retry_seconds)
        return cls(kube, read_only=read_only)

    @property
    def namespace(self) -> str:
        return self._kube.namespace

    @property
    def kube(self) -> k.Kube:
        """The API access this adapter uses (request counters are read by benchmarks)."""
        return self._kube

    async def aclose(self) -> None:
        await self._kube.aclose()

    async def __aenter__(self) -> AsyncAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ reads

    async def inspect(self, name: str) -> Status:
        """The object's state, identity and cause; a not-running object names what keeps it waiting."""
        n.validate_ref(name)
        return await self.core.reader.status(name)

    async def find(
        self,
        *,
        job_id: str | None = None,
        submission: str | None = None,
        state: State | Collection[State] | None = None,
        unmanaged: bool = False,
        selector: str | None = None,
        all_namespaces: bool = False,
    ) -> list[Status]:
        """Status of many objects with a constant number of list calls, however many match.

        ``unmanaged`` lists every TrainJob of the namespace, dispatch's or not (``Status.managed`` tells which).
        ``selector`` is a label selector the TrainJobs must also match (kubectl's ``-l``). With
        ``all_namespaces`` the TrainJobs of every namespace are listed in one call, then each namespace
        that has some is read as one namespace is (sorted by namespace, then name)."""
        labels = find_selector(job_id=job_id, submission=submission, unmanaged=unmanaged, selector=selector)
        try:
            listed = await self.core.reader.listed_trainjobs(labels, all_namespaces=all_namespaces)
        except NotFound as exc:
            raise NotFound(TRAINER_MISSING, reason=exc.reason, code=exc.code) from exc
        except Refused as exc:
            if selector and exc.code == 400:  # the API server parses selectors: name the one it refused
                raise Refused(f"label selector {selector!r} refused by the API server: {exc}", reason="BadSelector",
                              code=exc.code, causes=exc.causes) from exc
            raise
        if not all_namespaces:
            return await self.core.reader.statuses(listed, state)
        by_namespace: dict[str, list[Obj]] = {}
        for obj in listed:
            by_namespace.setdefault(str((obj.get("metadata") or {}).get("namespace") or ""), []).append(obj)
        out: list[Status] = []
        for ns in sorted(by_namespace):
            out.extend(await Reader(self._kube.in_namespace(ns)).statuses(by_namespace[ns], state))
        return out

    async def ceased(self, name: str) -> Cessation:
        """Whether the object's processes are proven gone. Writes nothing; needs get on Nodes."""
        n.validate_ref(name)
        tj, local, here = await self.core.reader.cessation(name)
        from ._fleet import MULTIKUEUE, Fleet, ceased_across

        if tj is None or tj.managed_by != MULTIKUEUE or not here.ceased:
            return here
        return await ceased_across(Fleet(self._kube), self.core.reader, tj, local, here)


    # ------------------------------------------------------------------ writes

    async def open(self, spec: JobSpec, *, hold: bool = True) -> Status:
        """Create the TrainJob, suspended, after claiming its submission (only one open can win it).

        With ``hold=False`` (plain mode) it is then released through the same check as ``release``, so
        its A is recorded before anything can start.
        """
        name = _validate_spec(spec)
        _writer(self, "open")
        body, warnings = await _body(self.core.reader, spec, name)
        if spec.termination_grace_period_seconds is not None:
            await self.core.reader.check_grace_kept(body)
        return await _create(self, body, name, spec.job_id, spec.submission, hold=hold or spec.queue is not None,
                                  warnings=warnings)

    async def open_manifest(self, manifest: Mapping[str, Any], *, hold: bool = True) -> Status:
        """Create a whole TrainJob manifest as dispatch's, exactly as enrolment brings a TrainJob created in
        an enrolled namespace under dispatch (``_enrol.enrol``: identity labels, A=0, the identity env
        variables, dispatch's runtime patch entry, suspended), then as ``open`` does (the submission
        claimed, held unless ``hold`` is False). What enrolment refuses is refused naming the field, and
        so is a manifest that is not a TrainJob of this namespace; nothing else of it is changed.

        The job-id is the ``job-id`` label, else the name; the submission the ``submission`` label, else a
        fresh UUID (as enrolment takes its admission request's uid), so opening one manifest twice makes two
        submissions (the second refused while the name is taken)."""
        _writer(self, "open")
        body, job_id, submission = await _manifest_body(self.core.reader, manifest)
        kueue = bool(labels_of(body).get(n.KUEUE_QUEUE_LABEL))
        return await _create(self, body, name_of(body), job_id, submission, hold=hold or kueue, warnings=())

    async def open_manifest_dry_run(self, manifest: Mapping[str, Any], *, server: bool = True) -> dict[str, Any]:
        """The TrainJob ``open_manifest`` would create, and nothing written (as ``open_dry_run``)."""
        if server:
            _writer(self, "open")
        body, _, _ = await _manifest_body(self.core.reader, manifest)
        return await self.core.create_trainjob(body, dry_run=True) if server else body

    async def open_dry_run(self, spec: JobSpec, *, server: bool = True) -> dict[str, Any]:
        """The TrainJob ``open`` would create, and nothing written (kubectl's ``--dry-run``).

        With ``server`` the API server validates it (Trainer's webhooks and the guard included) and
        applies its defaults with ``dryRun=All``, storing nothing; else it is the body dispatch would
        send (the runtime is still read). The submission is not claimed, so a submission already taken
        is found only by the real ``open``."""
        name = _validate_spec(spec)
        if server:
            _writer(self, "open")
        body, _ = await _body(self.core.reader, spec, name)
        if not server:
            return body
        if spec.termination_grace_period_seconds is not None:
            await self.core.reader.check_grace_kept(body)
        return await self.core.create_trainjob(body, dry_run=True)

    async def release(self, name: str) -> Identity:
        """Admit the object if no pod of it may still run; else write nothing and raise PodsRemain.

        Idempotent: releasing an admitted object returns its identity without writing. A rises exactly
        once per admission: the call's token goes with its raise, so a retry after a conflict or a lost
        reply finds that raise (``_decision.next_admission``). In Kueue mode (a Workload owns the
        TrainJob, with or without the queue-name label) the hold is the Workload's ``active`` flag, and
        Kueue admits through dispatch's check.
        """
        import uuid

        from . import _events as ev

        n.validate_ref(name)
        _writer(self, "release")
        token = uuid.uuid4().hex

        async def once() -> Identity:
            delay, deadline = 0.1, time.monotonic() + self.settle_seconds
            while True:
                # every read the admission decides from, at once (the TrainJob first: the rest are selected by it)
                inputs = (await self.core.reader.inputs([name], workload="own", runtime=True,
                                                        lower=d.release_reads))[name]
                got = await self.core.admission(inputs, token=token, own={token}, plain=True)
                # wait briefly while the only blockers are layers that have not yet acknowledged a suspension (a
                # Job just created suspended gets its Suspended condition within moments): admission still needs
                # each acknowledgement; this only spares the caller a retry for what the Job controller is about
                # to write. dispatch's pod finalizer is freed by the controller's keeper, never here.
                if (got.verdict.admissible or not d.only_unconfirmed(got.verdict)
                        or time.monotonic() + delay > deadline):
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            tj, admitted = inputs.trainjob, got.admitted
            if got.handed:
                return tj.identity
            if admitted is None:
                await ev.record(self._kube, ev.delayed(tj, got.verdict.detail()))
                raise PodsRemain(name, got.verdict.detail(), remaining=got.verdict.remaining)
            # started by the raise itself, or (a raise found, or a Trainer before v2.2.1) by the unsuspend
            if not admitted.started and not await self.core.unsuspend(admitted.trainjob, admitted.admission,
                                                                      self.conflict_retries):
                raise k.kept_changing(f"trainjob {name}")  # the decision no longer holds: decide afresh
            await ev.record(self._kube, ev.admitted(admitted.trainjob, admitted.admission))
            return Identity(tj.job_id, tj.submission, admitted.admission)

        return await k.on_conflict(once, f"trainjob {name} under release", tries=self.conflict_retries)

    async def hold(self, name: str) -> Status:
        """Suspend the object (in Kueue mode: deactivate its Workload). Its pods then start to go."""
        from . import _events as ev

        n.validate_ref(name)
        _writer(self, "hold")
        tj = await self.core.reader.trainjob(name)
        refusal = d.dispatch_refusal(tj)
        if refusal is not None:
            raise Refused(refusal[0], reason=refusal[1])
        workload = await self.core.reader.workload_of(tj)
        if workload is not None:
            await self.core.set_active(workload, False)
        elif tj.queue:
            raise Unreachable(f"Kueue has not created a Workload for {name} yet; retry", reason="NoWorkload")
        elif not tj.suspended:
            await self.core.suspend(tj)
            await ev.record(self._kube, ev.held(tj))
        return await self.inspect(name)

    async def close(self, name: str) -> tuple[RemainingPod, ...]:
        """Delete the object, after recording its A in the identity record and releasing its claim
        (the record outlives it, so a re-opened submission goes on counting). Returns the pods that
        remain: they still block a same-named or same-submission new object."""
        from . import _events as ev

        n.validate_ref(name)
        _writer(self, "close")
        tj = await self.core.reader.trainjob_or_none(name)
        if tj is None:
            if await self.core.close_unopened(name):  # an open that claimed its submission, never created it
                return ()
            raise NotFound(f"trainjob {name} not found in namespace {self.namespace}", reason="NotFound", code=404)
        target = Target.of(tj)
        snap = await self.core.reader.read_one(target, lower=False)
        mine = snap.object_pods(target)
        await self.core.close(tj, mine)
        try:
            await self.core.delete_trainjob(name)
        except NotFound:
            pass
        left = d.remaining(mine, snap.nodes)
        await ev.record(self._kube, ev.closed(tj, left))
        return left

    # ------------------------------------------------------------------ admin

    async def release_pod(self, pod: str, *, node_confirmed_down: bool = False,
                          process_gone: bool = False) -> PodEnd:
        """Remove dispatch's finalizer from one pod, so its deletion can complete.

        Without ``node_confirmed_down`` only a pod whose end is proven (its kubelet confirmed it, or its
        Node is out-of-service and not Ready; a Node found deleted proves nothing by itself) is released.
        With it, the operator's word that the pod's node is shut down is the proof (Kubernetes'
        non-graceful shutdown asks the same before the
        out-of-service taint); refused while that Node reports Ready=True, whose kubelet will confirm
        the pod's end itself. ``process_gone`` is the word for the one end a Ready kubelet does not
        confirm: a terminal phase someone else wrote over a container that could have restarted while
        its node was unreachable (see ``_decision.release_pod_proof``). Returns how the end was proven
        (``operator-confirmed`` for a word)."""
        problem = n.dns1123_subdomain_problem(pod)
        if problem:
            n.check([FieldCause("pod", f"{pod!r} {problem}", "FieldValueInvalid")])
        _writer(self, "release a pod")

        async def once() -> PodEnd:
            obj = await self.core.reader.pod_or_none(pod)
            if obj is None:
                raise NotFound(f"pod {pod} not found in namespace {self.namespace}", reason="NotFound", code=404)
            view = PodView.from_obj(obj)
            nodes = await self.core.reader.nodes([view]) if view.ours else {}
            proof, refusal = d.release_pod_proof(view, nodes.get(view.node) if view.node else None,
                                                 node_confirmed_down=node_confirmed_down,
                                                 process_gone=process_gone)
            if refusal is not None and view.needs_mark_record:
                # First sight of the mark (no controller recorded it): record it, then judge the pod afresh.
                await _core.record_mark(self._kube, view)
                raise k.kept_changing(f"pod {pod}")
            if refusal is not None:
                raise Refused(refusal[0], reason=refusal[1])
            if proof == d.OPERATOR_CONFIRMED and not view.deleting:
                # Nothing else would delete it (a Job keeps a failed pod): with only the finalizer gone
                # it would stay, and keep blocking, unproven. Deleted first, it goes once released.
                await _core.delete_pod(self._kube, view, grace_seconds=0)
                raise k.kept_changing(f"pod {pod}")
            if not await _core.remove_finalizer(self._kube, view, forbidden_ok=False):
                raise k.kept_changing(f"pod {pod}")
            return PodEnd(view.name, view.node, proof, view.phase, finalizer=False)

        return await k.on_conflict(once, f"pod {pod}", tries=self.conflict_retries)

    async def forget(self, job_id: str, submission: str) -> bool:
        """Delete a submission's identity record, so it counts from A=1 again (needs ``dispatch-admin``).

        Only for a submission no process of which can still run and whose old A nothing fences on any
        more: after it, a re-opened submission may reuse numbers. Refused while a TrainJob holds it."""
        from . import _admin

        _writer(self, "forget")
        n.check([FieldCause(f, f"{v!r} is not a valid label value", "FieldValueInvalid")
                 for f, v in (("job_id", job_id), ("submission", submission))
                 if not v or n.label_value_problem(v)])
        return await _admin.forget(self.core, job_id, submission) is not None

    async def worker_down(self, worker: str) -> Worker:
        """Confirm that MultiKueue worker ``worker``, which Kueue has lost (Active=False), is down: its pods no
        longer block an admission on the manager (needs ``dispatch-admin``). The confirmation names that
        loss, so it lapses by itself if the worker comes back and is lost again. Refused for a worker Kueue
        still reaches: a reachable worker is read, never trusted to be down.

        A worker no MultiKueueCluster names any more (removed from the manager) that identity records still
        remember: every such record forgets it (``_admin.forget_worker``), which is the operator's word that it
        runs none of their pods; NotFound when no record remembers it either."""
        from . import _admin
        from ._fleet import Fleet

        try:
            return _worker(await Fleet(self._kube).confirm_down(worker))
        except NotFound:
            forgotten, armed = await _admin.forget_worker(self.core, worker)
            if not forgotten and not armed:
                raise NotFound(f"multikueuecluster {worker} not found, and no identity record remembers a worker "
                               "of that name", reason="NotFound", code=404) from None
            return Worker(worker, "Unknown", "Removed", "no MultiKueueCluster names it", "", True, removed=True,
                          forgotten=tuple(forgotten), armed=tuple(armed))

    async def workers(self) -> list[Worker]:
        """The MultiKueue workers (MultiKueueClusters) as Kueue sees them; empty outside a manager."""
        from ._fleet import Fleet

        return [_worker(w) for _, w in sorted((await Fleet(self._kube).workers()).items())]

    async def migrate(self) -> tuple[int, int]:
        """Fold the old ``dispatch-admissions`` ledger and every dispatch TrainJob's A into identity
        records, then delete the ledger (needs ``dispatch-admin``). Returns (created, raised)."""
        from . import _admin

        _writer(self, "migrate")
        return await _admin.migrate(self.core)

    # ------------------------------------------------------------------ waiting and logs

    async def follow(self, name: str, *, interval: float = 1.0) -> Follower:
        """Start following the object's pods (both selections) and its TrainJob; ``changed`` on the
        result waits for the next change. Close it (``aclose`` or ``async with``) when done."""
        from ._follow import Follower, selections

        n.validate_ref(name)
        tj = await self.core.reader.trainjob(name)
        follower = Follower(self._kube, selections(name, tj.job_id, tj.submission), interval=interval,
                            complete=bool(tj.job_id and tj.submission))
        await follower.start()
        return follower

    async def follow_find(self, *, job_id: str | None = None, submission: str | None = None,
                          unmanaged: bool = False, selector: str | None = None, all_namespaces: bool = False,
                          interval: float = 1.0) -> Follower:
        """Follow what ``find`` with the same filters answers from: the TrainJobs it lists and the pods of
        dispatch's objects (and, with ``unmanaged``, every JobSet's pods), for ``status --watch``."""
        from ._follow import Follower, Selection

        labels = find_selector(job_id=job_id, submission=submission, unmanaged=unmanaged, selector=selector)
        pods = f"{n.LABEL_JOB_ID}={job_id}" if job_id else n.LABEL_JOB_ID
        chosen = [Selection(k.TRAINJOBS, labels or "", all_namespaces),
                  Selection(k.PODS, pods, all_namespaces)]
        if unmanaged:
            chosen.append(Selection(k.PODS, n.JOBSET_NAME_LABEL, all_namespaces))
        follower = Follower(self._kube, chosen, interval=interval)
        await follower.start()
        return follower

    async def wait(
        self,
        name: str,
        states: State | Collection[State],
        *,
        timeout: float = 600.0,
        interval: float = 1.0,
        on_status: Callable[[Status], None] | None = None,
    ) -> Status:
        """Until the object reaches one of ``states``; Unreachable(reason=Timeout) after ``timeout``.

        Re-inspects on each change of the object's pods or TrainJob (watched), and polls every
        ``interval`` (doubling) only while a watch is down; each answer is ``inspect``'s consistent read.
        """
        wanted = {states} if isinstance(states, State) else set(states)
        deadline = time.monotonic() + timeout
        async with await self.follow(name, interval=interval) as follower:
            while True:
                status = await self.inspect(name)
                if on_status is not None:
                    on_status(status)
                if status.state in wanted:
                    return status
                if time.monotonic() >= deadline:
                    raise Unreachable(
                        f"timed out after {timeout:g}s waiting for {name} to be "
                        f"{'/'.join(sorted(s.value for s in wanted))}; it is {status.state.value}: {status.cause}",
                        reason="Timeout",
                    )
                await follower.changed(max(0.0, deadline - time.monotonic()))

    async def logs(self, name: str, *, node: int = 0, follow: bool = False, tail: int | None = None,
                   since_seconds: int | None = None, timestamps: bool = False, container: str | None = None,
                   previous: bool = False) -> AsyncIterator[str]:
        """Log lines of the object's node ``node`` (trainer container), like TrainerClient.get_job_logs.

        ``tail``, ``since_seconds``, ``timestamps``, ``container`` and ``previous`` are the pod log API's
        ``tailLines``, ``sinceSeconds``, ``timestamps``, ``container`` and ``previous`` (kubectl logs' flags)."""
        problems = []
        if tail is not None and tail < 0:
            problems.append(FieldCause("tail", f"{tail} is negative", "FieldValueInvalid"))
        if since_seconds is not None and since_seconds <= 0:
            problems.append(FieldCause("since_seconds", f"{since_seconds} is not positive", "FieldValueInvalid"))
        if container is not None:
            why = n.dns1123_subdomain_problem(container) or ("must not contain '.'" if "." in container else None)
            if why:
                problems.append(FieldCause("container", f"{container!r} {why}", "FieldValueInvalid"))
        n.check(problems)
        n.validate_ref(name)
        raw = await self.core.reader.jobset_pods(name)
        live = [p for p in raw if not PodView.from_obj(p).deleting] or raw
        index = str(node)
        key = "batch.kubernetes.io/job-completion-index"
        chosen = [p for p in live if labels_of(p).get(key) == index or annotations_of(p).get(key) == index]
        if not chosen:
            raise NotFound(f"no pod of {name} for node {node} yet", reason="NotFound")
        async for line in self._kube.logs(name_of(chosen[0]), follow=follow, tail=tail, since_seconds=since_seconds,
                                          timestamps=timestamps, container=container, previous=previous):
            yield line


def _writer(adapter: AsyncAdapter, verb: str) -> None:
    if adapter.read_only:
        raise ReadOnly(f"cannot {verb}: this adapter is read-only", reason="ReadOnly")


async def _body(reader: Reader, spec: JobSpec, name: str) -> tuple[Obj, tuple[str, ...]]:
    """The TrainJob body ``open`` sends, built over the runtime it names (read here), and the runtime's
    warnings; what of the spec the runtime cannot take is refused naming the field, before any write."""
    from ._validate import runtime_problems

    shape, warnings = await reader.runtime_shape(spec)
    n.check(runtime_problems(spec, shape, f"{spec.runtime_kind} {spec.runtime}"))
    return tr.trainjob_body(spec, name, reader.namespace, shape.jobs, trainer_jobs=shape.trainer_jobs), warnings


async def _manifest_body(reader: Reader, manifest: Mapping[str, Any]) -> tuple[Obj, str, str]:
    """(the body, job-id, submission) of a TrainJob manifest brought under dispatch by ``_enrol.enrol``."""
    import uuid

    from . import _enrol as enr

    problems = enr.manifest_problems(manifest, reader.namespace)
    n.check([FieldCause(field, message, "FieldValueInvalid") for field, message in problems])
    ref = enr.runtime_ref(manifest)
    runtime = await reader.runtime_or_none(*ref) if ref is not None else None
    got = enr.enrol(manifest, str(uuid.uuid4()), runtime)
    if got.denial is not None:
        raise InvalidInput(got.denial.replace("cannot be enrolled in dispatch", "cannot be opened by dispatch"),
                           reason="Invalid")
    return enr.apply_patch(manifest, got.patch), got.job_id, got.submission


async def _create(adapter: AsyncAdapter, body: Obj, name: str, job_id: str, submission: str, *, hold: bool,
                  warnings: tuple[str, ...]) -> Status:
    """``open``'s writes after its body is built: the TrainJob created on its claimed submission (``Core.open``),
    and (``hold`` False) released through the same check as ``release``."""
    from . import _events as ev

    core = adapter.core
    if not hold:
        # An earlier object of the same name or submission may still have pods: refuse before writing
        # anything (release reads again before it admits).
        target = Target(name, job_id, submission)
        verdict = (await core.reader.read_one(target)).verdict(target)
        if verdict.remaining:
            raise PodsRemain(name, verdict.detail(), remaining=verdict.remaining)
    created = await core.open(body, name, job_id, submission)
    if hold:
        if not created.queue:  # plain mode tells its story in Events, as Kueue mode does
            await ev.record(adapter.kube, ev.opened(created))
        return core.reader.status_of(created, d.Verdict((), ()), warnings=warnings)
    await adapter.release(name)
    status = await adapter.inspect(name)
    return dataclasses.replace(status, warnings=tuple(dict.fromkeys([*warnings, *status.warnings])))


def _worker(w: WorkerView) -> Worker:
    return Worker(w.name, w.active, w.active_reason, w.active_message, w.lost_since, w.down_confirmed)


class Adapter:
    """Synchronous facade over ``AsyncAdapter``, for scripts and the CLI."""

    def __init__(self, aio: AsyncAdapter, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._async = aio
        self._loop = loop
        self._thread = thread

    @classmethod
    def connect(
        cls,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        read_only: bool = False,
        transport: httpx2.AsyncBaseTransport | None = None,
        request_timeout: float | None = None,
        overrides: ConfigOverrides | None = None,
        qps: float = k.DEFAULT_QPS,
        burst: int = k.DEFAULT_BURST,
        retry_seconds: float = k.RETRY_SECONDS,
    ) -> Adapter:
        """Connect (``AsyncAdapter.connect``'s arguments) and run the adapter on a loop of its own."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="dispatch-loop", daemon=True)
        thread.start()

        async def build() -> AsyncAdapter:
            return AsyncAdapter.connect(
                namespace, kubeconfig=kubeconfig, context=context, read_only=read_only, transport=transport,
                request_timeout=request_timeout, overrides=overrides, qps=qps, burst=burst, retry_seconds=retry_seconds,
            )

        try:
            core = asyncio.run_coroutine_threadsafe(build(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            raise
        return cls(core, loop, thread)

    def _run(self, coro: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro

        fut: Future[T] = asyncio.run_coroutine_threadsafe(wrap(), self._loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()
            raise

    @property
    def namespace(self) -> str:
        return self._async.namespace

    @property
    def read_only(self) -> bool:
        return self._async.read_only

    @property
    def core(self) -> AsyncAdapter:
        return self._async

    def open(self, spec: JobSpec, *, hold: bool = True) -> Status:
        return self._run(self._async.open(spec, hold=hold))

    def release(self, name: str) -> Identity:
        return self._run(self._async.release(name))

    def hold(self, name: str) -> Status:
        return self._run(self._async.hold(name))

    def inspect(self, name: str) -> Status:
        return self._run(self._async.inspect(name))

    def find(self, *, job_id: str | None = None, submission: str | None = None,
             state: State | Collection[State] | None = None, unmanaged: bool = False,
             selector: str | None = None, all_namespaces: bool = False) -> list[Status]:
        return self._run(self._async.find(job_id=job_id, submission=submission, state=state, unmanaged=unmanaged,
                                         selector=selector, all_namespaces=all_namespaces))

    def follow_find(self, *, job_id: str | None = None, submission: str | None = None, unmanaged: bool = False,
                    selector: str | None = None, all_namespaces: bool = False, interval: float = 1.0) -> Following:
        """What ``find`` answers from, followed by watches (see ``AsyncAdapter.follow_find``)."""
        return Following(self, self._run(self._async.follow_find(
            job_id=job_id, submission=submission, unmanaged=unmanaged, selector=selector,
            all_namespaces=all_namespaces, interval=interval)))

    def open_dry_run(self, spec: JobSpec, *, server: bool = True) -> dict[str, Any]:
        return self._run(self._async.open_dry_run(spec, server=server))

    def open_manifest(self, manifest: Mapping[str, Any], *, hold: bool = True) -> Status:
        return self._run(self._async.open_manifest(manifest, hold=hold))

    def open_manifest_dry_run(self, manifest: Mapping[str, Any], *, server: bool = True) -> dict[str, Any]:
        return self._run(self._async.open_manifest_dry_run(manifest, server=server))

    def ceased(self, name: str) -> Cessation:
        return self._run(self._async.ceased(name))

    def close(self, name: str) -> tuple[RemainingPod, ...]:
        return self._run(self._async.close(name))

    def wait(self, name: str, states: State | Collection[State], *, timeout: float = 600.0,
             interval: float = 1.0, on_status: Callable[[Status], None] | None = None) -> Status:
        return self._run(self._async.wait(name, states, timeout=timeout, interval=interval,
                                         on_status=on_status))

    def follow(self, name: str, *, interval: float = 1.0) -> Following:
        """The object's pods and TrainJob, followed by watches (see ``AsyncAdapter.follow``)."""
        return Following(self, self._run(self._async.follow(name, interval=interval)))

    def forget(self, job_id: str, submission: str) -> bool:
        return self._run(self._async.forget(job_id, submission))

    def release_pod(self, pod: str, *, node_confirmed_down: bool = False, process_gone: bool = False) -> PodEnd:
        return self._run(self._async.release_pod(pod, node_confirmed_down=node_confirmed_down,
                                                process_gone=process_gone))

    def migrate(self) -> tuple[int, int]:
        return self._run(self._async.migrate())

    def worker_down(self, worker: str) -> Worker:
        return self._run(self._async.worker_down(worker))

    def workers(self) -> list[Worker]:
        return self._run(self._async.workers())

    def logs(self, name: str, *, node: int = 0, follow: bool = False, tail: int | None = None,
             since_seconds: int | None = None, timestamps: bool = False, container: str | None = None,
             previous: bool = False) -> Iterator[str]:
        agen = self._async.logs(name, node=node, follow=follow, tail=tail, since_seconds=since_seconds,
                               timestamps=timestamps, container=container, previous=previous)
        while True:
            try:
                yield self._run(agen.__anext__())
            except StopAsyncIteration:
                return

    def shutdown(self) -> None:
        """Close the connection and stop the private loop."""
        if not self._loop.is_running():
            return
        try:
            self._run(self._async.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class Following:
    """A started ``Follower`` driven from the synchronous facade."""

    def __init__(self, adapter: Adapter, follower: Follower) -> None:
        self._adapter = adapter
        self.follower = follower

    def changed(self, timeout: float) -> bool:
        """Block until something followed changed (True) or the wait ran out (False)."""
        return self._adapter._run(self.follower.changed(timeout))

    def close(self) -> None:
        self._adapter._run(self.follower.aclose())

    def __enter__(self) -> Following:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
