"""The testbed's real node: a real kubelet of the stack's version runs real processes, and the process oracle
reads what they wrote.

What scenario tests on the real node rely on: it registers Ready with the stack's version; the workload runs
and its oracle file grows; a graceful delete reaches the process as SIGTERM and it leaves an EXIT line; a
frozen kubelet makes the node Ready=Unknown while its container keeps running. In CI (``CI=true``) a missing
real node fails these tests; elsewhere they are skipped with the reason (no root, no cgroups, turned off).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import testbed
from dispatch.testbed import _node, oracle, realnode

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def node(testbed_kubeconfig: str) -> str:
    """The real node's name. Missing, it fails the test in CI and wherever it failed to start, and skips it
    where the host cannot run one (no root, no cgroups, packages missing) or it was turned off."""
    name = testbed.real_node()
    if name is None:
        why = testbed.real_node_problem() or "unknown"
        ci = os.environ.get("CI", "").lower() == "true"
        if (ci and not why.startswith("turned off")) or why.startswith("it failed to start"):
            pytest.fail(f"the testbed has no real node: {why}")
        pytest.skip(f"the testbed has no real node: {why}")
    return name


@pytest.fixture
def ns(node: str) -> Iterator[str]:
    name = f"rn-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def get(*args: str) -> Obj:
    out: Obj = json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)
    return out


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> float:
    """Wait for ``cond``; returns the seconds it took."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - t0


def ready(name: str) -> str:
    for c in get("node", name)["status"].get("conditions", []):
        if c["type"] == "Ready":
            return str(c["status"])
    return ""


def pod_phase(ns: str, name: str) -> str | None:
    proc = testbed.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return str(json.loads(proc.stdout)["status"].get("phase", ""))


def start_pod(ns: str, oracle_dir: Path, name: str = "w", **knobs: Any) -> float:
    """Create a workload pod on the real node and wait until it runs and wrote START; returns the seconds
    from create to Running."""
    testbed.kubectl("apply", "-f", "-", input=json.dumps(realnode.workload_pod(name, ns, oracle_dir, **knobs)))
    took = wait_for(f"pod {name} Running", lambda: pod_phase(ns, name) == "Running", 60)
    wait_for("its START line", lambda: any(r.event == "START" and r.pod == name
                                           for r in oracle.read(oracle_dir)), 10)
    return took


def mine(oracle_dir: Path, pod: str) -> list[oracle.Record]:
    return [r for r in oracle.read(oracle_dir) if r.pod == pod]


def test_registers_ready_with_the_stacks_version(node: str) -> None:
    obj = get("node", node)
    assert ready(node) == "True"
    assert obj["status"]["nodeInfo"]["kubeletVersion"] == testbed.versions()["K8S_VERSION"]
    assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert obj["metadata"]["labels"][realnode.LABEL] == "true"
    assert {"key": realnode.LABEL, "value": "true", "effect": "NoSchedule"} in obj["spec"]["taints"]
    assert obj["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
    assert {s.name: s.healthy for s in testbed.status()}.keys() >= {"containerd", "kubelet"}
    assert all(s.healthy for s in testbed.status() if s.name in ("containerd", "kubelet"))


def test_a_pod_runs_the_workload_and_its_oracle_grows(ns: str, node: str, tmp_path: Path) -> None:
    took = start_pod(ns, tmp_path, env={"DISPATCH_JOB_ID": "j", "DISPATCH_SUBMISSION": "s1",
                                        "DISPATCH_ADMISSION": "4"})
    print(f"pod create to Running: {took:.2f}s")
    assert get("pod", "w", "-n", ns)["spec"]["nodeName"] == node
    first = len(mine(tmp_path, "w"))
    time.sleep(1.0)
    recs = mine(tmp_path, "w")
    assert len(recs) >= first + 5, "the workload ticks every 100 ms"
    start = recs[0]
    assert (start.event, start.job_id, start.submission, start.admission) == ("START", "j", "s1", "4")
    assert oracle.pid_alive(start.pid, start.start_ticks), "hostPID: the oracle's pid is a host pid"
    assert {r.event for r in recs[1:]} == {"TICK"}
    [proc] = oracle.processes(recs)
    assert proc.alive and proc.admission == "4"
    logs = testbed.kubectl("logs", "w", "-n", ns).stdout  # through the apiserver: the node address works
    assert "event=START" in logs


def test_graceful_delete_is_sigterm_then_exit(ns: str, node: str, tmp_path: Path) -> None:
    start_pod(ns, tmp_path, grace="1s", grace_period_seconds=10)
    pid = mine(tmp_path, "w")[0].pid
    t0 = time.monotonic()
    testbed.kubectl("delete", "pod", "w", "-n", ns, "--wait=false")
    wait_for("the pod object gone", lambda: pod_phase(ns, "w") is None, 30)
    recs = mine(tmp_path, "w")
    events = [r.event for r in recs]
    assert "TERM" in events and events[-1] == "EXIT", events[-3:]
    term = next(r for r in recs if r.event == "TERM")
    assert recs[-1].ms - term.ms >= 900, "the process kept running through its own grace"
    assert recs[-1].code == 0
    assert any(r.event == "TICK" and r.ms > term.ms for r in recs), "ticks between TERM and EXIT"
    assert not oracle.pid_alive(pid, recs[0].start_ticks)
    print(f"delete to pod gone: {time.monotonic() - t0:.2f}s")
    [proc] = oracle.processes(recs)
    assert (proc.alive, proc.exit_code, proc.termed_ms) == (False, 0, term.ms)


def test_a_frozen_kubelet_leaves_its_container_running(ns: str, node: str, tmp_path: Path) -> None:
    start_pod(ns, tmp_path, grace_period_seconds=3)
    first = mine(tmp_path, "w")[0]
    testbed.freeze(node)
    frozen_at = int(time.time() * 1000)
    try:
        took = wait_for("the node Ready=Unknown", lambda: ready(node) == "Unknown", 40)
        print(f"SIGSTOP to Ready=Unknown: {took:.1f}s")
        time.sleep(1.0)
        later = [r for r in mine(tmp_path, "w") if r.ms > frozen_at]
        assert len(later) >= 10, "the container keeps writing while its kubelet is stopped"
        assert not any(r.event in ("TERM", "EXIT") for r in later)
        assert oracle.pid_alive(first.pid, first.start_ticks)
    finally:
        testbed.thaw(node)
    wait_for("the node Ready again", lambda: ready(node) == "True", 60)


def test_a_node_that_loses_power_leaves_the_host_as_it_found_it(ns: str, node: str, tmp_path: Path) -> None:
    """``stop_real_node(delete_pods=False)``: the processes die, the API is told nothing, and every change
    the node made to the host (cgroups, mounts, network namespaces, sysctls, bridge, fixed paths) is undone,
    as ``down`` does; ``start_real_node`` brings the node back."""
    start_pod(ns, tmp_path)  # a running pod: overlay and shm mounts, a netns, pod cgroups, the bridge in use
    first = mine(tmp_path, "w")[0]
    host = json.loads((testbed.runtime_dir() / "node" / "host.json").read_text())
    assert set(host["sysctls"]) >= {"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"}
    assert _node.kubepods_dirs() and _node._mounts() and _node._our_shims()
    testbed.stop_real_node(delete_pods=False)
    try:
        assert testbed.real_node() is None
        assert "stopped" in (testbed.real_node_problem() or "")
        assert not oracle.pid_alive(first.pid, first.start_ticks)
        assert mine(tmp_path, "w")[-1].event == "TICK", "killed: no TERM, no EXIT"
        assert pod_phase(ns, "w") == "Running", "a node without power tells the API nothing"
        assert _node.kubepods_dirs() == []
        assert _node._mounts() == []
        assert _node._our_shims() == []
        for name, value in host["sysctls"].items():
            assert Path("/proc/sys", name).read_text().strip() == value, name
        if not host["bridge_existed"]:
            assert not Path("/sys/class/net", host["bridge"]).exists()
        assert [p for p in host["created"] if Path(p).exists()] == []
        assert not (testbed.runtime_dir() / "node" / "host.json").exists()
        assert all(s.name not in ("containerd", "kubelet") for s in testbed.status())
    finally:
        t0 = time.monotonic()
        assert testbed.start_real_node() == node
        print(f"real node restarted and Ready in {time.monotonic() - t0:.1f}s")
    assert ready(node) == "True"


def test_a_dispatch_trainjob_runs_its_process_with_its_A(ns: str, node: str, tmp_path: Path) -> None:
    """``realnode.training_runtime`` + dispatch's own open/release: the process reads its identity from the
    downward API, a hold ends it with SIGTERM, and the next A starts only after (the oracle agrees)."""
    from dispatch import Adapter, JobSpec, PodsRemain
    from dispatch.testbed.harness import role_kubeconfig_file

    rt = realnode.training_runtime("real", tmp_path, namespace=ns, grace="1s", grace_period_seconds=10)
    testbed.kubectl("apply", "-f", "-", input=json.dumps(rt))
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as dispatch:
        dispatch.open(JobSpec(job_id="rj", submission="s1", runtime="real", runtime_kind="TrainingRuntime",
                              num_nodes=1))
        assert dispatch.release("rj-s1").admission == 1
        wait_for("A=1 running", lambda: any(r.admission == "1" and r.event == "TICK" for r in oracle.read(tmp_path)),
                 60)
        first = next(r for r in oracle.read(tmp_path) if r.admission == "1")
        assert (first.job_id, first.submission) == ("rj", "s1")
        dispatch.hold("rj-s1")

        def released() -> bool:
            try:
                return dispatch.release("rj-s1").admission == 2
            except PodsRemain:
                return False

        wait_for("the second admission", released, 90)
        wait_for("A=2 running", lambda: any(r.admission == "2" for r in oracle.read(tmp_path)), 60)
    recs = oracle.read(tmp_path)
    procs = oracle.processes(recs)
    assert [p.admission for p in procs] == ["1", "2"]
    assert procs[0].termed_ms is not None and procs[0].exit_code == 0
    oracle.assert_no_overlap(recs)
