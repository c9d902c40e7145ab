"""The names dispatch writes into the cluster, pinned to their literal values.

Every other test uses the exported constants; this one is the contract that they never change: each is
on objects that already exist (labels on running pods, annotations on TrainJobs, the finalizer on pods,
the runtime-patch manager, the AdmissionCheck's controllerName, the enrolment label on namespaces).
Renaming one would strand every object written before the upgrade.
"""

from __future__ import annotations

import dispatch
from dispatch import _names as n

WIRE = {
    "LABEL_JOB_ID": "dispatch.phpboyscout.uk/job-id",
    "LABEL_SUBMISSION": "dispatch.phpboyscout.uk/submission",
    "LABEL_ADMISSION": "dispatch.phpboyscout.uk/admission",
    "ANNOTATION_ADMISSION": "dispatch.phpboyscout.uk/admission",
    "PATCH_MANAGER": "dispatch.phpboyscout.uk/dispatch",
    "CONTROLLER_NAME": "dispatch.phpboyscout.uk/admission",
    "POD_FINALIZER": "dispatch.phpboyscout.uk/execution",
    "ENROL_LABEL": "dispatch.phpboyscout.uk/enrol",
}
INTERNAL = {
    "ANNOTATION_TOKEN": "dispatch.phpboyscout.uk/admission-token",
    "ANNOTATION_STARTED": "dispatch.phpboyscout.uk/started",
    "FIELD_MANAGER": "dispatch",
}


def test_every_exported_wire_name_keeps_its_value() -> None:
    assert {name: getattr(dispatch, name) for name in WIRE} == WIRE
    assert set(WIRE) <= set(dispatch.__all__)


def test_the_names_only_the_library_reads_keep_theirs() -> None:
    assert {name: getattr(n, name) for name in INTERNAL} == INTERNAL
