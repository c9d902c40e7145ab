"""An in-process fake Kubernetes API and cluster, for dispatch's tests and for yours.

``FakeApiServer`` answers the API over an ``httpx2.MockTransport``; ``FakeCluster`` adds the
controllers, nodes and kubelets a test steps by hand, and a history of processes that the overlap
checker reads. Typical use::

    from dispatch import Adapter, JobSpec
    from dispatch.testing import FakeCluster

    cluster = FakeCluster()
    cluster.add_runtime()
    cluster.add_node("node-0")
    with Adapter.connect("default", transport=cluster.transport()) as dispatch:
        dispatch.open(JobSpec(job_id="llama", submission="s1"), hold=False)
        cluster.settle()
    cluster.history.check()
"""

from ._cluster import FakeCluster, History, Process
from ._endings import ending_shape, proof_of
from ._rbac import Binding, Policy, RbacError
from ._server import ApiFailure, FakeApiServer, Fault, Kind

__all__ = ["ApiFailure", "Binding", "FakeApiServer", "FakeCluster", "Fault", "History", "Kind", "Policy", "Process",
           "RbacError", "ending_shape", "keeper_pass", "proof_of"]


def keeper_pass(cluster: FakeCluster, namespace: str | None = None, *, settle: bool = True) -> dict[str, str]:
    """One pass of dispatch's controller's finalizer keeper over the cluster's pods (``namespace``: only
    that one), then a settle: what an installed controller does by itself. dispatch's pod finalizer is
    freed by the controller alone (the writer role may not patch pods), so a plain-mode test that runs no
    controller calls this where a pod's end is proven. Needs the ``controller`` extra. Returns, per
    ``namespace/pod``, what the keeper did (the proof, ``unproven``, ``deleted``, ...).

    Without the extra it raises ``ModuleNotFoundError`` naming the extra to install; the rest of
    ``dispatch.testing`` needs no extra."""
    try:
        from ..controller.testing import keeper_pass as one_pass
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        raise ModuleNotFoundError(
            f"dispatch.testing.keeper_pass runs dispatch's controller, which needs the controller extra ({missing} "
            "is not installed): pip install 'trainjob-dispatch[controller]'", name=exc.name) from exc

    return one_pass(cluster, namespace, settle=settle)
