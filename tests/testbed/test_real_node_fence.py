"""Issue 29 on the testbed's real node: the seed's hazard forced by hand, made harmless by the fence.

An operator taints a node ``out-of-service`` while its process still runs (its kubelet is frozen, so the
control plane cannot tell). dispatch takes the taint as the proof of cessation it is meant to be and admits
A=2, whose pod the scheduler puts on the same node; when the kubelet comes back, A=2's process starts while
A=1's still runs (it ignores SIGTERM, as a process a lost kubelet cannot stop would). Both are real processes
of ``dispatch.fence`` (the Python image: this machine's interpreter and the project's own module), writing
one checkpoint location in a hostPath directory this test reads. The process oracle shows the two alive at
once; the fence's log shows that nothing A=1 committed after A=2's claim counts, that A=1 was refused, and
that the location holds only A=2's checkpoints from A=2's claim on.

The adapter acts with the shipped ``dispatch-writer`` and ``dispatch-node-reader`` roles.
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
import yaml

from dispatch import Adapter, Fence, JobSpec, PodsRemain, testbed
from dispatch.testbed import harness, oracle, realnode

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parents[2]
JOB, SUBMISSION = "fence", "s1"
NAME = f"{JOB}-{SUBMISSION}"
TOLERATE_LOST_NODE = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
                      {"key": "node.kubernetes.io/out-of-service", "operator": "Exists"}]
"""A=2's pod may go to the node while it is Ready=Unknown and tainted, so it starts as soon as the kubelet
is back (beside A=1's process). Pods on a node tainted out-of-service are still force-deleted once
terminating, whatever they tolerate, so A=1's pod goes as in the seed's story."""


@pytest.fixture(scope="module")
def node(testbed_kubeconfig: str) -> str:
    name = testbed.real_node()
    if name is None:
        why = testbed.real_node_problem() or "unknown"
        if os.environ.get("CI", "").lower() == "true" or why.startswith("it failed to start"):
            pytest.fail(f"the testbed has no real node: {why}")
        pytest.skip(f"the testbed has no real node: {why}")
    return name


@pytest.fixture
def ns(node: str) -> Iterator[str]:
    name = f"fn-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def writer(ns: str, tmp_path: Path) -> Iterator[str]:
    """A kubeconfig of a ServiceAccount bound to the shipped writer role in ``ns`` and the node reader."""
    harness.apply_shipped_roles()
    testbed.kubectl("-n", ns, "create", "serviceaccount", "writer")
    testbed.kubectl("-n", ns, "create", "rolebinding", "writer", "--clusterrole=dispatch-writer",
                    f"--serviceaccount={ns}:writer")
    binding = f"{ns}-writer-nodes"
    testbed.kubectl("create", "clusterrolebinding", binding, "--clusterrole=dispatch-node-reader",
                    f"--serviceaccount={ns}:writer")
    token = testbed.kubectl("-n", ns, "create", "token", "writer", "--duration=1h").stdout.strip()
    cluster = yaml.safe_load(testbed.kubeconfig_path().read_text())["clusters"][0]
    path = tmp_path / "writer.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "writer", "user": {"token": token}}],
        "contexts": [{"name": "writer", "context": {"cluster": cluster["name"], "user": "writer", "namespace": ns}}],
        "current-context": "writer"}))
    try:
        yield str(path)
    finally:
        testbed.kubectl("delete", "clusterrolebinding", binding, "--wait=false", check=False)


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 90.0) -> Any:
    t0 = time.monotonic()
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def events(oracle_dir: Path) -> list[dict[str, Any]]:
    path = realnode.fence_report(oracle_dir)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def of(evs: list[dict[str, Any]], a: int, kind: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["a"] == a and e["event"] == kind]


def log(location: Path) -> list[dict[str, Any]]:
    """The fence's log as it is on disk, entry by entry (``seq`` added)."""
    out = []
    for seq, entry in enumerate(sorted((location / "log").iterdir()), 1):
        assert entry.name == f"{seq:012d}", f"the log has a gap before {entry.name}"
        out.append({**json.loads(entry.read_text()), "seq": seq})
    return out


def node_condition(name: str) -> str:
    conditions = json.loads(testbed.kubectl("get", "node", name, "-o", "json").stdout)["status"]["conditions"]
    return next(str(c["status"]) for c in conditions if c["type"] == "Ready")


def pods_on(ns: str, node: str, admission: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(testbed.kubectl(
        "get", "pods", "-n", ns, "-l", f"dispatch.phpboyscout.uk/admission={admission}", "-o", "json").stdout)["items"]
    return [p for p in items if p["spec"].get("nodeName") == node]


def admitted(adapter: Adapter) -> int | None:
    try:
        return adapter.release(NAME).admission
    except PodsRemain:
        return None


def test_a_stale_execution_on_a_node_tainted_while_it_runs_commits_nothing_that_counts(
        ns: str, node: str, writer: str, tmp_path: Path) -> None:
    cost = realnode.python_image()
    print(f"\nPython image: {cost}")
    oracle_dir, checkpoints = tmp_path / "oracle", tmp_path / "checkpoints"
    location = checkpoints / ns / JOB / SUBMISSION  # the namespace is part of a location (DISPATCH_NAMESPACE)
    rt = realnode.fenced_runtime("fenced", oracle_dir, checkpoints, namespace=ns, commit_every=0.1,
                                 fenced_tries=5, tolerations=TOLERATE_LOST_NODE, grace_period_seconds=10,
                                 linger=True)
    testbed.kubectl("apply", "-f", "-", input=json.dumps(rt))
    timeline: dict[str, float] = {}
    with Adapter.connect(ns, kubeconfig=writer) as adapter:
        adapter.open(JobSpec(job_id=JOB, submission=SUBMISSION, runtime="fenced", runtime_kind="TrainingRuntime",
                             num_nodes=1))
        assert adapter.release(NAME).admission == 1
        wait_for("A=1 commits", lambda: len(of(events(oracle_dir), 1, "commit")) >= 3, 90)
        testbed.freeze(node)
        thawed = False
        try:
            adapter.hold(NAME)
            wait_for("Ready=Unknown", lambda: node_condition(node) == "Unknown", 60)
            before = len(of(events(oracle_dir), 1, "commit"))
            wait_for("A=1 commits on while its kubelet is frozen",
                     lambda: len(of(events(oracle_dir), 1, "commit")) > before + 3, 10)
            assert admitted(adapter) is None, "dispatch's rule holds A=2 back while A=1's pod remains"
            # The operator's error the seed names: the node is tainted as shut down while its process runs.
            testbed.kubectl("taint", "node", node, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
            timeline["tainted"] = time.time()
            wait_for("ceased (on the taint's word)", lambda: adapter.ceased(NAME).ceased, 60)
            # the taint proves the pod's end; freeing dispatch's finalizer is the controller keeper's
            assert wait_for("A=2 admitted", lambda: (harness.keeper_pass(ns), admitted(adapter))[1], 90) == 2
            wait_for("A=2's pod bound to the node", lambda: pods_on(ns, node, "2"), 60)
            assert not pods_on(ns, node, "1"), "A=1's pod object is gone, its process is not"
            assert any(p.alive for p in oracle.processes(oracle.read(oracle_dir)) if p.admission == "1")
            testbed.thaw(node)
            thawed = True
            timeline["thawed"] = time.time()
            wait_for("A=2 claims and commits", lambda: len(of(events(oracle_dir), 2, "commit")) >= 5, 60)
            wait_for("A=1's process ends", lambda: not any(
                p.alive for p in oracle.processes(oracle.read(oracle_dir)) if p.admission == "1"), 60)
        finally:
            testbed.kubectl("taint", "node", node, "node.kubernetes.io/out-of-service-", check=False)
            if not thawed:
                testbed.thaw(node)
        adapter.hold(NAME)

    evs = events(oracle_dir)
    entries = log(location)
    claim2 = next(e["seq"] for e in entries if e["kind"] == "claim" and e["admission"] == 2)
    claim2_ms = next(e["ms"] for e in of(evs, 2, "claim"))

    # The two processes really overlapped: A=2 claimed while A=1 was alive and committing.
    procs = {p.admission: p for p in oracle.processes(oracle.read(oracle_dir))}
    assert set(procs) == {"1", "2"}, [str(p) for p in procs.values()]
    assert procs["1"].ended_ms is not None and procs["1"].ended_ms > claim2_ms > procs["1"].started_ms
    assert oracle.overlaps(oracle.read(oracle_dir)), "the oracle sees two executions alive at once"

    # A=1's commits after A=2's claim were refused, each of them, and none of them counts.
    fenced = of(evs, 1, "fenced")
    assert fenced, f"A=1 tried no commit after A=2's claim: {evs}"
    assert all(e["newer"] == 2 for e in fenced)
    assert all(e["seq"] < claim2 for e in of(evs, 1, "commit")), "a commit A=1 was told counted came after"
    late = [e for e in entries if e["kind"] == "commit" and e["admission"] == 1 and e["seq"] > claim2]
    assert not any((location / e["data"]).exists() for e in late), "a refused commit's data was left"

    # The location holds only A=2's data from A=2's claim on, and a reader resumes from A=2's newest.
    counted1 = [e for e in entries if e["kind"] == "commit" and e["admission"] == 1 and e["seq"] < claim2]
    assert sorted(p.relative_to(location).as_posix() for p in (location / "data/a-000000000001").iterdir()) == \
        sorted(e["data"] for e in counted1), "A=1's data is exactly its checkpoints from before A=2's claim"
    resume = of(evs, 2, "claim")[0]["resume"]
    assert resume == {"a": 1, "step": counted1[-1]["step"], "seq": counted1[-1]["seq"]}
    commits2 = of(evs, 2, "commit")
    for e in commits2:
        payload = (Path(e["location"].replace(realnode.CHECKPOINT_MOUNT, str(checkpoints), 1)) / "payload")
        assert payload.read_text().startswith(f"A=2 step={e['step']} ")
    latest = Fence.at(checkpoints, JOB, SUBMISSION, 2, namespace=ns).latest()
    assert latest is not None and latest.admission == 2 and latest.step >= commits2[-1]["step"]
    term = procs["1"].termed_ms
    after_term = "" if term is None else f", {procs['2'].started_ms - term} ms after the kubelet SIGTERMed A=1"
    print(f"A=1: {len(of(evs, 1, 'commit'))} commits that count, {len(fenced)} refused after A=2's claim "
          f"({len(late)} of them after making their log entry), then exit code {procs['1'].exit_code}; "
          f"alive together {(procs['1'].ended_ms or 0) - procs['2'].started_ms} ms; A=2 started "
          f"{procs['2'].started_ms / 1000 - timeline['thawed']:.2f} s after the thaw"
          f"{after_term}; "
          f"A=2 resumed from A=1 step {resume['step']}")
