"""Label keys, API coordinates and input validation.

Validation runs before any request, so bad input is refused with the field named and nothing written.
"""

from __future__ import annotations

import re

from .errors import FieldCause, InvalidInput

DOMAIN = "dispatch.phpboyscout.uk"
LABEL_JOB_ID = f"{DOMAIN}/job-id"
"""On the TrainJob and every pod: the logical job. With the submission, one of the rule's two selections."""
LABEL_SUBMISSION = f"{DOMAIN}/submission"
"""On the TrainJob and every pod: the submission, so each submission's pods are found by label."""
LABEL_ADMISSION = f"{DOMAIN}/admission"
"""On every pod: the A of the execution it belongs to, so a process (and the next A) can tell."""
ANNOTATION_ADMISSION = f"{DOMAIN}/admission"
"""On the TrainJob: its current A (0 before the first admission)."""
ANNOTATION_TOKEN = f"{DOMAIN}/admission-token"
"""Written with each raise of A: a retry of the same admission finds its own raise and reuses A."""
ANNOTATION_MARK_SEEN = f"{DOMAIN}/mark-seen"
"""On a pod someone other than its kubelet marked terminal: ``<resourceVersion>/<fingerprint>``, the pod's
resourceVersion when dispatch first read it with that mark and a digest of what only its kubelet writes
at that version; a later kubelet write is one that changed the digest (``_views.MarkSeen``)."""
ANNOTATION_STARTED = f"{DOMAIN}/started"
"""The highest A that dispatch's own unsuspend started: an A raised but never started may be reused."""
PATCH_MANAGER = f"{DOMAIN}/dispatch"
"""The ``manager`` of dispatch's own entry in a TrainJob's ``spec.runtimePatches``."""
FIELD_MANAGER = "dispatch"
CONTROLLER_NAME = f"{DOMAIN}/admission"
"""The ``spec.controllerName`` of the Kueue AdmissionChecks dispatch's controller owns."""

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
"""JobSet's label on a Job and its pods: the replicatedJob it was built from."""
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
"""JobSet's label on a Job and its pods: which of the replicatedJob's replicas the Job is."""
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The Job controller's label (and annotation) on a pod of an Indexed Job (JobSet's default): its index.
With the two above, the rank a pod runs: a replacement of a pod carries the same three."""
POD_KEPT_LABELS = (
    LABEL_JOB_ID, LABEL_SUBMISSION, LABEL_ADMISSION,
    JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, JOB_INDEX_LABEL,
    "batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "controller-uid", "job-name",
)
"""The labels that say whose a dispatch pod is (dispatch's identity and A; JobSet's and the Job
controller's selections): the pod policy keeps them as they were created (``deploy/base/guard.yaml``,
``dispatch-pods``), so no writer can hide a pod that may run from the rule's two selections."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"
"""``spec.managedBy`` of a TrainJob MultiKueue dispatches to a worker (and its admission check's controller)."""
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
"""MultiKueue's label on the objects it creates in a worker (the copy of a manager's TrainJob, its Workload)."""
PREBUILT_WORKLOAD_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
"""The Workload a MultiKueue copy is admitted through, in its worker (a label, or an annotation of that key)."""
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _syntax_problem(value: str, limit: int, pattern: re.Pattern[str], rule: str) -> str | None:
    """Too long, then not of the pattern: the API server's order and words."""
    if len(value) > limit:
        return f"must be at most {limit} characters (got {len(value)})"
    return None if pattern.match(value) else rule


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid Kubernetes label value, or None if it is."""
    return _syntax_problem(value, 63, _LABEL_VALUE, "must be empty or consist of alphanumerics, '-', '_' or '.', "
                           "and start and end with an alphanumeric")


def dns1035_problem(value: str) -> str | None:
    """Why ``value`` is not an RFC 1035 label (TrainJob names must be), or None."""
    if not value:
        return "must not be empty"
    return _syntax_problem(value, 63, _DNS1035, "must consist of lower case alphanumerics or '-', start with a "
                           "letter and end with an alphanumeric")


def dns1123_subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS-1123 subdomain (namespaces, runtime names), or None."""
    if not value:
        return "must not be empty"
    return _syntax_problem(value, 253, _DNS1123_SUBDOMAIN, "must consist of lower case alphanumerics, '-' or '.', "
                           "and start and end with an alphanumeric")


def derive_name(job_id: str, submission: str) -> str:
    """The TrainJob name of a submission: ``<job-id>-<submission>``."""
    return f"{job_id}-{submission}"


def check(problems: list[FieldCause]) -> None:
    """Raise one InvalidInput naming every bad field, if there are any."""
    if problems:
        fields = ", ".join(p.field for p in problems)
        raise InvalidInput(f"invalid input: {fields}", reason="Invalid", causes=problems)


def validate_ref(name: str) -> None:
    """A TrainJob name given to release/hold/inspect/... must be a DNS-1035 label."""
    problem = dns1035_problem(name)
    if problem:
        check([FieldCause("name", f"{name!r} {problem}", "FieldValueInvalid")])
