"""dispatch: run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Nothing re-admits an object while any pod of it may still run. ``Adapter`` (sync) and ``AsyncAdapter``
open, release, hold, inspect, find, close and wait on TrainJobs; ``ceased`` proves cessation. Errors
form one tree rooted at ``DispatchError`` (see ``dispatch.errors``). ``dispatch.testing`` holds an
in-process fake Kubernetes API for tests. ``Fence`` (``dispatch.fence``) fences a training process's
checkpoints on its execution's A.
"""

from typing import TYPE_CHECKING

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
    Conflict,
    DispatchError,
    FieldCause,
    Forbidden,
    InvalidInput,
    NotFound,
    NotServed,
    PodsRemain,
    ReadOnly,
    Refused,
    Unreachable,
)
from .fence import Checkpoint, Fence, Fenced, PosixStore, S3Store

if TYPE_CHECKING:
    from ._adapter import Adapter, AsyncAdapter, validate_spec

_LAZY = frozenset({"Adapter", "AsyncAdapter", "validate_spec"})
"""Imported on first use: they pull in the HTTP client and asyncio (about a second), which a training
process that only fences its checkpoints (``dispatch.fence``) must not pay for."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from . import _adapter

        return getattr(_adapter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "Checkpoint",
    "Conflict",
    "DispatchError",
    "Fence",
    "Fenced",
    "FieldCause",
    "Forbidden",
    "Identity",
    "InvalidInput",
    "JobSpec",
    "NotFound",
    "NotServed",
    "PodEnd",
    "PodsRemain",
    "PosixStore",
    "ReadOnly",
    "Refused",
    "RemainingPod",
    "S3Store",
    "State",
    "Status",
    "Unreachable",
    "__version__",
    "validate_spec",
]
