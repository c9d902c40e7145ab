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

A plain-mode test that runs no controller frees dispatch's pod finalizer with
``dispatch.controller.testing.keeper_pass`` (the controller's own keeper, so it needs the ``controller``
extra); nothing here imports the controller.
"""

from ._cluster import FakeCluster, History, Process
from ._endings import ending_shape, proof_of
from ._rbac import Binding, Policy, RbacError
from ._server import ApiFailure, FakeApiServer, Fault, Kind

__all__ = ["ApiFailure", "Binding", "FakeApiServer", "FakeCluster", "Fault", "History", "Kind", "Policy", "Process",
           "RbacError", "ending_shape", "proof_of"]
