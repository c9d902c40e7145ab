"""Where each kind dispatch touches lives in the Kubernetes API: one registry, no I/O.

``_kube`` sends requests to these coordinates and the in-process fake API server serves the same
ones, so a kind or version changes in one place for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _names as n

Obj = dict[str, Any]
"""A Kubernetes object as the API serves it (decoded JSON); parsed into views once, where it is read."""


@dataclass(frozen=True)
class Res:
    """Where a kind lives in the API (``status``: whether it has a status subresource)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base

    def describe(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Res("", "v1", "pods", "Pod")
NODES = Res("", "v1", "nodes", "Node", namespaced=False)
EVENTS = Res("", "v1", "events", "Event", status=False)
NAMESPACES = Res("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIGMAPS = Res("", "v1", "configmaps", "ConfigMap", status=False)
JOBS = Res("batch", "v1", "jobs", "Job")
LEASES = Res("coordination.k8s.io", "v1", "leases", "Lease", status=False)
TRAINJOBS = Res(n.TRAINER_GROUP, n.TRAINER_VERSION, "trainjobs", "TrainJob")
CLUSTER_RUNTIMES = Res(
    n.TRAINER_GROUP, n.TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
RUNTIMES = Res(n.TRAINER_GROUP, n.TRAINER_VERSION, "trainingruntimes", "TrainingRuntime")
JOBSETS = Res(n.JOBSET_GROUP, n.JOBSET_VERSION, "jobsets", "JobSet")
WORKLOADS = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "workloads", "Workload")
ADMISSION_CHECKS = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "admissionchecks", "AdmissionCheck", namespaced=False)
CLUSTER_QUEUES = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "localqueues", "LocalQueue")
MULTIKUEUE_CLUSTERS = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "multikueueclusters", "MultiKueueCluster",
                          namespaced=False)
SECRETS = Res("", "v1", "secrets", "Secret", status=False)
RESOURCE_FLAVORS = Res(n.KUEUE_GROUP, n.KUEUE_VERSION, "resourceflavors", "ResourceFlavor", namespaced=False)

SUBMISSION_RECORDS = Res(n.DOMAIN, "v1alpha1", "submissionrecords", "SubmissionRecord", status=False)
"""dispatch's own kind: one identity record per submission (``_identity``)."""
SUBMISSION_FLOORS = Res(n.DOMAIN, "v1alpha1", "submissionfloors", "SubmissionFloor", namespaced=False, status=False)
"""dispatch's cluster-scoped floor of A per (namespace, job-id, submission): what a record's namespace
outlives (``_identity``), so a namespace deleted and re-created never counts a submission from 1 again."""

VALIDATING_WEBHOOKS = Res("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                          "ValidatingWebhookConfiguration", namespaced=False, status=False)
"""The guard's own webhook configuration (the controller keeps its caBundle); not served by the fake."""
MUTATING_WEBHOOKS = Res("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                        "MutatingWebhookConfiguration", namespaced=False, status=False)
"""Enrolment's webhook configuration, of the same name (the controller keeps its caBundle too)."""

ALL: tuple[Res, ...] = (
    PODS, NODES, NAMESPACES, EVENTS, CONFIGMAPS, JOBS, LEASES, TRAINJOBS, CLUSTER_RUNTIMES, RUNTIMES,
    JOBSETS, WORKLOADS, ADMISSION_CHECKS, CLUSTER_QUEUES, LOCAL_QUEUES, RESOURCE_FLAVORS, SUBMISSION_RECORDS,
    SUBMISSION_FLOORS, MULTIKUEUE_CLUSTERS, SECRETS,
)
"""Every kind the library, the controller and the fake API server know."""
