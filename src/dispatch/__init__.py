"""dispatch: run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Nothing re-admits an object while any pod of it may still run. ``Adapter`` (sync) and ``AsyncAdapter``
open, release, hold, inspect, find, close and wait on TrainJobs; ``ceased`` proves cessation. Errors
form one tree rooted at ``DispatchError`` (see ``dispatch.errors``). ``dispatch.testing`` holds an
in-process fake Kubernetes API for tests.
"""

from ._adapter import Adapter, AsyncAdapter, validate_spec
from ._enrol import ENROL_LABEL
from ._names import (
    ANNOTATION_ADMISSION,
    CONTROLLER_NAME,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    PATCH_MANAGER,
)
from ._records import Cause, Cessation, Identity, JobSpec, PodEnd, RemainingPod, State, Status
from ._views import POD_FINALIZER
from .errors import (
    DispatchError,
    FieldCause,
    Forbidden,
    InvalidInput,
    NotFound,
    PodsRemain,
    ReadOnly,
    Refused,
    Unreachable,
)

# The one source of the version: the package metadata (pyproject.toml), `dispatch --version`, the
# controller's dispatch_build_info gauge and the image label all read it.
__version__ = "0.1.0"

__all__ = [
    "ANNOTATION_ADMISSION",
    "CONTROLLER_NAME",
    "ENROL_LABEL",
    "LABEL_ADMISSION",
    "LABEL_JOB_ID",
    "LABEL_SUBMISSION",
    "PATCH_MANAGER",
    "POD_FINALIZER",
    "Adapter",
    "AsyncAdapter",
    "Cause",
    "Cessation",
    "DispatchError",
    "FieldCause",
    "Forbidden",
    "Identity",
    "InvalidInput",
    "JobSpec",
    "NotFound",
    "PodEnd",
    "PodsRemain",
    "ReadOnly",
    "Refused",
    "RemainingPod",
    "State",
    "Status",
    "Unreachable",
    "__version__",
    "validate_spec",
]
