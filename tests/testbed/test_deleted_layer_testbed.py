"""A running object's Job or JobSet deleted by a user Kubernetes' built-in ``edit`` role allows (dispatch's own
roles do not): JobSet re-creates a missing child Job at once, Trainer a missing JobSet, and the Job controller
creates the new pod, with the same A, while the old one is still Terminating (found by an adversarial probe:
without dispatch's guard on pod creates, the two ran side by side for the whole grace period).

Here the shipped guard judges the pod's create (``deploy/base/guard.yaml``'s webhooks, narrowed to the test's
namespace, served by ``python -m dispatch.controller`` under the shipped ``dispatch-controller`` role): the new
pod is refused while the old one may run, the Job controller tries again (``FailedCreate`` Events), and the
rank runs again, with the same A, once the old pod has ended; nobody acts in between.

The library runs as a ServiceAccount holding exactly the shipped writer roles; the deleter is another one
bound to ``edit`` in the namespace, acting through impersonation (a JobSet only the cluster's admin may delete)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, Adapter, JobSpec
from dispatch import testbed as tb
from dispatch._views import PodView
from dispatch.controller import _tls as g_
from dispatch.testbed.harness import apply_shipped_roles, controller_name, free_port, scoped

pytestmark = pytest.mark.testbed
Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
DELETE_DELAY = "10"
"""How long KWOK keeps a deleted pod running (a real pod's grace period): the window the overlap needs."""
REFUSED = 'admission webhook "pods.guard.dispatch.phpboyscout.uk" denied the request: '


@dataclass
class Env:
    ns: str
    writer: str
    editor: str
    guard_log: Path


@pytest.fixture
def env(testbed_kubeconfig: str, tmp_path: Path) -> Iterator[Env]:
    apply_shipped_roles()
    ns = f"dellayer-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", ns)
    for account, role in (("writer", "dispatch-writer"), ("editor", "edit")):
        tb.kubectl("-n", ns, "create", "serviceaccount", account)
        tb.kubectl("-n", ns, "create", "rolebinding", account, f"--clusterrole={role}",
                   f"--serviceaccount={ns}:{account}")
    tb.kubectl("create", "clusterrolebinding", ns, "--clusterrole=dispatch-node-reader",
               f"--serviceaccount={ns}:writer")
    tb.kubectl("-n", ns, "create", "serviceaccount", "controller")
    tb.kubectl("create", "clusterrolebinding", f"{ns}-controller", "--clusterrole=dispatch-controller",
               f"--serviceaccount={ns}:controller")
    hook = _guard_hook(ns, port := free_port(), tmp_path / "certs")
    log = tmp_path / "controller.log"
    guard = _serve_guard(ns, port, tmp_path, log)
    try:
        _until_guard_answers(ns, guard)
        yield Env(ns, str(_token_kubeconfig(ns, "writer", tmp_path)), f"system:serviceaccount:{ns}:editor", log)
    finally:
        guard.terminate()
        guard.wait(10)
        tb.kubectl("delete", "validatingwebhookconfiguration", hook, check=False)
        _unstick(ns)
        tb.kubectl("delete", "clusterrolebinding", ns, f"{ns}-controller", "--wait=false", check=False)
        tb.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _token_kubeconfig(ns: str, account: str, tmp: Path) -> Path:
    """A kubeconfig holding only ``account``'s token: its bound roles are all it may use."""
    token = tb.kubectl("-n", ns, "create", "token", account).stdout.strip()
    cluster = yaml.safe_load(tb.kubeconfig_path().read_text())["clusters"][0]
    path = tmp / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account, "namespace": ns}}],
        "current-context": account}))
    return path


def _guard_hook(ns: str, port: int, certs: Path) -> str:
    """The shipped guard's webhooks, narrowed to ``ns`` and pointed at ``port``, trusting a CA made here (the
    controller's role may publish its CA only into the shipped configuration's name). Returns its name."""
    ca = g_.generate_certs(certs, ["localhost", "127.0.0.1"]).ca_pem
    assert ca is not None
    hook, _, _ = scoped(ns, port, f"dispatch-guard-{ns}")
    for w in hook["webhooks"]:
        w["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    tb.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(hook))
    return str(hook["metadata"]["name"])


def _serve_guard(ns: str, port: int, tmp: Path, log: Path) -> subprocess.Popen[bytes]:
    """``python -m dispatch.controller`` for ``ns`` as its Deployment runs it, with the controller's token only."""
    argv = [sys.executable, "-m", "dispatch.controller", "--kubeconfig", str(_token_kubeconfig(ns, "controller", tmp)),
            "--namespace", ns, "--metrics-port", str(free_port()), "--controller-name", controller_name(ns),
            "--guard-port", str(port), "--guard-cert-dir", str(tmp / "certs"), "--guard-webhook", "",
            "--no-leader-elect"]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stderr=out, env=os.environ.copy())


def _until_guard_answers(ns: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until the guard's server answers: a dry-run create of an unsuspended dispatch TrainJob is refused (the
    same server, certificate and configuration judge pod creates)."""
    probe = json.dumps({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                        "metadata": {"name": "guard-probe", "namespace": ns,
                                     "labels": {LABEL_JOB_ID: "probe", LABEL_SUBMISSION: "s1"}},
                        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": False}})
    deadline = time.monotonic() + timeout
    while "is created suspended" not in tb.kubectl("create", "--dry-run=server", "-f", "-", input=probe,
                                                   check=False).stderr:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the guard never answered")
        time.sleep(0.5)


def _unstick(ns: str) -> None:
    """Test hygiene only: dispatch's finalizer would keep the namespace forever (no keeper runs here)."""
    for p in _pods(ns, None):
        if p["metadata"].get("finalizers"):
            tb.kubectl("patch", "pod", p["metadata"]["name"], "-n", ns, "--type=merge",
                       "-p", json.dumps({"metadata": {"finalizers": None}}), check=False)


def _pods(ns: str, jobset: str | None) -> list[Obj]:
    selector = ["-l", f"{JOBSET_LABEL}={jobset}"] if jobset else []
    got: list[Obj] = json.loads(tb.kubectl("get", "pods", "-n", ns, *selector, "-o", "json").stdout)["items"]
    return got


def _running(p: Obj) -> bool:
    return p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]


@dataclass
class Timeline:
    """What was seen, second by second after t0, so a failure (or a report) quotes the schedule."""

    t0: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.lines.append(f"{time.monotonic() - self.t0:6.1f}s {what}")

    def __str__(self) -> str:
        return "\n".join(self.lines)


def _start(env: Env) -> tuple[str, set[str]]:
    """An object released and running (A=1, one pod): its name and its pods' uids."""
    name = "victim-s1"
    with Adapter.connect(env.ns, kubeconfig=env.writer) as adapter:
        adapter.open(JobSpec(job_id="victim", submission="s1", num_nodes=1, resources_per_node={"cpu": "1"},
                             pod_annotations={tb.ANN_DELETE_DELAY: DELETE_DELAY}))
        if (got := adapter.release(name).admission) != 1:
            pytest.fail(f"released as A={got}, not 1")
    deadline = time.monotonic() + 60
    while not any(_running(p) for p in _pods(env.ns, name)):
        if time.monotonic() > deadline:
            pytest.fail("the object's pod never ran")
        time.sleep(0.5)
    return name, {p["metadata"]["uid"] for p in _pods(env.ns, name)}


@dataclass
class Watched:
    """What following the pods showed: each moment two executions ran at once, when the old pods' end was
    first seen proven, and the new pods that ran (name, A, first seen Running)."""

    overlaps: list[str] = field(default_factory=list)
    old_ended: float | None = None
    new_running: dict[str, tuple[str | None, float]] = field(default_factory=dict)


def _watch(env: Env, name: str, old: set[str], timeline: Timeline, timeout: float = 45.0) -> Watched:
    """Follow the pods until the old ones have ended as their kubelet reports and a new one runs; note every
    moment a new pod ran while an old one had not ended (two executions of one submission alive at once)."""
    got = Watched()
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = _pods(env.ns, name)
        now = time.monotonic() - timeline.t0
        for p in items:
            m = p["metadata"]
            state = f"{p['status'].get('phase')}{' deleting' if 'deletionTimestamp' in m else ''}"
            if seen.get(m["uid"]) != state:
                seen[m["uid"]] = state
                age = "old" if m["uid"] in old else "new"
                timeline.note(f"{age} pod {m['name']} A={m['labels'].get(LABEL_ADMISSION)} {state}")
        alive_old = [p for p in items if p["metadata"]["uid"] in old and not PodView.from_obj(p).kubelet_confirmed]
        running_new = [p for p in items if p["metadata"]["uid"] not in old and _running(p)]
        for p in running_new:
            got.new_running.setdefault(p["metadata"]["name"], (p["metadata"]["labels"].get(LABEL_ADMISSION), now))
        if not alive_old and got.old_ended is None:
            got.old_ended = now
            timeline.note("every old pod's end is proven (its kubelet confirmed it, or it is gone)")
        if alive_old and running_new:
            got.overlaps.append(f"{now:.1f}s: "
                                f"{sorted(p['metadata']['name'] for p in alive_old)} (A="
                                f"{sorted({p['metadata']['labels'].get(LABEL_ADMISSION) for p in alive_old})}) beside "
                                f"{sorted(p['metadata']['name'] for p in running_new)} (A="
                                f"{sorted({p['metadata']['labels'].get(LABEL_ADMISSION) for p in running_new})})")
        if not alive_old and running_new:
            break
        time.sleep(0.3)
    return got


def _events(ns: str) -> str:
    """The namespace's Events in order, printed beside the timeline: what the real controllers said they did."""
    items = json.loads(tb.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    rows = sorted((e.get("eventTime") or e.get("firstTimestamp") or "", e["involvedObject"]["kind"],
                   e["involvedObject"]["name"], e.get("reason", ""), e.get("message", "")) for e in items)
    return "\n".join(" ".join(r) for r in rows)


def _can_delete(env: Env, resource: str, user: str) -> bool:
    got = tb.kubectl("auth", "can-i", "delete", resource, "-n", env.ns, f"--as={user}", check=False)
    return got.stdout.strip() == "yes"


def _writer_may_not_delete(env: Env, resource: str) -> None:
    """The shipped writer may not delete ``resource``: whoever does holds a role dispatch does not ship."""
    writer = f"system:serviceaccount:{env.ns}:writer"
    assert not _can_delete(env, resource, writer), f"dispatch-writer may delete {resource}"


def _refused_until_ended(env: Env, name: str, old: set[str], timeline: Timeline) -> None:
    """No overlap; the guard refused the new pod (the Job controller's FailedCreate Events carry its denial,
    naming the old pod) until the old pod's end was proven; then the rank ran again, with the same A, without
    anyone acting. Prints the schedule and the Events: the Job controller's retries are the recorded finding."""
    watched = _watch(env, name, old, timeline)
    events = _events(env.ns)
    print(timeline, events, sep="\n")
    assert not watched.overlaps, f"two executions of one submission at once:\n{watched.overlaps[0]}\n{timeline}"
    assert watched.new_running, f"the rank never ran again:\n{timeline}\n{events}"
    assert {a for a, _ in watched.new_running.values()} == {"1"}, watched.new_running
    assert watched.old_ended is not None
    started = min(t for _, t in watched.new_running.values())
    assert started >= watched.old_ended, timeline
    refusals = [line for line in events.splitlines() if " FailedCreate " in line]
    assert refusals and all(REFUSED in line and "cannot start while a pod of the same rank of the same execution "
                            "may still run: remaining pods: " in line for line in refusals), events
    timeline.note(f"the rank ran again {started - watched.old_ended:.1f}s after the old pod's end was seen proven; "
                  f"{len(refusals)} FailedCreate Event(s)")
    print(timeline.lines[-1])
    assert "forbidden" not in env.guard_log.read_text().lower(), env.guard_log.read_text()[-2000:]


def test_a_deleted_child_job_starts_its_rank_again_only_once_the_old_pod_has_ended(env: Env) -> None:
    _writer_may_not_delete(env, "jobs.batch")
    assert _can_delete(env, "jobs.batch", env.editor), "Kubernetes' edit role no longer allows deleting Jobs"
    name, old = _start(env)
    job = f"{name}-node-0"
    timeline = Timeline()
    tb.kubectl("delete", "job", job, "-n", env.ns, f"--as={env.editor}", "--wait=false")
    timeline.note(f"deleted job {job} as {env.editor} (background propagation)")
    _refused_until_ended(env, name, old, timeline)


def test_a_deleted_jobset_starts_its_ranks_again_only_once_the_old_pod_has_ended(env: Env) -> None:
    """Neither edit nor admin reaches JobSets (JobSet ships no aggregated roles); the cluster's admin does."""
    _writer_may_not_delete(env, "jobsets.jobset.x-k8s.io")
    name, old = _start(env)
    timeline = Timeline()
    timeline.note(f"edit may delete jobsets: {_can_delete(env, 'jobsets.jobset.x-k8s.io', env.editor)}")
    tb.kubectl("delete", "jobset", name, "-n", env.ns, "--wait=false")
    timeline.note(f"deleted jobset {name} as the cluster's admin (background propagation)")
    _refused_until_ended(env, name, old, timeline)
