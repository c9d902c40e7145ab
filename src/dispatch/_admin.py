"""An admin's writes on identity: forgetting a submission (its record and floor), making records forget a
MultiKueue worker removed from the manager, and migrating the old namespace ledger into records. None is part
of admitting, so they live beside the core, not in it; all need the ``dispatch-admin`` role."""

from __future__ import annotations

import contextlib

from . import _api as api
from . import _decision as d
from . import _identity as ident
from . import _kube as k
from ._core import Core
from ._read import by_identity
from ._views import parse_count
from .errors import Conflict, NotFound, Refused


async def forget(core: Core, job_id: str, submission: str) -> ident.RecordView | None:
    """Delete a submission's record and its floor (an admin's decision: the submission then counts from 1
    again; the one deletion that may, unlike its namespace's). Refused while a TrainJob holds it."""
    record = await core.reader.record(job_id, submission)
    if record is None:
        # its namespace was deleted and re-created: only the floor remembers the submission
        return None if not await forget_floor(core, job_id, submission) else ident.RecordView.from_obj(
            ident.new_record(job_id, submission, ""))
    holder = await core.reader.trainjob_or_none(record.trainjob) if record.trainjob else None
    if holder is not None:
        raise Refused(f"submission {job_id}/{submission} is held by trainjob {holder.name}; close it first",
                      reason="InUse")
    await core.kube.delete(api.SUBMISSION_RECORDS, record.name, uid=record.ref.uid or None)
    await forget_floor(core, job_id, submission)
    return record

async def forget_floor(core: Core, job_id: str, submission: str) -> bool:
    """Delete the submission's floor (``admin forget``), also one whose record went with its namespace."""
    try:
        await core.kube.delete(api.SUBMISSION_FLOORS, ident.floor_name(core.kube.namespace, job_id, submission))
    except NotFound:
        return False
    return True

async def migrate(core: Core) -> tuple[int, int]:
    """Fold the old namespace ledger and every dispatch TrainJob's A into identity records, then delete
    the ledger. Returns (records created, records raised). Safe to run again; never lowers a record."""
    wanted: dict[tuple[str, str], tuple[int, str]] = {}
    ledger = await core.kube.get_or_none(api.CONFIGMAPS, ident.LEGACY_LEDGER)
    data = ledger.get("data") if ledger is not None else None
    for key, value in (data.items() if isinstance(data, dict) else []):
        pair = ident.parse_legacy_key(str(key))
        count = parse_count(value)
        if pair is None or count is None:
            raise Refused(f"the old ledger {ident.LEGACY_LEDGER} has an entry {str(key)[:60]!r}="
                          f"{str(value)[:20]!r} that does not parse; fix or remove it, then migrate again",
                          reason="RecordInvalid")
        wanted[pair] = (max(count, wanted.get(pair, (0, ""))[0]), "")
    for tj in await core.reader.trainjobs(by_identity(None)):
        if tj.labelled:
            best = max(tj.admission, tj.patch_admission, wanted.get((tj.job_id, tj.submission), (0, ""))[0])
            wanted[(tj.job_id, tj.submission)] = (best, tj.name)
    created = raised = 0
    for (job_id, submission), (admission, holder) in sorted(wanted.items()):
        admission = max(admission, await core.reader.floor(job_id, submission))
        await core.raise_floor(job_id, submission, admission)
        record = await core.reader.record(job_id, submission)
        if record is None:
            await core._create_record(ident.new_record(job_id, submission, holder, admission=admission))
            created += 1
        elif record.admission < admission:
            await core.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                        {"metadata": {"resourceVersion": record.ref.resource_version},
                                         "spec": {"admission": admission}})
            raised += 1
    if ledger is not None:
        await core.kube.delete(api.CONFIGMAPS, ident.LEGACY_LEDGER)
    return created, raised


async def forget_worker(core: Core, worker: str) -> tuple[list[str], list[str]]:
    """Every identity record (in every namespace) that remembers MultiKueue worker ``worker``, which no
    MultiKueueCluster names any more, forgets it: the operator's word that the worker, removed from the manager,
    runs none of the previous executions' pods. The CRD lets a record forget a worker only together with a raise
    of A, so each is raised by one (the floor first, as every issue); the TrainJob it names gets a fresh A at its
    next admission. An object raised for a start Kueue is about to make (``_decision.armed_for_start``) is left as
    it is: raising under it would make the guard refuse that start for good. Returns (``namespace/job-id/
    submission`` forgotten, ``namespace/trainjob`` left armed)."""
    forgotten: list[str] = []
    armed: list[str] = []
    listed = await core.kube.list(api.SUBMISSION_RECORDS, all_namespaces=True)
    for obj in listed.items:
        record = ident.RecordView.from_obj(obj)
        if worker not in record.clusters or not record.ref.namespace:
            continue
        here = Core(core.kube.in_namespace(record.ref.namespace))

        async def once(here: Core = here) -> None:
            nonlocal record
            holder = await here.reader.trainjob_or_none(record.trainjob) if record.trainjob else None
            if holder is not None and holder.ref.uid == record.trainjob_uid and d.armed_for_start(holder, record):
                armed.append(f"{record.ref.namespace}/{holder.name}")
                return
            admission = max(record.admission, await here.reader.floor(record.job_id, record.submission)) + 1
            await here.raise_floor(record.job_id, record.submission, admission)
            try:
                await here.kube.merge_patch(api.SUBMISSION_RECORDS, record.name,
                                            ident.forget_cluster_patch(record, worker, admission))
            except Conflict:  # changed meanwhile (an admission): read it again
                fresh = await here.reader.record(record.job_id, record.submission)
                if fresh is None or worker not in fresh.clusters:
                    return
                record = fresh
                raise
            forgotten.append(f"{record.ref.namespace}/{record.job_id}/{record.submission}")

        with contextlib.suppress(Conflict):  # still changing: it is neither forgotten nor armed
            await k.on_conflict(once, record.describe(), tries=3)
    return forgotten, armed
