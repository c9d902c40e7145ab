"""Local real Kubernetes control plane for integration tests (issue 3).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, KWOK, JobSet, Kubeflow Trainer
and Kueue, all built from Go modules and run as local processes. Use :func:`up` then point a client at
:func:`kubeconfig_path`; :func:`freeze`/:func:`thaw` make a node's kubelet (its KWOK process, or the real
node's kubelet) vanish and come back; :func:`power_off`/:func:`power_on` cut the real node's power (its kubelet
dies with its memory) and boot it again. Where the host allows, a real node (:func:`real_node`: the stack's
kubelet, containerd, runc) runs real processes beside the KWOK nodes. Several stacks of versions live side
by side (``testbed/stacks/NAME``), picked by :func:`select_stack` or ``$DISPATCH_TESTBED_STACK``. See
``testbed/README.md`` in the repo. :mod:`dispatch.testbed.fleet` starts a MultiKueue manager and two workers
beside it.
"""

from __future__ import annotations

from dispatch.testbed._cluster import (
    ComponentStatus,
    build,
    build_estimate,
    down,
    env,
    freezable_nodes,
    freeze,
    is_built,
    is_present,
    is_up,
    kubectl,
    kubectl_argv,
    power_off,
    power_on,
    real_node,
    real_node_problem,
    reconfigure_kueue,
    regular_nodes,
    restart_kubelet,
    start_component,
    start_real_node,
    status,
    stop_component,
    stop_real_node,
    thaw,
    up,
)
from dispatch.testbed._manifests import ANN_COMPLETE, ANN_DELETE_DELAY, ANN_FAIL, ANN_HOLD_DELETE
from dispatch.testbed._paths import kubeconfig_path, runtime_dir, select_stack, stack, stacks, versions

__all__ = [
    "ANN_COMPLETE",
    "ANN_DELETE_DELAY",
    "ANN_FAIL",
    "ANN_HOLD_DELETE",
    "ComponentStatus",
    "build",
    "build_estimate",
    "down",
    "env",
    "freezable_nodes",
    "freeze",
    "is_built",
    "is_present",
    "is_up",
    "kubeconfig_path",
    "kubectl",
    "kubectl_argv",
    "power_off",
    "power_on",
    "real_node",
    "real_node_problem",
    "reconfigure_kueue",
    "regular_nodes",
    "restart_kubelet",
    "runtime_dir",
    "select_stack",
    "stack",
    "stacks",
    "start_component",
    "start_real_node",
    "status",
    "stop_component",
    "stop_real_node",
    "thaw",
    "up",
    "versions",
]
