"""The admission core: the writes of the admission protocol, each conditioned on what was read.

Both the library verbs (``_adapter``) and the Kueue controller admit through this one place. ``Core``
holds a ``Reader`` (``_read``: the consistent read and every other read, ``Core.reader``) and adds the
protocol's writes:

* ``claim``/``unclaim``: the identity record (``_identity``) is claimed by one ``open``, and released by
  ``close`` with the highest A the object carried (``close``, whose branch is ``_decision.close_record``);
* ``admission``: the one admission entry (the verdict over ``_read.Inputs``, then ``admit``);
* ``admit``: A is issued in the record before any TrainJob carries it, then raised on the TrainJob and in
  dispatch's runtime patch entry; ``unsuspend`` then starts the execution (plain mode) or the controller
  sets its admission check Ready (Kueue mode);
* beside the core, dispatch's pod finalizer (``free``, ``remove_finalizer``, ``delete_pod``, ``record_mark``):
  functions over the API client, for the finalizer keeper and ``admin release-pod``, which need no core.

What to decide from a read (the rule, which A to issue, whether a claim may be taken, whether a
decision still holds after a conflict) is the pure functions of ``_decision``; the core decides nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from . import _api as api
from . import _decision as d
from . import _identity as ident
from . import _kube as k
from . import _kueue as kq
from . import _trainer as tr
from ._api import Obj
from ._kube import Kube
from ._names import ANNOTATION_MARK_SEEN
from ._read import TRAINER_MISSING, Inputs, Reader, Snapshot, Target, _no_record_kind
from ._views import POD_FINALIZER, MarkSeen, NodeView, PodView, name_of, parse_count
from .errors import Conflict, Forbidden, NotFound, NotServed, Refused

__all__ = ["Admission", "Admitted", "Core", "Cores", "Inputs", "Snapshot", "Target"]

@dataclass(frozen=True)
class Admitted:
    """An admission after its first writes: the TrainJob as the raise left it, and the A it carries."""

    trainjob: tr.TrainJobView
    admission: int
    started: bool = False
    """Plain mode: the raise started the execution in the same write (else the verb unsuspends)."""


@dataclass(frozen=True)
class Admission:
    """What ``Core.admission`` found and did: the verdict it went by, and the admission's first writes when it was
    admissible (``admitted``); a plain release of an object already running or Kueue's says so (``handed``:
    ``running`` or ``kueue``) and admits nothing."""

    verdict: d.Verdict
    admitted: Admitted | None = None
    handed: str = ""


class Core:
    """The admission protocol's writes for one namespace, over the reads of its ``Reader``."""

    def __init__(self, kube: Kube, *, on_write: Callable[[str], None] = lambda _kind: None) -> None:
        self.kube = kube
        self.reader = Reader(kube)
        """Every read the protocol takes (``_read``): the core holds one, and decides nothing from it itself."""
        self.on_write = on_write
        """Called with "record", "trainjob" or "workload" after each admitting write (the controller's metrics)."""
        self.atomic_start = True
        """Plain mode raises A and starts in one write until this cluster's Trainer refuses that (before v2.2.1 its
        webhook lets runtime patches change only in a write that leaves the TrainJob suspended): then in two."""

    # ------------------------------------------------------------------ the identity record

    async def _create_record(self, body: dict[str, object]) -> ident.RecordView:
        try:
            return ident.RecordView.from_obj(await self.kube.create(api.SUBMISSION_RECORDS, body))
        except NotFound as exc:
            raise _no_record_kind(exc) from exc

    async def claim(self, job_id: str, submission: str, trainjob: str) -> ident.RecordView:
        """Claim a submission for ``trainjob`` (``_decision.claim`` says how); only one caller can win it.
        A new record continues from the old namespace ledger's A if it has one."""

        async def once() -> ident.RecordView:
            record = await self.reader.record(job_id, submission)
            invalid = d.claim_refusal_of_record(record, job_id, submission) if record is not None else None
            holder = (await self.reader.trainjob_or_none(record.trainjob)
                      if record is not None and record.trainjob and invalid is None else None)
            other = (None if invalid is not None or d.claim_held(record, holder)
                     else await self.reader.live_trainjob_of(job_id, submission))
            step = d.claim(job_id, submission, trainjob, record, holder, other)
            if step.refusal is not None:
                raise Refused(step.refusal[0], reason=step.refusal[1])
            try:
                if step.action == "create":
                    # a record created again (its namespace was deleted and re-created) continues from the
                    # floor; one made before records existed, from the old namespace ledger
                    floor = max(await self.reader.floor(job_id, submission),
                                await self.reader.legacy_floor(job_id, submission))
                    return await self._create_record(ident.new_record(job_id, submission, trainjob, admission=floor))
                assert record is not None
                if step.action == "resume":
                    return record
                obj = await self.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                                  ident.holder_patch(record, trainjob))
                return ident.RecordView.from_obj(obj)
            except Refused as exc:  # created by someone else first: decide again
                if exc.reason != "AlreadyExists":
                    raise
                raise Conflict(str(exc), reason="Conflict", code=409) from exc

        return await k.on_conflict(once, f"the identity record of {job_id}/{submission}")

    async def raise_floor(self, job_id: str, submission: str, admission: int, *, issuing: bool = True) -> None:
        """Make the submission's cluster-scoped floor hold at least ``admission``, before any record holds
        it: the floor outlives the record's namespace, so a record created again never issues an A that
        was issued before. One write on the common path: a merge patch naming the submission and A, which
        the CRD's rules refuse (422) when the floor is already higher or names another submission; only
        then, or when there is no floor yet, is it read or created. ``issuing``: ``admission`` is about to be
        issued, so a floor above it is refused (it was issued before); else (``close`` recording what an object
        carried) a floor above is simply kept. The first A (1) has no floor yet: it is created, one write too."""
        name = ident.floor_name(self.kube.namespace, job_id, submission)
        body = ident.new_floor(self.kube.namespace, job_id, submission, admission)
        # A=1 is issued once per submission, so its floor is yet to be made: created at once (one write, not
        # a patch answered 404 and then a create); one that exists after all takes the patch's path below.
        create_first = issuing and admission == 1

        async def once() -> None:
            nonlocal create_first
            if create_first:
                create_first = False
                try:
                    await self.kube.create(api.SUBMISSION_FLOORS, body)
                    self.on_write("floor")
                    return
                except NotServed:
                    await self.reader.floor_obj(job_id, submission)  # raises the install hint
                    raise
                except Refused as exc:
                    if exc.reason != "AlreadyExists":
                        raise
            try:
                await self.kube.merge_patch(api.SUBMISSION_FLOORS, name, {"spec": body["spec"]})
                self.on_write("floor")
                return
            except NotServed:
                await self.reader.floor_obj(job_id, submission)  # raises the install hint
                raise
            except NotFound:
                pass
            except Refused as exc:
                if exc.code != 422:
                    raise
                # refused by a rule: already higher, or it names another submission (``floor`` refuses that)
                found = await self.reader.floor(job_id, submission)
                if found == admission or (found > admission and not issuing):
                    return
                if found >= ident.ADMISSION_LIMIT:  # raised to the top by hand: only an admin's forget helps
                    raise Refused(d.exhausted_text(job_id, submission, found), reason="RecordInvalid") from exc
                if found > admission:
                    raise Refused(f"the floor of {job_id}/{submission} ({ident.FLOORS.plural}/{name}) says A={found} "
                                  f"was issued before, above the A={admission} its identity record would issue (a "
                                  "record made or restored below it); dispatch never issues a number below the "
                                  "floor: close the object (which lifts the record to it) and open the submission "
                                  "again", reason="RecordInvalid") from exc
                raise
            try:
                await self.kube.create(api.SUBMISSION_FLOORS, body)
                self.on_write("floor")
            except Refused as exc:  # created by someone else first: raise theirs
                if exc.reason != "AlreadyExists":
                    raise
                raise Conflict(str(exc), reason="Conflict", code=409) from exc

        await k.on_conflict(once, f"the floor of {job_id}/{submission}")

    async def unclaim(self, record: ident.RecordView, *, admission: int = 0) -> None:
        """Release a submission's claim (``close``), lifting A to ``admission`` if it is higher; the
        record outlives the object, so a re-opened submission goes on counting."""
        if admission > record.admission:
            await self.raise_floor(record.job_id, record.submission, admission, issuing=False)
        current: ident.RecordView | None = record

        async def once() -> None:
            nonlocal current
            if current is None:
                return
            try:
                await self.kube.merge_patch(api.SUBMISSION_RECORDS, current.name,
                                            ident.holder_patch(current, "", admission=admission))
                return
            except Conflict:
                current = await self.reader.record(record.job_id, record.submission)
            if current is None or current.trainjob != record.trainjob:
                return  # gone, or someone else holds it now
            raise k.kept_changing(record.describe())

        await k.on_conflict(once, record.describe())

    async def close(self, tj: tr.TrainJobView, mine: Iterable[PodView]) -> None:
        """``close``'s record policy, before the object is deleted: the record it holds is released with the
        highest A it (or a pod of it, ``mine``) carried, or the floor's if higher (a record below its floor,
        made or restored by hand, is lifted to it); an object opened before records gets one, so its A is
        kept (``_decision.close_record``)."""
        pods = list(mine)
        record = await self.reader.record(tj.job_id, tj.submission) if tj.labelled else None
        step = d.close_record(tj, record, pods)
        if step is None:
            return
        highest = max(d.carried(tj, pods), await self.reader.floor(tj.job_id, tj.submission))
        if step == "lift":
            assert record is not None
            await self.unclaim(record, admission=highest)
        else:
            await self.unclaim(await self.issue(None, tj, highest, ""))

    async def close_unopened(self, name: str) -> bool:
        """``close`` of a name with no TrainJob: the claims an ``open`` took and never created the TrainJob for
        are released. False if there were none."""
        claims = [r for r in await self.reader.claims_of(name) if not r.trainjob_uid]
        for claim in claims:
            await self.unclaim(claim)
        return bool(claims)

    async def _record_from_floor(self, tj: tr.TrainJobView) -> ident.RecordView | None:
        """The submission's record created at its floor, if it has a floor above 0 (None otherwise: the
        first issue creates it). Someone else creating it first is a Conflict: the caller reads again."""
        floor = await self.reader.floor(tj.job_id, tj.submission)
        if not floor:
            return None
        try:
            return await self._create_record(ident.new_record(tj.job_id, tj.submission, tj.name, admission=floor))
        except Refused as exc:
            if exc.reason != "AlreadyExists":
                raise
            raise Conflict(f"the identity record of {tj.job_id}/{tj.submission} was created meanwhile; retry",
                           reason="Conflict", code=409) from exc

    async def issue(self, record: ident.RecordView | None, tj: tr.TrainJobView, admission: int,
                    token: str, clusters: Collection[str] = ()) -> ident.RecordView:
        """Issue A in the record (creating it for an object that has none and never ran), bound to the
        TrainJob's uid, conditioned on the record's resourceVersion: before any TrainJob carries A."""
        await self.raise_floor(tj.job_id, tj.submission, admission)
        if record is None:
            record = await self._create_record(ident.new_record(tj.job_id, tj.submission, tj.name))
        obj = await self.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                          ident.raise_patch(record, admission, token, tj.name, tj.ref.uid,
                                                                            clusters))
        return ident.RecordView.from_obj(obj)

    # ------------------------------------------------------------------ admitting writes

    async def admission(self, inputs: Inputs, *, token: str, own: Iterable[str], plain: bool) -> Admission:
        """The one admission entry, for the verb and the reconciler: the verdict over ``inputs`` (under
        MultiKueue, the workers it read and what each showed folded in by ``_decision.admission_verdict``)
        and, when nothing of the object may still run, the admission's first writes (``admit``). Nothing is
        written when it is not admissible. A plain release (``plain``) of an object already running, or of one
        a Kueue Workload owns, writes only that Workload's ``active`` flag (``_decision.release_step``). Under
        Kueue, a TrainJob dispatch did not open goes by the rule alone: nothing of it is raised.

        Each caller then does only what differs: the verb unsuspends (or raises ``PodsRemain``), the
        reconciler sets its check Ready (or writes its Pending message). A Conflict: read and decide again."""
        tj = inputs.trainjob
        if plain:
            refusal = d.dispatch_refusal(tj)
            if refusal is not None:
                raise Refused(refusal[0], reason=refusal[1])
            step = d.release_step(tj, inputs.workload)
            if step == "finished":
                raise Refused(d.finished_text(tj, inputs.snapshot.jobset if inputs.lower_read else None),
                              reason=tj.state.value)
            if step in ("running", "kueue"):
                # a hold Kueue has not acted on yet (the Workload deactivated, the job still running): releasing
                # undoes it, or the object would end up held although release said it runs
                if inputs.workload is not None and (step == "kueue" or tj.queue):
                    await self.set_active(inputs.workload, True)
                return Admission(d.Verdict((), ()), handed=step)
        local = inputs.verdict()
        if not local.admissible:
            return Admission(local)
        if not plain and not tj.dispatch_object:
            return Admission(local, Admitted(tj, 0))
        record = inputs.record if inputs.record_read else await self.reader.record(tj.job_id, tj.submission)
        verdict = d.admission_verdict(local, tj, record, inputs.workers, inputs.seen)
        if not verdict.admissible:
            return Admission(verdict)
        admitted = await self.admit(tj, inputs.snapshot, record, token=token, own=own, plain=plain,
                                    clusters=inputs.workers or (),
                                    runtime=(inputs.runtime_jobs,) if inputs.runtime_read else None)
        return Admission(verdict, admitted)

    async def admit(self, tj: tr.TrainJobView, snap: Snapshot, record: ident.RecordView | None, *,
                    token: str, own: Iterable[str], plain: bool, clusters: Collection[str] = (),
                    runtime: tuple[list[str] | None] | None = None) -> Admitted:
        """The admission's first writes, from a read that found nothing of the object still able to run.

        The record must be trustworthy for this object (else Refused, reason RecordInvalid, naming it);
        ``_decision.next_admission`` then says which A this admission carries and which writes it still
        needs: A issued in the record, then raised on the TrainJob, each conditioned on what was read. A
        Conflict means something moved since the read: the caller reads and decides again.
        """
        mine = snap.object_pods(Target.of(tj))
        problem = ("; ".join(tj.problems) if tj.problems else None) or d.record_problem(tj, record, mine)
        if problem:
            raise Refused(problem, reason="RecordInvalid")
        unindexed = d.nonindexed_text(f"trainjob {tj.name} cannot start", d.jobs_nonindexed(snap.jobs, tj.name))
        if unindexed:
            raise Refused(unindexed, reason="NonIndexed")
        if record is None:
            # no record for an object that never ran (its namespace deleted and re-created since the
            # submission ran, and the claim lost): the floor says what was issued before; never count from 1
            record = await self._record_from_floor(tj)
        plan = d.next_admission(tj, mine, record, own=set(own), plain=plain)
        exhausted = d.plan_problem(tj, plan)
        if exhausted:
            raise Refused(exhausted, reason="RecordInvalid")
        # Trainer builds the JobSet from the runtime as it is now: dispatch's entry follows it at every raise
        # (``runtime``: its replicatedJobs as the caller read them with the rest, else read here)
        jobs = runtime[0] if runtime is not None else await self.reader.runtime_jobs_of(tj)
        retarget = jobs is not None and list(tj.patch_targets) != list(jobs)
        if plan.write_record:
            await self.issue(record, tj, plan.admission, token, clusters)
            self.on_write("record")
        raised, started = tj, False
        if plan.write_trainjob or retarget:
            # a re-target alone (the raise was found) keeps the raise's token: a token changes only with A.
            # Plain mode starts in the same write when the pods Trainer builds from every entry will carry A
            # (judged on the entries as the write leaves them, before it); else the verb unsuspends after
            start = plain and self.atomic_start and not d.effective_problem(tr.raised_view(tj, plan.admission, jobs))
            raised, started = await self.raise_trainjob(tj, plan.admission,
                                                        token if plan.write_trainjob else tj.token, jobs=jobs,
                                                        start=start)
            self.on_write("trainjob")
        # dispatch's own writers judge the pods Trainer will build from every entry, as the guard does, so a
        # stale entry of another manager never decides the A the pods carry, with or without the guard (the A
        # is armed and never started: the next admission takes it once the entry is fixed)
        effective = d.effective_problem(raised, kueue=not plain)
        if effective:
            raise Refused(effective, reason="ForeignRuntimePatch")
        return Admitted(raised, plan.admission, started)

    async def raise_trainjob(self, tj: tr.TrainJobView, admission: int, token: str,
                             jobs: list[str] | None = None, *, start: bool = False) -> tuple[tr.TrainJobView, bool]:
        """A on the TrainJob and in dispatch's runtime patch entry, re-targeted at the runtime's replicatedJobs
        ``jobs`` (SSA, conditioned on the RV read), and whether the same write started it (``start``, plain mode).
        A start refused (by Trainer before v2.2.1, or by the guard: pods appeared since the read) is raised alone:
        the unsuspend after it then meets the same judgement it always did."""
        if not tj.dispatch_object:
            raise Refused(f"trainjob {tj.name} has no dispatch runtime patch; it was not opened by dispatch",
                          reason="NotDispatchObject")
        if start:
            try:
                obj = await self.kube.apply(api.TRAINJOBS, tj.name, tr.raise_body(tj, admission, token, jobs,
                                                                                  start=True))
                return tr.TrainJobView.from_obj(obj), True
            except Refused as exc:
                if d.start_refused_by_trainer(exc.message):
                    self.atomic_start = False
        obj = await self.kube.apply(api.TRAINJOBS, tj.name, tr.raise_body(tj, admission, token, jobs))
        return tr.TrainJobView.from_obj(obj), False

    async def unsuspend(self, raised: tr.TrainJobView, admission: int, retries: int = k.CONFLICT_RETRIES) -> bool:
        """The write that starts the execution, conditioned on the TrainJob as the raise left it; a 409
        caused only by a status write is retried on the fresh resourceVersion (``_decision``). False: the
        decision no longer holds and the caller decides afresh."""
        current = raised

        async def once() -> bool:
            nonlocal current
            try:
                await self.kube.merge_patch(api.TRAINJOBS, raised.name, tr.unsuspend_patch(current, admission))
                return True
            except Conflict:
                fresh = await self.reader.trainjob_or_none(raised.name)
            if not d.unsuspend_still_holds(raised, fresh, admission):
                return False
            assert fresh is not None
            current = fresh
            raise k.kept_changing(f"trainjob {raised.name}")

        try:
            return await k.on_conflict(once, f"trainjob {raised.name}", tries=retries)
        except Conflict:
            return False

    async def open(self, body: Obj, name: str, job_id: str, submission: str) -> tr.TrainJobView:
        """``open``'s writes: the submission claimed for ``name`` (only one open can win it), then the TrainJob
        created, suspended; a create that cannot be made (no Trainer, the name taken) releases the claim."""
        record = await self.claim(job_id, submission, name)
        try:
            return tr.TrainJobView.from_obj(await self.create_trainjob(body))
        except NotFound:
            await self.unclaim(record)
            raise
        except Refused as exc:
            if exc.reason == "AlreadyExists":
                await self.unclaim(record)
            raise

    async def create_trainjob(self, body: Obj, *, dry_run: bool = False) -> Obj:
        """``open``'s create of the TrainJob (suspended, after its submission was claimed), or its dry run; a kind
        not served and a name taken are named."""
        try:
            return await self.kube.create(api.TRAINJOBS, body, dry_run=dry_run)
        except NotFound as exc:
            raise NotFound(TRAINER_MISSING, reason=exc.reason, code=exc.code) from exc
        except Refused as exc:
            if exc.reason == "AlreadyExists":
                raise Refused(f"trainjob {name_of(body)} already exists in namespace {self.kube.namespace}; "
                              "choose another name or submission", reason="AlreadyExists", code=exc.code) from exc
            raise

    async def delete_trainjob(self, name: str) -> None:
        """``close``'s delete, after its record policy; its lower layers go in the background."""
        await self.kube.delete(api.TRAINJOBS, name, propagation="Background")

    async def suspend(self, tj: tr.TrainJobView) -> None:
        await self.kube.merge_patch(api.TRAINJOBS, tj.name, tr.suspend_patch())

    async def set_active(self, workload: kq.WorkloadView, active: bool) -> None:
        if workload.active != active:
            await self.kube.merge_patch(api.WORKLOADS, workload.ref.name, kq.active_patch(active))

    async def write_check(self, workload: kq.Addressed, entry: dict[str, object], *, field_manager: str,
                          admitted: Admitted | None = None, tries: int = k.CONFLICT_RETRIES) -> str | None:
        """SSA our one entry of ``status.admissionChecks``, conditioned on the Workload's resourceVersion.

        Kueue writes the same Workloads often. The Ready write of an admission (``admitted``: its raise), after a 409,
        is written again on the fresh Workload while the decision still holds (``_decision.ready_conflict``), else
        the reason it does not is returned ("gone" for a Workload gone); None once written. Any other entry (a
        Pending message) is written again on the fresh Workload while what it was decided from is unchanged
        (``_decision.check_conflict``), else its 409 is raised: its caller decides afresh."""
        current = workload
        check = str(entry["name"])
        refused: list[Conflict] = []

        async def once() -> str | None:
            nonlocal current
            try:
                await self.kube.apply(api.WORKLOADS, workload.ref.name, kq.check_status_body(current, entry),
                                      workload.ref.namespace, sub="status", field_manager=field_manager, force=True,
                                      answer=False)
                self.on_write("workload")
                return None
            except Conflict as exc:
                refused.append(exc)
                fresh = await self.reader.workload_or_none(workload.ref.name)
                live = await self.reader.trainjob_or_none(admitted.trainjob.name) if admitted is not None else None
            if admitted is not None:
                why = d.ready_conflict(fresh, check, live, admitted.trainjob, admitted.admission,
                                       admitted.trainjob.dispatch_object)
            else:
                why = d.check_conflict(workload.entry([check]), workload.ref.uid, _owner_uid(workload), fresh)
            if why:
                return why
            assert fresh is not None
            current = fresh
            raise k.kept_changing(f"workload {workload.ref.namespace}/{workload.ref.name}")

        why = await k.on_conflict(once, f"workload {workload.ref.namespace}/{workload.ref.name}", tries=tries)
        if why and admitted is None:
            raise refused[-1]
        return why


def _owner_uid(workload: kq.Addressed) -> str:
    if isinstance(workload, kq.WorkloadHint):
        return workload.owner_uid
    return workload.owner.uid if workload.owner is not None else ""


# --------------------------------------------------------------------------- dispatch's pod finalizer
# Not part of admitting: the controller's finalizer keeper and ``admin release-pod`` write them, each conditioned
# on the pod as read.


async def free(kube: Kube, pods: Iterable[PodView], nodes: Mapping[str, NodeView]) -> list[str]:
    """Remove dispatch's finalizer from every pod whose end is proven (``_decision.releasable``);
    returns the names freed. A pod that changed since it was read keeps its finalizer until the next
    pass (or the controller) looks again; one this caller may not patch is left to the controller."""
    proven = d.releasable(pods, nodes)
    done = await asyncio.gather(*(remove_finalizer(kube, p) for p in proven))
    return [p.name for p, ok in zip(proven, done, strict=True) if ok]

async def delete_pod(kube: Kube, pod: PodView, *, grace_seconds: int | None = None) -> bool:
    """Delete a pod as read (conditioned on its uid and resourceVersion). The controller deletes a pod
    its kubelet rejected, so that the kubelet tears it down and writes every container's end (which
    proves it; dispatch's finalizer keeps the object until then); ``admin release-pod`` deletes a
    pod whose end the operator vouched for that nothing else deletes (a Job keeps failed pods).
    False if the pod changed or is gone."""
    try:
        await kube.delete(api.PODS, pod.name, pod.namespace or None, grace_seconds=grace_seconds,
                               uid=pod.uid, resource_version=pod.resource_version)
    except (NotFound, Conflict):
        return False
    return True

async def remove_finalizer(kube: Kube, pod: PodView, *, forbidden_ok: bool = True) -> bool:
    """Drop dispatch's finalizer from ``pod`` as read: a merge patch of the finalizers list conditioned
    on the resourceVersion read, so a concurrent change (another finalizer added or removed, a new
    status) is never overwritten. False if the pod changed (409), is gone, or (``forbidden_ok``)
    this caller lacks ``patch`` on pods."""
    if POD_FINALIZER not in pod.finalizers:
        return False
    patch = {"metadata": {"resourceVersion": pod.resource_version,
                          "finalizers": [f for f in pod.finalizers if f != POD_FINALIZER]}}
    try:
        await kube.merge_patch(api.PODS, pod.name, patch, pod.namespace or None)
    except (NotFound, Conflict):
        return False
    except Forbidden:
        if forbidden_ok:
            return False
        raise
    return True

async def record_mark(kube: Kube, pod: PodView) -> bool:
    """Record on ``pod`` that dispatch saw it marked terminal by someone other than its kubelet
    (``MarkSeen``): the resourceVersion read and the kubelet's fingerprint at it, in one merge patch
    conditioned on that resourceVersion, so the record describes exactly the version it names. False if
    the pod changed meanwhile (409) or is gone: read it again."""
    seen = MarkSeen(parse_count(pod.resource_version) or 0, pod.kubelet_fingerprint)
    patch = {"metadata": {"resourceVersion": pod.resource_version,
                          "annotations": {ANNOTATION_MARK_SEEN: seen.text()}}}
    try:
        await kube.merge_patch(api.PODS, pod.name, patch, pod.namespace or None)
    except (NotFound, Conflict):
        return False
    return True


class Cores:
    """One ``Core`` per namespace, made on first use: the controller's parts (reconciler, guard, finalizer
    keeper) each serve every namespace through one API client."""

    def __init__(self, kube: Kube, *, on_write: Callable[[str], None] = lambda _kind: None) -> None:
        self._kube = kube
        self._on_write = on_write
        self._made: dict[str, Core] = {}

    def __call__(self, namespace: str) -> Core:
        found = self._made.get(namespace)
        if found is None:
            found = self._made[namespace] = Core(self._kube.in_namespace(namespace), on_write=self._on_write)
        return found
