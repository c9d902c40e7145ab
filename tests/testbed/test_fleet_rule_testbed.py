"""The rule across clusters on real control planes (issue 26): dispatch's controller on a MultiKueue manager,
two workers, real Kueue, JobSet and Trainer everywhere.

The controller runs with exactly its shipped roles on the manager (``deploy/base`` and ``deploy/multikueue``)
and reads each worker through the kubeconfig Secret Kueue itself uses, whose service account holds only
Kueue's MultiKueue rules and the shipped worker reader (``deploy/worker``). An observer samples every
worker's pods throughout, reading the workers' API servers directly: never two pods of the object alive at
once in the fleet (Terminating counts as alive), and every pod carries the A dispatch issued for its
execution, rising.

Kueue v0.17.0 dispatches to a worker before the manager's other checks are Ready, so dispatch's check cannot
hold the run there (docs: how-to/multikueue.md); these scenarios need v0.17.1 or later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch import LABEL_ADMISSION, AsyncAdapter, JobSpec
from dispatch import _decision as d
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.controller import Config, Controller
from dispatch.controller.testing import KUEUE_MULTIKUEUE_ROLE, ORIGIN_LABEL
from dispatch.testbed import fleet

pytestmark = [pytest.mark.testbed, pytest.mark.multicluster]
Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
DELETE_DELAY = "40"
"""Seconds a deleted worker pod stays Terminating: the window the rule must hold through, longer than Kueue takes
to finish a hold's eviction (or than the test takes to see it stalled and unstick it)."""
UNSUPPORTED = ("v0.17.0",)

@pytest.fixture(scope="module")
def up(fleet_session: None) -> fleet.Fleet:
    if tb.versions().get("KUEUE_VERSION") in UNSUPPORTED:
        pytest.skip(f"Kueue {tb.versions().get('KUEUE_VERSION')} dispatches before dispatch's check is Ready "
                    "(the gate arrived in v0.17.1): dispatch under MultiKueue needs v0.17.1 or later")
    # Kueue's MultiKueue collects a lost worker's orphaned copy every gcInterval (1 min by default): 15 s
    # keeps the partition scenario's wait after the heal short.
    return fleet.up(worker_lost_timeout="20s", gc_interval="15s")


def _admin(cluster: str) -> Obj:
    out: Obj = json.loads(fleet.kubectl(cluster, "config", "view", "--raw", "-o", "json").stdout)
    return out


def _token_kubeconfig(cluster: str, namespace: str, account: str) -> str:
    token = fleet.kubectl(cluster, "create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    admin = _admin(cluster)
    server = admin["clusters"][0]["cluster"]
    ca = server.get("certificate-authority-data") or base64.b64encode(
        Path(server["certificate-authority"]).read_bytes()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": cluster, "cluster": {"server": server["server"], "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster, "user": "sa"}}]})


@pytest.fixture(scope="module")
def controller_kubeconfig(up: fleet.Fleet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped roles on the manager (dispatch's controller) and on each worker (the reader, bound to the
    service account Kueue's Secret for it now holds); returns the controller's kubeconfig."""
    for part in ("namespace.yaml", "serviceaccount.yaml", "crd.yaml", "rbac.yaml"):
        fleet.kubectl("manager", "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "deploy/base" / part))
    fleet.kubectl("manager", "apply", "--server-side", "-f", str(ROOT / "deploy/multikueue/rbac.yaml"))
    for worker in ("worker-1", "worker-2"):
        fleet.kubectl(worker, "create", "serviceaccount", "multikueue-sa", "-n", "kueue-system", check=False)
        fleet.kubectl(worker, "apply", "--server-side", "-f", "-", input=json.dumps(KUEUE_MULTIKUEUE_ROLE))
        fleet.kubectl(worker, "create", "clusterrolebinding", "multikueue-sa", "--clusterrole=multikueue-sa",
                      "--serviceaccount=kueue-system:multikueue-sa", check=False)
        fleet.kubectl(worker, "apply", "--server-side", "-f", str(ROOT / "deploy/worker/rbac.yaml"))
        text = _token_kubeconfig(worker, "kueue-system", "multikueue-sa")
        secret = {"apiVersion": "v1", "kind": "Secret",
                  "metadata": {"name": f"{worker}-kubeconfig", "namespace": "kueue-system"},
                  "data": {"kubeconfig": base64.b64encode(text.encode()).decode()}}
        fleet.kubectl("manager", "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(secret))
    path = tmp_path_factory.mktemp("fleet") / "controller"
    path.write_text(_token_kubeconfig("manager", "dispatch-system", "dispatch-controller"))
    return path


@dataclass
class Observer:
    """Samples the object's pods in every worker (the workers' own API servers, not dispatch's reads)."""

    namespace: str
    name: str
    workers: tuple[str, ...] = ("worker-1", "worker-2")
    overlaps: list[str] = field(default_factory=list)
    seen: dict[tuple[str, str], str] = field(default_factory=dict)
    """(worker, pod) -> the A its label carries, in the order pods were first seen."""
    off: set[str] = field(default_factory=set)
    """Workers whose machines the story has powered off: their pods' processes are gone."""
    off_nodes: set[tuple[str, str]] = field(default_factory=set)
    """(worker, node) the story has shut down (and tainted out-of-service): their pods' processes are gone."""
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Observer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=20)

    def alive(self, worker: str) -> list[tuple[str, str]] | None:
        proc = fleet.kubectl(worker, "get", "pods", "-n", self.namespace, "-l",
                             f"jobset.sigs.k8s.io/jobset-name={self.name}", "-o", "json", check=False, timeout=10)
        if proc.returncode != 0:
            return None
        out = []
        for p in json.loads(proc.stdout)["items"]:
            if p["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            if (worker, p["spec"].get("nodeName", "")) in self.off_nodes:
                continue
            out.append((p["metadata"]["name"], p["metadata"].get("labels", {}).get(LABEL_ADMISSION, "")))
        for pod, a in out:  # every look counts, the story's own too
            self.seen.setdefault((worker, pod), a)
        return out

    def _run(self) -> None:
        last: dict[str, list[tuple[str, str]]] = {}
        while not self._stop.is_set():
            for w in self.workers:
                got = self.alive(w)
                if got is not None:
                    last[w] = got
            live = [(w, pod) for w in self.workers if w not in self.off for pod, _ in last.get(w, [])]
            if len(live) > 1:
                self.overlaps.append(f"{live}")
            self.samples += 1
            time.sleep(0.2)

    def admissions(self) -> list[str]:
        return list(dict.fromkeys(self.seen.values()))


def spec(submission: str) -> JobSpec:
    return JobSpec(job_id="fleet", submission=submission, queue="lq", num_nodes=1,
                   resources_per_node={"cpu": "1", "memory": "1Gi"},
                   pod_annotations={tb.ANN_DELETE_DELAY: DELETE_DELAY})


async def _until(what: str, pred: Any, timeout: float = 90.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; the manager's Workloads: "
                         + _workloads_now())


def _workloads_now() -> str:
    """Every manager Workload's conditions and checks (what a timeout is explained by)."""
    proc = fleet.kubectl("manager", "get", "workloads", "-A", "-o", "json", check=False)
    if proc.returncode != 0:
        return proc.stderr
    out = []
    for w in json.loads(proc.stdout)["items"]:
        st = w.get("status", {})
        out.append(json.dumps({"name": w["metadata"]["name"], "active": w["spec"].get("active"),
                               "conditions": [(c["type"], c["status"], c.get("reason"), c.get("message", "")[:120])
                                              for c in st.get("conditions", [])],
                               "checks": [(c["name"], c["state"], c.get("message", "")[:160])
                                          for c in st.get("admissionChecks", [])],
                               "clusterName": st.get("clusterName")}))
    return "\n".join(out)


async def _check(kube: k.Kube, name: str) -> Obj:
    for w in (await kube.list(k.WORKLOADS)).items:
        owners = w["metadata"].get("ownerReferences") or []
        if owners and owners[0].get("name") == name:
            for c in w.get("status", {}).get("admissionChecks") or []:
                if c["name"] == "dispatch":
                    return {**c, "clusterName": w.get("status", {}).get("clusterName", "")}
    return {}


class Story:
    def __init__(self, ns: str, controller_kubeconfig: Path) -> None:
        self.ns = ns
        self.ckube = k.Kube.connect(namespace=ns, kubeconfig=controller_kubeconfig)
        self.admin = k.Kube.connect(namespace=ns, kubeconfig=fleet.fleet().manager.kubeconfig)
        self.adapter = AsyncAdapter(self.admin)
        self.ctl = Controller(self.ckube, Config(namespace=ns, resync_seconds=30, workers=2))
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Story:
        self.task = asyncio.create_task(self.ctl.run(self.stop))
        await self.ctl.wait_synced()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 30)
        await self.ckube.aclose()
        await self.admin.aclose()

    async def running_in(self, observer: Observer, a: str, timeout: float = 120.0) -> str:
        """The worker whose pod of the object runs with this A."""
        def where() -> str | None:
            for w in observer.workers:
                if any(pa == a for _, pa in observer.alive(w) or []):
                    return w
            return None
        found: str = await _until(f"a pod with A={a} in a worker", where, timeout)
        return found


@pytest.fixture
def ns(up: fleet.Fleet) -> Iterator[str]:
    name = f"fr-{uuid.uuid4().hex[:6]}"
    fleet.namespace(name, cluster_queue="cq-multikueue-dispatch")
    yield name
    fleet.delete_namespace(name)


def test_a_requeued_object_waits_for_its_pod_in_the_worker_then_gets_a_2(
        ns: str, controller_kubeconfig: Path) -> None:
    name = "fleet-s1"
    record: list[str] = []

    async def story() -> tuple[str, str, list[str]]:
        async with Story(ns, controller_kubeconfig) as s:
            await s.adapter.open(spec("s1"))
            with Observer(ns, name) as obs:
                first = await s.running_in(obs, "1")
                [(old_pod, _)] = obs.alive(first) or []
                await s.adapter.hold(name)       # the Workload deactivated: MultiKueue removes the copy
                await _until("the copy's pod Terminating and the copy gone", lambda: fleet.kubectl(
                    first, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 60)
                await _hold_done(s, name, ns, record)
                await s.adapter.release(name)    # active again: Kueue re-reserves at once, dispatch waits
                waiting = f"{first}/{old_pod}"
                message = await _until("the check naming the worker's pod", lambda: _check_text(s, name, waiting))
                assert obs.alive(first), "the check waited, and the pod was still there to wait for"
                second = await s.running_in(obs, "2")
            assert obs.overlaps == [], obs.overlaps
            assert obs.admissions() == ["1", "2"], obs.seen
            status = await s.adapter.inspect(name)
            assert status.cluster == second and status.identity.admission == 2
            return first, second, [message]

    try:
        first, second, messages = asyncio.run(story())
        record.append(f"A=1 ran in {first}, A=2 in {second}; the check said: {messages[0]}")
    finally:
        print("\n".join(record))


async def _hold_done(s: Story, name: str, ns: str, record: list[str], after: float = 20.0) -> None:
    """Wait until Kueue finished the hold's eviction (the manager's quota released). If it has not after
    ``after`` seconds while no worker has a copy any more (MultiKueue deleted it before its last status was
    copied back: Kueue's race), do what dispatch's status then names, and record that it was needed."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < after:
        if _released(name):
            return
        await asyncio.sleep(0.5)
    copies = [w for w in ("worker-1", "worker-2")
              if fleet.kubectl(w, "get", "trainjob", name, "-n", ns, check=False).returncode == 0]
    status = await s.adapter.inspect(name)
    record.append(f"Kueue had not finished the eviction after {after:.0f}s (copies left: {copies or 'none'}); "
                  f"status said: {status.cause}")
    assert "lets Kueue finish" in str(status.cause), status.cause
    if not copies:
        fleet.kubectl("manager", "patch", "trainjob", name, "-n", ns, "--subresource=status", "--type=merge",
                      "-p", '{"status":{"jobsStatus":[]}}')
    await _until("Kueue to release the held Workload's quota", lambda: _released(name), 60)


def _released(name: str) -> bool:
    """The manager's Workload of ``name`` has no quota any more: Kueue finished the hold's eviction."""
    for line in _workloads_now().splitlines():
        w = json.loads(line)
        if w["name"].startswith(f"trainjob-{name}-"):
            return any(c[0] == "QuotaReserved" and c[1] == "False" for c in w["conditions"])
    return False


async def _check_text(s: Story, name: str, waiting: str) -> str | None:
    c = await _check(s.admin, name)
    message = str(c.get("message", ""))
    return message if c.get("state") == "Pending" and waiting in message else None


def test_a_partitioned_worker_holds_the_object_until_it_answers_or_is_confirmed_down(
        ns: str, controller_kubeconfig: Path) -> None:
    """worker-N's API server stops with A=1 running there; workerLostTimeout (20 s) passes. Kueue v0.19.2
    has done either of two things here: re-queued the Workload (then dispatch's check waits naming the
    unreadable worker until the operator confirms it down, and A=2 runs in the other worker), or kept it
    evicted with its quota, the lost copy's status still saying a Job is active (then nothing is dispatched
    until the worker answers again; once it does, MultiKueue deletes the copy and dispatch waits for its
    pod). Both are checked; which one happened is printed."""
    name = "fleet-s2"
    record: list[str] = []

    async def story() -> None:
        async with Story(ns, controller_kubeconfig) as s:
            await s.adapter.open(spec("s2"))
            with Observer(ns, name) as obs:
                lost = await s.running_in(obs, "1")
                other = next(w for w in obs.workers if w != lost)
                t0 = time.monotonic()
                fleet.partition(lost)
                healed = False
                try:
                    async def named() -> str | None:
                        c = await _check(s.admin, name)
                        text = str(c.get("message", ""))
                        return text if f"worker {lost} cannot be read" in text else None
                    try:
                        # Kueue re-queues (if it does) soon after workerLostTimeout (20 s); give it 45 s
                        message = await _until("dispatch's check naming the unreadable worker", named, 45)
                    except AssertionError:
                        message = ""
                    if message:
                        record.append(f"Kueue re-queued the Workload; {time.monotonic() - t0:.0f}s after the "
                                      f"partition dispatch's check said: {message}")
                        await asyncio.sleep(10)
                        assert obs.alive(other) == [], "dispatched again while the lost worker might run A=1"
                        obs.off.add(lost)  # the operator powers the lost worker's machines off, then confirms
                        assert (await s.adapter.worker_down(lost)).confirmed_down
                        await s.running_in(obs, "2")
                    else:
                        record.append("Kueue kept the Workload evicted with its quota for 45 s (the lost copy's "
                                      f"status still active): {await _check(s.admin, name)}")
                        assert obs.alive(other) == [], "dispatched again while the lost worker might run A=1"
                        fleet.heal(lost)
                        healed = True
                        t1 = time.monotonic()
                        where = await s.running_in(obs, "2", timeout=240)
                        record.append(f"after the heal, A=2 ran in {where} {time.monotonic() - t1:.0f}s later")
                finally:
                    if not healed:
                        fleet.heal(lost)
            assert obs.overlaps == [], obs.overlaps
            assert obs.admissions() == ["1", "2"], obs.seen

    try:
        asyncio.run(story())
    finally:
        print("\n".join(record))


def test_a_frozen_node_in_a_worker_holds_the_object_until_it_is_tainted_out_of_service_there(
        ns: str, controller_kubeconfig: Path) -> None:
    """The single-cluster rule, read from the worker: a pod on a worker's node that stops answering may run
    on; only that node tainted out-of-service in the worker (read from the worker) proves it stopped.
    dispatch in the worker (here one pass of its finalizer keeper, as the installed controller would take)
    frees the pod once that is proven."""
    from dispatch.testbed.harness import keeper_pass

    name, node = "fleet-s3", "node-2"
    record: list[str] = []

    async def story() -> None:
        async with Story(ns, controller_kubeconfig) as s:
            pinned = JobSpec(job_id="fleet", submission="s3", queue="lq", num_nodes=1,
                             resources_per_node={"cpu": "1", "memory": "1Gi"},
                             node_selector={"kubernetes.io/hostname": node})
            await s.adapter.open(pinned)
            with Observer(ns, name) as obs:
                worker = await s.running_in(obs, "1")
                fleet.freeze(worker, node)
                try:
                    await _until(f"{node} in {worker} to be Ready=Unknown", lambda: '"Unknown"' in fleet.kubectl(
                        worker, "get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')]"
                        ".status}").stdout.replace("Unknown", '"Unknown"'), 120)
                    await s.adapter.hold(name)
                    await _until("the copy gone", lambda: fleet.kubectl(
                        worker, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 90)
                    await _hold_done(s, name, ns, record)
                    await s.adapter.release(name)
                    message = await _until("the check naming the pod on the lost node", lambda: _check_text(
                        s, name, f"{worker}/"), 90)
                    record.append(f"dispatch's check: {message}")
                    assert "Ready=Unknown" in message or node in message, message
                    await asyncio.sleep(5)
                    assert [a for w in obs.workers for _, a in obs.alive(w) or [] if a == "2"] == []
                    fleet.kubectl(worker, "taint", "node", node,
                                  "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute", "--overwrite")
                    obs.off_nodes.add((worker, node))  # the node is down: what it ran has stopped

                    def freed() -> bool:
                        keeper_pass(ns, fleet.fleet().cluster(worker).kubeconfig)
                        return True
                    await asyncio.to_thread(freed)
                    await s.running_in(obs, "2")
                finally:
                    fleet.kubectl(worker, "taint", "node", node, "node.kubernetes.io/out-of-service-", check=False)
                    fleet.thaw(worker, node)
            assert obs.overlaps == [], obs.overlaps
            assert obs.admissions() == ["1", "2"], obs.seen

    try:
        asyncio.run(story())
    finally:
        print("\n".join(record))


async def _worker_guards(ns: str, tmp: Path, stack: contextlib.AsyncExitStack) -> dict[str, int]:
    """dispatch installed in each worker as deploy/ installs it, narrowed to ``ns``: its controller (guard and
    finalizer keeper) with the worker's own ``dispatch-controller`` role, the guard's webhook and CEL policies
    pointing at it. Returns each worker's guard port."""
    from dispatch.controller import _tls as g_
    from dispatch.testbed.harness import free_port, scoped

    ports: dict[str, int] = {}
    for worker in ("worker-1", "worker-2"):
        for part in ("namespace.yaml", "serviceaccount.yaml", "crd.yaml", "rbac.yaml"):
            fleet.kubectl(worker, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "deploy/base" / part))
        port, name = free_port(), f"dispatch-guard-{ns}"
        certs = tmp / worker
        ca = g_.generate_certs(certs, ["localhost", "127.0.0.1"]).ca_pem
        assert ca is not None
        hook, policy, binding = scoped(ns, port, name)
        for w in hook["webhooks"]:
            w["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
        for doc in (hook, policy, binding):
            fleet.kubectl(worker, "apply", "--server-side", "-f", "-", input=json.dumps(doc))
        path = tmp / f"{worker}.kubeconfig"
        path.write_text(_token_kubeconfig(worker, "dispatch-system", "dispatch-controller"))
        kube = k.Kube.connect(namespace=ns, kubeconfig=path)
        stack.push_async_callback(kube.aclose)
        ctl = Controller(kube, Config(namespace=ns, guard_port=port, guard_host="127.0.0.1",
                                      guard_cert_dir=str(certs), guard_webhook="", resync_seconds=30,
                                      multikueue_worker=True))
        stop = asyncio.Event()
        task = asyncio.create_task(ctl.run(stop))

        async def halt(stop: asyncio.Event = stop, task: asyncio.Task[None] = task, worker: str = worker,
                       name: str = name) -> None:
            stop.set()
            await asyncio.wait_for(task, 30)
            for kind, obj in (("validatingwebhookconfiguration", name), ("validatingadmissionpolicybinding", name),
                              ("validatingadmissionpolicy", name)):
                fleet.kubectl(worker, "delete", kind, obj, "--ignore-not-found", check=False)
        stack.push_async_callback(halt)
        await ctl.wait_synced()
        ports[worker] = port
    return ports


def test_dispatch_in_the_workers_lets_multikueues_copies_run_and_refuses_a_bypass(
        ns: str, controller_kubeconfig: Path, tmp_path: Path) -> None:
    """With dispatch's guard in every worker, MultiKueue's copies still start (the worker's Kueue admits them
    with the A the manager raised) through a re-admission, and a copy made by hand in a worker (Kueue's webhook
    there suspends it) is refused when someone starts it while the object runs there."""
    name = "fleet-s4"
    record: list[str] = []

    async def story() -> str:
        async with contextlib.AsyncExitStack() as stack:
            await _worker_guards(ns, tmp_path, stack)
            async with Story(ns, controller_kubeconfig) as s:
                await s.adapter.open(spec("s4"))
                with Observer(ns, name) as obs:
                    first = await s.running_in(obs, "1")
                    await s.adapter.hold(name)
                    await _until("the copy gone", lambda: fleet.kubectl(
                        first, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 60)
                    await _hold_done(s, name, ns, record)
                    await s.adapter.release(name)
                    second = await s.running_in(obs, "2")
                    copy = json.loads(fleet.kubectl(second, "get", "trainjob", name, "-n", ns, "-o", "json").stdout)
                    bypass = {"apiVersion": copy["apiVersion"], "kind": "TrainJob",
                              "metadata": {"name": "by-hand", "namespace": ns, "labels": copy["metadata"]["labels"],
                                           "annotations": copy["metadata"].get("annotations", {})},
                              "spec": {**copy["spec"], "suspend": False, "runtimePatches": [
                                  e for e in copy["spec"].get("runtimePatches", [])
                                  if e.get("manager") != "kueue.x-k8s.io/manager"]}}
                    # the worker's Kueue suspends a queued TrainJob it is given; starting it by hand is the bypass
                    # (kubectl off the event loop: the worker's guard answers from this very loop)
                    await asyncio.to_thread(fleet.kubectl, second, "create", "-f", "-", input=json.dumps(bypass))
                    refused = await asyncio.to_thread(
                        fleet.kubectl, second, "patch", "trainjob", "by-hand", "-n", ns, "--type=merge",
                        "-p", '{"spec":{"suspend":false}}', check=False)
                assert obs.overlaps == [], obs.overlaps
                assert obs.admissions() == ["1", "2"], obs.seen
                assert refused.returncode != 0, refused.stdout
                return refused.stderr.strip()

    try:
        said = asyncio.run(story())
        record.append(f"the worker's guard refused the hand-made copy: {said}")
    finally:
        print("\n".join(record))
    assert "trainjob by-hand cannot start" in said, said


def _worker_users(worker: str, ns: str, tmp: Path) -> dict[str, Path]:
    """Two users of ``ns`` in ``worker``: one holding the shipped ``dispatch-writer`` role (with
    ``dispatch-node-reader``), one Kubernetes' built-in ``edit``. Returns each one's kubeconfig (its token only)."""
    out: dict[str, Path] = {}
    for account, role in (("writer", "dispatch-writer"), ("editor", "edit")):
        fleet.kubectl(worker, "-n", ns, "create", "serviceaccount", account)
        fleet.kubectl(worker, "-n", ns, "create", "rolebinding", account, f"--clusterrole={role}",
                      f"--serviceaccount={ns}:{account}")
        path = tmp / f"{worker}-{account}.kubeconfig"
        path.write_text(_token_kubeconfig(worker, ns, account))
        out[account] = path
    return out


def test_a_writer_in_a_worker_cannot_re_create_multikueues_copy_beside_the_next_execution(
        ns: str, controller_kubeconfig: Path, tmp_path: Path) -> None:
    """Issue 34 (across clusters) on real control planes, with dispatch installed in every worker as the docs
    say (``--multikueue-worker``, the guard's webhooks and the shipped policies, ``deploy/worker``): A=1 runs in
    a worker as MultiKueue's copy, is held (MultiKueue deletes the copy) and released; A=2 runs. Then users of
    the worker where it does not run, one with the shipped ``dispatch-writer`` role and one with Kubernetes'
    ``edit``, create the A=1 copy there again as MultiKueue made it, started: the ``dispatch-identity`` policy
    refuses it (only MultiKueue's identity creates a copy). Without MultiKueue's labels (an object of the
    worker's own), started at once, the guard refuses it. No pod of A=1 runs beside A=2's."""
    name = "fleet-s7"
    record: list[str] = []

    async def story() -> dict[str, str]:
        said: dict[str, str] = {}
        async with contextlib.AsyncExitStack() as stack:
            await _worker_guards(ns, tmp_path, stack)
            async with Story(ns, controller_kubeconfig) as s:
                await s.adapter.open(spec("s7"))
                with Observer(ns, name) as obs:
                    first = await s.running_in(obs, "1")
                    copy = json.loads(fleet.kubectl(first, "get", "trainjob", name, "-n", ns, "-o", "json").stdout)
                    await s.adapter.hold(name)
                    await _until("the copy gone", lambda: fleet.kubectl(
                        first, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 60)
                    await _hold_done(s, name, ns, record)
                    await s.adapter.release(name)
                    second = await s.running_in(obs, "2")
                    target = next(w for w in obs.workers if w != second)
                    record.append(f"A=1 ran in {first}, A=2 runs in {second}; the writers act in {target}")
                    users = _worker_users(target, ns, tmp_path)
                    labels = copy["metadata"]["labels"]
                    unmarked = {key: v for key, v in labels.items()
                                if key not in (ORIGIN_LABEL, "kueue.x-k8s.io/prebuilt-workload-name")}
                    for account, path in users.items():
                        for how, these in (("copy", labels), ("unmarked", unmarked)):
                            # as MultiKueue creates it: the worker's Kueue adds its own runtime patch entry
                            body = {"apiVersion": copy["apiVersion"], "kind": "TrainJob",
                                    "metadata": {"name": name, "namespace": ns, "labels": these,
                                                 "annotations": copy["metadata"].get("annotations", {})},
                                    "spec": {**copy["spec"], "suspend": False, "runtimePatches": [
                                        e for e in copy["spec"].get("runtimePatches", [])
                                        if e.get("manager") != "kueue.x-k8s.io/manager"]}}
                            # kubectl off the event loop: the worker's guard answers from this very loop
                            got = await asyncio.to_thread(fleet.kubectl, target, "create", "-f", "-",
                                                          input=json.dumps(body), check=False, kubeconfig=path)
                            said[f"{account}/{how}"] = (got.stderr or got.stdout).strip()
                            if got.returncode == 0:
                                # without MultiKueue's labels it is an object of the worker's own: its queue-name
                                # label has the worker's Kueue suspend it at creation, and its start (Kueue's,
                                # once it admits its Workload there) is the guard's to refuse
                                assert how == "unmarked", f"{account} created the {how} TrainJob: {got.stdout}"

                                tj = json.loads(fleet.kubectl(target, "get", "trainjob", name, "-n", ns,
                                                              "-o", "json").stdout)
                                said[f"{account}/{how}"] += f" (suspend={tj['spec'].get('suspend')})"
                                assert tj["spec"]["suspend"] is True, tj["spec"]
                                fleet.kubectl(target, "delete", "trainjob", name, "-n", ns, "--wait=false")
                    assert obs.alive(target) == [], obs.alive(target)
                assert obs.overlaps == [], obs.overlaps
                assert obs.admissions() == ["1", "2"], obs.seen
        return said

    try:
        said = asyncio.run(story())
        record.extend(f"{who}: {text}" for who, text in sorted(said.items()))
    finally:
        print("\n".join(record))
    # the shipped dispatch-identity policy, renamed for this test's namespace (harness.scoped)
    assert "ValidatingAdmissionPolicy 'dispatch-guard-" in said["writer/copy"], said
    assert "only the identity MultiKueue writes this worker with creates one" in said["writer/copy"], said
    assert f"trainjob {name}" in said["writer/unmarked"] or "suspend=True" in said["writer/unmarked"], said
    # ``edit`` grants TrainJobs only where Trainer's roles aggregate into it: refused by RBAC or by dispatch
    for how in ("copy", "unmarked"):
        text = said[f"editor/{how}"]
        assert 'cannot create resource "trainjobs"' in text or (
            "dispatch-identity" in text if how == "copy" else f"trainjob {name} cannot start" in text), said


def test_a_worker_removed_from_the_manager_waits_until_the_operator_confirms_it_and_the_records_forget_it(
        ns: str, controller_kubeconfig: Path) -> None:
    """Issue 35 item 5 on real control planes: A=1 runs in a worker, is held, and that worker's MultiKueueCluster
    is deleted (decommissioned). The record remembers the worker: the check names it as removed and the way out;
    once its old pod is gone there, ``dispatch admin worker-down`` (as the cluster's admin) makes the record forget
    it, and the next A runs in the other worker, never beside the old one. The MultiKueueCluster is put back
    after, for the other scenarios."""
    name = "fleet-s6"
    record: list[str] = []

    async def story() -> None:
        async with Story(ns, controller_kubeconfig) as s:
            await s.adapter.open(spec("s6"))
            with Observer(ns, name) as obs:
                first = await s.running_in(obs, "1")
                other = next(w for w in obs.workers if w != first)
                saved = json.loads(fleet.kubectl("manager", "get", "multikueuecluster", first, "-o", "json").stdout)
                await s.adapter.hold(name)
                await _until("the copy gone", lambda: fleet.kubectl(
                    first, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 60)
                await _hold_done(s, name, ns, record)
                fleet.kubectl("manager", "delete", "multikueuecluster", first)
                try:
                    await s.adapter.release(name)
                    message = await _until("the check naming the removed worker", lambda: _check_text(
                        s, name, f"worker {first}, which the submission's identity record remembers"))
                    record.append(f"the check said: {message}")
                    assert "has no MultiKueueCluster any more (removed from the manager)" in message, message
                    await _until("the old pod gone in the removed worker", lambda: obs.alive(first) == [], 120)
                    got = await s.adapter.worker_down(first)
                    record.append(f"worker-down answered: {got.to_dict()}")
                    assert got.removed and f"{ns}/fleet/s6" in got.forgotten, got

                    def next_one() -> bool:
                        return any(a not in ("", "1") for _, a in obs.alive(other) or [])
                    await _until(f"the next A running in {other}", next_one, 180)
                finally:
                    meta = {key: saved["metadata"][key] for key in ("name", "labels", "annotations")
                            if key in saved["metadata"]}
                    fleet.kubectl("manager", "apply", "--server-side", "-f", "-", input=json.dumps(
                        {"apiVersion": saved["apiVersion"], "kind": saved["kind"], "metadata": meta,
                         "spec": saved["spec"]}))
            assert obs.overlaps == [], obs.overlaps
            assert obs.admissions()[0] == "1" and len(obs.admissions()) == 2, obs.seen

    try:
        asyncio.run(story())
    finally:
        print("\n".join(record))


# --------------------------------------------------------------------------------------------- a small campaign

FLEET_STEPS = {"hold-release": 3.0, "partition-heal": 2.0, "lost-heal": 2.0, "lost-power-off": 1.5}
"""What a round of the fleet campaign does to the object and to the worker it runs in, and the weights drawn by."""


@pytest.mark.slow
@pytest.mark.long
def test_a_small_fleet_campaign_never_runs_two_executions_and_a_only_rises(
        ns: str, controller_kubeconfig: Path, tmp_path: Path) -> None:
    """Issue 34: a seeded walk on the fleet, with dispatch installed in every worker: rounds drawn from
    ``FLEET_STEPS`` (a hold and release; the object's worker partitioned and healed before workerLostTimeout;
    lost past it and healed; lost past it and powered off, then confirmed down, at most once, the worker staying
    off until the end, when it rejoins as an operator must bring it back: ``rejoin``). The observer holds
    throughout (never two pods of the object alive in the fleet, A as dispatch issued it, rising by one per
    execution), and after every round the next execution runs. ``DISPATCH_FLEET_CAMPAIGN_SEED`` replays a seed
    (printed), ``DISPATCH_FLEET_CAMPAIGN_ROUNDS`` (4) sizes it."""
    import os
    import random

    seed = int(os.environ.get("DISPATCH_FLEET_CAMPAIGN_SEED") or random.SystemRandom().randrange(1 << 31))
    rounds = int(os.environ.get("DISPATCH_FLEET_CAMPAIGN_ROUNDS", "4"))
    rng = random.Random(seed)
    name = "fleet-s8"
    record: list[str] = [f"fleet campaign seed {seed}, {rounds} rounds"]

    async def lost_until_named(s: Story, where: str) -> str:
        """``where`` partitioned; dispatch's check naming it once Kueue re-queued the Workload, or ""."""
        fleet.partition(where)

        async def named() -> str | None:
            text = str((await _check(s.admin, name)).get("message", ""))
            return text if f"worker {where} cannot be read" in text else None
        try:
            return str(await _until("dispatch's check naming the unreadable worker", named, 45))
        except AssertionError:
            return ""

    async def running_or_named(s: Story, obs: Observer, a: str, timeout: float = 300) -> str:
        """The worker where A=``a`` runs; meanwhile, what dispatch's check names as the way out of a wait on an
        earlier JobSet's Job a worker's garbage collector left (``d.ORPHANED_JOB``) is done there, once, as the
        operator would (``kubectl delete job/...`` in that worker)."""
        done: set[tuple[str, str]] = set()

        async def step() -> str | None:
            for w in obs.workers:
                if any(pa == a for _, pa in obs.alive(w) or []):
                    return w
            text = str((await _check(s.admin, name)).get("message", ""))
            for found in re.finditer(rf"worker (\S+): job (\S+) {d.ORPHANED_JOB}", text):
                if found.groups() not in done:
                    done.add((found.group(1), found.group(2)))
                    fleet.kubectl(found.group(1), "delete", "job", found.group(2), "-n", ns, "--wait=false",
                                  check=False)
                    record.append(f"deleted job {found.group(2)} in {found.group(1)}, as the check named: {text}")
            return None
        found_in: str = await _until(f"a pod with A={a} in a worker", step, timeout)
        return found_in

    async def rejoin(obs: Observer, worker: str) -> None:
        """``worker``, confirmed down, is powered on again as an operator must do it. Its old copy is still in its
        API, admitted by its own Kueue; a real machine's kubelet would start that copy's pods again (JobSet's
        ``OnFailure``), and MultiKueue (Kueue v0.19.2), reaching the worker again, takes the copy admitted earliest
        for the admitted one and deletes the others: the current copy, while its cleanup never removes the old one
        (the manager's Workload still exists). So the worker leaves MultiKueue's config first, is powered on, its old
        copy is deleted there as its admin would (TrainJob, JobSet, Jobs, Workload), and it is put back once no pod
        of the object is left in it."""
        # off the event loop: the worker's guard (``_worker_guards``) answers from this very loop
        await asyncio.to_thread(fleet.detach, worker)
        try:
            await asyncio.to_thread(fleet.heal, worker)
            deletes = [(f"trainjob/{name}",), (f"jobset/{name}",),
                       ("jobs", "-l", f"jobset.sigs.k8s.io/jobset-name={name}"),
                       ("workloads", "-l", "kueue.x-k8s.io/multikueue-origin")]
            for what in deletes:
                await asyncio.to_thread(fleet.kubectl, worker, "delete", *what, "-n", ns, "--ignore-not-found",
                                        "--wait=false", check=False)
            await _until(f"the old pods in {worker} gone", lambda: obs.alive(worker) == [], 180)
        finally:
            await asyncio.to_thread(fleet.attach, worker)
        obs.off.discard(worker)

    async def story() -> int:
        async with contextlib.AsyncExitStack() as stack:
            await _worker_guards(ns, tmp_path, stack)
            async with Story(ns, controller_kubeconfig) as s:
                await s.adapter.open(spec("s8"))
                off = ""
                with Observer(ns, name) as obs:
                    a = 1
                    where = await s.running_in(obs, "1")
                    try:
                        for r in range(rounds):
                            steps = {k: w for k, w in FLEET_STEPS.items()
                                     if not (off and k in ("lost-heal", "lost-power-off"))}
                            step = rng.choices(list(steps), weights=list(steps.values()))[0]
                            t0 = time.monotonic()
                            if step == "hold-release":
                                await s.adapter.hold(name)
                                await _until("the copy gone", lambda w=where: fleet.kubectl(
                                    w, "get", "trainjob", name, "-n", ns, check=False).returncode != 0, 90)
                                await _hold_done(s, name, ns, record)
                                await s.adapter.release(name)
                            elif step == "partition-heal":
                                fleet.partition(where)
                                try:
                                    await asyncio.sleep(5)  # shorter than workerLostTimeout (20 s)
                                finally:
                                    fleet.heal(where)
                                assert any(pa == str(a) for _, pa in obs.alive(where) or []), obs.seen
                            else:
                                message = await lost_until_named(s, where)
                                if step == "lost-power-off" and message:
                                    obs.off.add(where)  # the operator powers it off, then confirms it down
                                    assert (await s.adapter.worker_down(where)).confirmed_down
                                    off = where
                                else:
                                    fleet.heal(where)
                                    step += " (healed)" if message else " (Kueue kept it evicted; healed)"
                            if step != "partition-heal":
                                a += 1
                                where = await running_or_named(s, obs, str(a))
                            record.append(f"round {r}: {step}, {time.monotonic() - t0:.0f}s; A={a} runs in {where}")
                            assert obs.overlaps == [], obs.overlaps
                    finally:
                        if off:
                            await rejoin(obs, off)
                            record.append(f"{off} taken out of MultiKueue's config, powered on, its old copy "
                                          "deleted there, its old pods gone, and put back")
                    assert any(pa == str(a) for _, pa in obs.alive(where) or []), obs.seen
                assert obs.overlaps == [], obs.overlaps
                assert obs.admissions() == [str(i) for i in range(1, a + 1)], obs.seen
                return a

    try:
        executions = asyncio.run(story())
        record.append(f"{executions} executions, 0 overlaps in {rounds} rounds")
    finally:
        print("\n".join(record))
