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
from ._records import (
    Cause,
    Cessation,
    Identity,
    JobSpec,
    PodEnd,
    RemainingPod,
    State,
    Status,
    Toleration,
    Volume,
    Worker,
)
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
from .fence import Checkpoint, Fence, Fenced, FenceIdentity, PosixStore, S3Store

if TYPE_CHECKING:
    from ._adapter import Adapter, AsyncAdapter, validate_spec
    from .fencefs import FencedFileSystem

_LAZY = frozenset({"Adapter", "AsyncAdapter", "validate_spec"})
"""Imported on first use: they pull in the HTTP client and asyncio (about a second), which a training
process that only fences its checkpoints (``dispatch.fence``) must not pay for."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from . import _adapter

        return getattr(_adapter, name)
    if name == "FencedFileSystem":  # needs fsspec (the `fsspec` extra), which only its users install
        from .fencefs import FencedFileSystem

        return FencedFileSystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The one source of the version: the package metadata (pyproject.toml), `dispatch --version`, the
# controller's dispatch_build_info gauge and the image label all read it.
__version__ = "0.1.0"

# In the order the API reference shows them (``members_order: __all__``): the adapter and what it takes
# and returns first, then the errors, the fence, and the constants.
__all__ = [  # noqa: RUF022
    "Adapter",
    "AsyncAdapter",
    "JobSpec",
    "Volume",
    "Toleration",
    "Status",
    "State",
    "Cause",
    "Identity",
    "RemainingPod",
    "Cessation",
    "PodEnd",
    "Worker",
    "validate_spec",
    "DispatchError",
    "Unreachable",
    "PodsRemain",
    "Conflict",
    "Refused",
    "InvalidInput",
    "Forbidden",
    "NotFound",
    "NotServed",
    "ReadOnly",
    "FieldCause",
    "Fence",
    "Fenced",
    "Checkpoint",
    "FenceIdentity",
    "FencedFileSystem",
    "PosixStore",
    "S3Store",
    "LABEL_JOB_ID",
    "LABEL_SUBMISSION",
    "LABEL_ADMISSION",
    "ANNOTATION_ADMISSION",
    "ENROL_LABEL",
    "PATCH_MANAGER",
    "POD_FINALIZER",
    "CONTROLLER_NAME",
    "__version__",
]
