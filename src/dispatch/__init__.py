"""dispatch: run Kubeflow Trainer v2 TrainJobs so that one object never has two executions at once.

Nothing re-admits an object while any pod of it may still run. ``Adapter`` (sync) and ``AsyncAdapter``
open, release, hold, inspect, find, close and wait on TrainJobs; ``ceased`` proves cessation. Errors
form one tree rooted at ``DispatchError`` (see ``dispatch.errors``). ``dispatch.testing`` holds an
in-process fake Kubernetes API for tests. ``Fence`` (``dispatch.fence``) fences a training process's
checkpoints on its execution's A.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._adapter import Adapter, AsyncAdapter
    from ._enrol import ENROL_LABEL
    from ._names import (
        ANNOTATION_ADMISSION,
        CONTROLLER_NAME,
        LABEL_ADMISSION,
        LABEL_JOB_ID,
        LABEL_SUBMISSION,
        PATCH_MANAGER,
    )
    from ._overrides import ConfigOverrides
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
    from ._validate import validate_spec
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
    from .fencefs import FencedFileSystem

_LAZY = {
    "._adapter": ("Adapter", "AsyncAdapter"),
    "._enrol": ("ENROL_LABEL",),
    "._overrides": ("ConfigOverrides",),
    "._names": ("ANNOTATION_ADMISSION", "CONTROLLER_NAME", "LABEL_ADMISSION", "LABEL_JOB_ID", "LABEL_SUBMISSION",
                "PATCH_MANAGER"),
    "._records": ("Cause", "Cessation", "Identity", "JobSpec", "PodEnd", "RemainingPod", "State", "Status",
                  "Toleration", "Volume", "Worker"),
    "._validate": ("validate_spec",),
    "._views": ("POD_FINALIZER",),
    ".errors": ("Conflict", "DispatchError", "FieldCause", "Forbidden", "InvalidInput", "NotFound", "NotServed",
                "PodsRemain", "ReadOnly", "Refused", "Unreachable"),
    ".fence": ("Checkpoint", "Fence", "Fenced", "FenceIdentity", "PosixStore", "S3Store"),
    ".fencefs": ("FencedFileSystem",),  # needs fsspec (the `fsspec` extra), which only its users install
}
"""Every public name is imported on first use, from the module that defines it: ``import dispatch`` (and so
every ``dispatch`` command, whose entry point lives in this package) loads nothing until a name is asked
for. The adapter pulls in the HTTP client and asyncio, which a training process that only fences its
checkpoints must not pay for, and ``dispatch --version`` needs none of them."""
_WHERE = {name: module for module, names in _LAZY.items() for name in names}
_SUBMODULES = frozenset({"errors", "fence"})
"""Submodules ``import dispatch`` once loaded as a side effect, still reachable as attributes."""


def __getattr__(name: str) -> object:
    import importlib

    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
    "ConfigOverrides",
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
