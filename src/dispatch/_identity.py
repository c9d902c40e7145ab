"""The identity record: one small object of dispatch's own kind per submission.

A ``SubmissionRecord`` (``submissionrecords.dispatch.phpboyscout.uk``) remembers, for one (job-id,
submission) of a namespace, the highest admission number A ever issued, the token of the raise that
issued it, and which TrainJob currently holds the submission. Why this shape:

* **one object per submission**, named by a hash of (job-id, submission): a release reads and writes
  only its own record, so its cost does not grow with the namespace's history and there is no hot
  object (the old namespace ConfigMap ``dispatch-admissions`` was both, and filled at ~11,000 entries);
* **its create is the claim**: only one caller can create a name, so two opens of one submission
  under two TrainJob names cannot both win;
* **a kind of its own**, so RBAC can give writers create/patch without delete, and the CRD's
  validation rules (enforced by the API server for every writer) forbid lowering A or changing the
  submission it names. Only an admin's ``dispatch admin forget`` (delete) makes a submission forget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from . import _api as api
from ._api import Obj
from ._names import DOMAIN, LABEL_JOB_ID, LABEL_SUBMISSION
from ._views import Ref, mapping, parse_count, text

RECORDS = api.SUBMISSION_RECORDS
FLOORS = api.SUBMISSION_FLOORS
LEGACY_LEDGER = "dispatch-admissions"
"""The namespace ConfigMap that recorded A before records existed; ``dispatch admin migrate`` folds it in."""
TOKEN_LIMIT = 128
CLUSTERS_LIMIT = 64
"""MultiKueue workers a record remembers (a fleet is a handful; the bound keeps the record small)."""
NAME_LIMIT = 253
ADMISSION_LIMIT = 2**53 - 1
"""The highest A dispatch issues, and the CRDs' ``maximum`` of a record's and a floor's A: the largest integer a
JSON number keeps exactly in every client, and the API server's schema (whose ``maximum`` is a float64) holds it
exactly too (a bound of 18 nines reads there as 1e18 and lets 10**18 through). Far above any real A (a release a
millisecond for 285,000 years); a floor raised to it by hand stalls its submission with a status naming the way
out (``admin forget``) instead of overflowing int64."""
LABEL_HOLDER = f"{DOMAIN}/trainjob"
"""On a record: the TrainJob that holds the submission, so ``close NAME`` finds a claim whose TrainJob was
never created."""


def record_name(job_id: str, submission: str) -> str:
    """The record's name: a hash of the pair, so any two label values give a valid, distinct name."""
    digest = hashlib.sha256(f"{job_id}\x00{submission}".encode()).hexdigest()
    return f"sub-{digest[:40]}"


def floor_name(namespace: str, job_id: str, submission: str) -> str:
    """The floor's name: the namespace it names, a dot and its record's name (floors are cluster-scoped).
    The namespace is spelled out so the CRD's rule can hold a floor's name to the namespace its spec names,
    and the ``dispatch-floors`` policy then lets only that namespace's writers take it."""
    return f"{namespace}.{record_name(job_id, submission)}"


def legacy_key(job_id: str, submission: str) -> str:
    """The old ledger's key of a submission (kept to migrate it)."""
    return f"{len(job_id)}.{job_id}.{submission}"


def parse_legacy_key(key: str) -> tuple[str, str] | None:
    """(job-id, submission) of an old ledger key ``<len>.<job-id>.<submission>``, or None."""
    head, _, rest = key.partition(".")
    size = parse_count(head)
    if size is None or len(rest) < size + 2 or rest[size] != ".":
        return None
    return rest[:size], rest[size + 1:]


@dataclass(frozen=True)
class RecordView:
    """A submission's identity record, parsed strictly."""

    ref: Ref
    job_id: str
    submission: str
    admission: int
    token: str
    trainjob: str
    """The TrainJob that holds the submission now ("" once it was closed)."""
    trainjob_uid: str
    """Its uid once a release bound it ("" until then)."""
    problems: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    """The MultiKueue workers the latest execution may have run in (empty outside MultiKueue)."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> RecordView:
        spec = mapping(obj.get("spec"))
        holder = mapping(spec.get("trainJob"))
        problems = []
        admission = parse_count(spec.get("admission"))
        if admission is None:
            problems.append(f"spec.admission is {str(spec.get('admission'))[:40]!r}, not a count")
        clusters = spec.get("clusters", [])
        if not isinstance(clusters, list) or len(clusters) > CLUSTERS_LIMIT or not all(
                isinstance(c, str) and 0 < len(c) <= NAME_LIMIT for c in clusters):
            problems.append(f"spec.clusters is {str(clusters)[:60]!r}, not a list of at most {CLUSTERS_LIMIT} "
                            "cluster names")
            clusters = []
        return RecordView(
            ref=Ref.of(obj), job_id=text(spec.get("jobId")), submission=text(spec.get("submission")),
            admission=admission or 0, token=text(spec.get("token"))[:TOKEN_LIMIT],
            trainjob=text(holder.get("name")), trainjob_uid=text(holder.get("uid")), problems=tuple(problems),
            clusters=tuple(sorted(set(clusters))),
        )

    @property
    def name(self) -> str:
        return self.ref.name

    def describe(self) -> str:
        return f"identity record {RECORDS.plural}/{self.name}"


def describe_missing(job_id: str, submission: str) -> str:
    return f"identity record {RECORDS.plural}/{record_name(job_id, submission)}"


def new_record(job_id: str, submission: str, trainjob: str, *, admission: int = 0) -> Obj:
    """The claim of a submission: created once, by whichever caller wins."""
    return {
        "apiVersion": RECORDS.api_version,
        "kind": RECORDS.kind,
        "metadata": {
            "name": record_name(job_id, submission),
            "labels": {LABEL_JOB_ID: job_id, LABEL_SUBMISSION: submission, LABEL_HOLDER: trainjob,
                       "app.kubernetes.io/managed-by": "dispatch"},
        },
        "spec": {"jobId": job_id, "submission": submission, "admission": admission, "token": "",
                 "trainJob": {"name": trainjob, "uid": ""}},
    }


def raise_patch(record: RecordView, admission: int, token: str, trainjob: str, uid: str,
                clusters: Collection[str] = ()) -> Obj:
    """A issued to ``trainjob``, conditioned on the record's resourceVersion (a concurrent issue is a 409).
    ``clusters``: the MultiKueue workers this execution may run in, remembered for the next admission
    (Kueue forgets where an evicted Workload ran)."""
    spec: Obj = {"admission": admission, "token": token[:TOKEN_LIMIT], "trainJob": {"name": trainjob, "uid": uid}}
    if clusters or record.clusters:
        spec["clusters"] = sorted(set(clusters))
    return {"metadata": {"resourceVersion": record.ref.resource_version, "labels": {LABEL_HOLDER: trainjob}},
            "spec": spec}


def forget_cluster_patch(record: RecordView, worker: str, admission: int) -> Obj:
    """The record forgets MultiKueue worker ``worker`` (an operator confirmed it removed and gone), together with
    the raise of A to ``admission`` the CRD asks for (a record forgets a worker only so), conditioned on the
    resourceVersion. The TrainJob it names stays bound: A is issued to it again at its next admission."""
    return {"metadata": {"resourceVersion": record.ref.resource_version},
            "spec": {"admission": admission, "clusters": sorted(set(record.clusters) - {worker})}}


def holder_patch(record: RecordView, trainjob: str, *, admission: int | None = None) -> Obj:
    """Hand the submission to ``trainjob`` ("" releases it), conditioned on the resourceVersion."""
    spec: Obj = {"trainJob": {"name": trainjob, "uid": ""}}
    if admission is not None and admission > record.admission:
        spec["admission"] = admission
    return {"metadata": {"resourceVersion": record.ref.resource_version, "labels": {LABEL_HOLDER: trainjob}},
            "spec": spec}


# ---------------------------------------------------------------------- the floor
#
# A record is namespaced and goes with its namespace. Its SubmissionFloor is cluster-scoped and outlives it:
# every A is written to the floor before the record issues it, so a record created again (after its
# namespace was deleted and re-created) continues from the floor. Only ``admin forget`` deletes a floor.


def floor_admission(obj: Mapping[str, Any] | None, namespace: str, job_id: str, submission: str) -> int:
    """The A a floor holds for the submission (0 without a floor). A floor that names another submission
    (a hash collision or a hand-made object) or holds no count is refused, never read as 0."""
    if obj is None:
        return 0
    spec = mapping(obj.get("spec"))
    name = text(mapping(obj.get("metadata")).get("name"))
    if (text(spec.get("namespace")), text(spec.get("jobId")), text(spec.get("submission"))) != (
            namespace, job_id, submission):
        raise ValueError(f"{FLOORS.plural}/{name} names {spec.get('namespace')!r}/{spec.get('jobId')!r}/"
                         f"{spec.get('submission')!r}, not {namespace}/{job_id}/{submission}")
    admission = parse_count(spec.get("admission"))
    if admission is None:
        raise ValueError(f"{FLOORS.plural}/{name} has spec.admission {str(spec.get('admission'))[:40]!r}, "
                         "not a count")
    return admission


def new_floor(namespace: str, job_id: str, submission: str, admission: int) -> Obj:
    return {
        "apiVersion": FLOORS.api_version,
        "kind": FLOORS.kind,
        "metadata": {
            "name": floor_name(namespace, job_id, submission),
            "labels": {LABEL_JOB_ID: job_id, LABEL_SUBMISSION: submission,
                       "app.kubernetes.io/managed-by": "dispatch"},
        },
        "spec": {"namespace": namespace, "jobId": job_id, "submission": submission, "admission": admission},
    }
