"""Issue 34, questions 2 and 3, on the testbed's real node: what a real kubelet writes, and what dispatch makes
of it, judged by the process oracle (what the real processes wrote), not by pod objects.

* an ephemeral container (``kubectl debug``) running on in a pod of a dispatch object whose own container
  ended under ``restartPolicy: Never``;
* a pod created by hand with dispatch's labels and ``spec.nodeName`` (no scheduler), before the guard;
* a static pod's mirror carrying dispatch's labels;
* the kubelet, containerd, or both restarted while a pod of a held object is Terminating in its grace period.

Every version of the pod the API server served while a process of it ran (a watch, each version stamped
when it arrived, on the host clock the processes write the oracle with) is read by ``PodView``: none may
read as ended before the process's last line. The statuses are printed, and docs/findings.md records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch import (
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    POD_FINALIZER,
    Adapter,
    AsyncAdapter,
    JobSpec,
    PodsRemain,
    Refused,
    testbed,
)
from dispatch import _api as api
from dispatch import _kube as k
from dispatch._views import PodView
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._metrics import Metrics
from dispatch.testbed import _cluster, _node, _paths, oracle, realnode
from dispatch.testbed.harness import (
    as_role,
    controller_env,
    free_port,
    probe_denied,
    role_kubeconfig_file,
    running_testbed_kubeconfig,
    scoped,
    subprocess_controller,
    until,
)
from dispatch.testing import ending_shape

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.long]  # each runs one to three minutes

Obj = dict[str, Any]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
POLICIES = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 namespaced=False, status=False)
BINDINGS = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False, status=False)
MIRROR = "kubernetes.io/config.mirror"


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def node(testbed_kubeconfig: str) -> str:
    name = testbed.real_node()
    if name is None:
        why = testbed.real_node_problem() or "unknown"
        if os.environ.get("CI", "").lower() == "true" or why.startswith("it failed to start"):
            pytest.fail(f"the testbed has no real node: {why}")
        pytest.skip(f"the testbed has no real node: {why}")
    return name


@pytest.fixture(scope="module")
def controller_kubeconfig(node: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig holding only the shipped ``dispatch-controller`` ServiceAccount's token."""
    from dispatch.testbed import _container

    _container.apply_deploy()
    token = testbed.kubectl("create", "token", "dispatch-controller", "-n", "dispatch-system",
                            "--duration=2h").stdout.strip()
    admin = json.loads(testbed.kubectl("config", "view", "--raw", "-o", "json").stdout)
    cluster = admin["clusters"][0]
    path = tmp_path_factory.mktemp("ctl") / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "controller", "user": {"token": token}}],
        "contexts": [{"name": "controller", "context": {"cluster": cluster["name"], "user": "controller"}}],
        "current-context": "controller"}))
    return path


@pytest.fixture
def ns(node: str) -> Iterator[str]:
    name = f"rq-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def adapter(ns: str, tmp_path: Path) -> Iterator[Adapter]:
    """The library as a user bound to the shipped dispatch-writer role in ``ns`` (and the node reader)."""
    with role_kubeconfig_file(ns, tmp_path) as path, Adapter.connect(ns, kubeconfig=str(path)) as a:
        yield a


@pytest.fixture
def admin_kubeconfig(ns: str, tmp_path: Path) -> Iterator[str]:
    """A kubeconfig of a cluster admin of dispatch: the shipped dispatch-admin role only (``release_pod``)."""
    with role_kubeconfig_file(ns, tmp_path, "dispatch-admin") as path:
        yield str(path)


def get(*args: str) -> Obj:
    out: Obj = json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)
    return out


def pods(ns: str, name: str) -> list[Obj]:
    items: list[Obj] = get("pods", "-n", ns, "-l", f"{JOBSET_LABEL}={name}")["items"]
    return items


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 90.0, poll: float = 0.3) -> Any:
    t0 = time.monotonic()
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def runtime(ns: str, oracle_dir: Path, *, pod_spec: Obj | None = None, **knobs: Any) -> None:
    """A namespaced runtime ``real`` whose pods run the workload on the real node (``pod_spec`` merged in)."""
    rt = realnode.training_runtime("real", oracle_dir, namespace=ns, **knobs)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(pod_spec or {})
    testbed.kubectl("apply", "-f", "-", input=json.dumps(rt))


def spec(name: str) -> JobSpec:
    job_id, submission = name.split("-")
    return JobSpec(job_id=job_id, submission=submission, runtime="real", runtime_kind="TrainingRuntime",
                   num_nodes=1)


def keeper_pass(ns: str, kubeconfig: Path) -> dict[str, str]:
    """One pass of the controller's finalizer keeper over the namespace's pods, as the controller."""

    async def go() -> dict[str, str]:
        kube = k.Kube.connect(namespace=ns, kubeconfig=kubeconfig)
        keeper = FinalizerKeeper(kube, Metrics.create())
        try:
            keeper.list_pods((await kube.list(k.PODS)).items)
            return {key: await keeper.release(key) for key in sorted(keeper.signatures)}
        finally:
            await kube.aclose()

    return asyncio.run(go())


def release_or_remaining(adapter: Adapter, name: str) -> int | str:
    try:
        return adapter.release(name).admission
    except PodsRemain as exc:
        return str(exc)


def now_ms() -> int:
    return int(time.time() * 1000)


def shape(obj: Obj) -> str:
    """One version of a pod, short: phase, deleting, each container's state (regular|init|ephemeral)."""
    status = obj.get("status") or {}

    def states(key: str) -> str:
        out = []
        for c in status.get(key) or []:
            state = c.get("state") or {}
            kind = next(iter(state), "-")
            detail = state.get(kind) or {}
            extra = ":".join(str(x) for x in (detail.get("reason"), detail.get("exitCode")) if x is not None)
            out.append(f"{c.get('name')}={kind}{'(' + extra + ')' if extra else ''}")
        return ",".join(out)
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "?")
    deleting = " deleting" if obj["metadata"].get("deletionTimestamp") else ""
    return (f"{status.get('phase')}{deleting} Ready={ready} [{states('containerStatuses')}]"
            + (f" init[{states('initContainerStatuses')}]" if status.get("initContainerStatuses") else "")
            + (f" eph[{states('ephemeralContainerStatuses')}]" if status.get("ephemeralContainerStatuses") else ""))


@dataclass(frozen=True)
class Version:
    """One version of a pod a watch delivered, and when it arrived (host clock, Unix ms)."""

    arrived_ms: int
    obj: Obj

    @property
    def ended(self) -> bool:
        """What the rule reads: its kubelet confirmed the pod's end."""
        return PodView.from_obj(self.obj).kubelet_confirmed


class PodWatch:
    """Every version of one pod the API server serves (``kubectl get -w``), as it arrives: the statuses the
    kubelet (and anyone else) wrote in between, which a poll would miss."""

    def __init__(self, ns: str, name: str) -> None:
        argv = [str(_cluster._bin_dir() / "kubectl"), f"--kubeconfig={_paths.kubeconfig_path()}", "get", "pod",
                name, "-n", ns, "-w", "--output-watch-events", "-o", "json"]
        self.versions: list[Version] = []
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            buf += line
            while buf.strip():
                try:
                    event, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                obj = event.get("object") if isinstance(event, dict) else None
                if isinstance(obj, dict) and obj.get("kind") == "Pod":
                    self.versions.append(Version(now_ms(), obj))

    def stop(self) -> list[Version]:
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)
        self._thread.join(5)
        return list(self.versions)


@contextlib.contextmanager
def watching(ns: str, name: str) -> Iterator[PodWatch]:
    w = PodWatch(ns, name)
    try:
        yield w
    finally:
        w.stop()


def timeline(versions: list[Version], t0_ms: int) -> list[str]:
    """Each distinct shape the watch delivered, with its arrival in seconds after ``t0_ms``."""
    out: list[str] = []
    last = ""
    for v in versions:
        s = shape(v.obj) + (" READ-AS-ENDED" if v.ended else "")
        if s != last:
            out.append(f"{(v.arrived_ms - t0_ms) / 1000:+.1f}s {s}")
            last = s
    return out


def false_ends(versions: list[Version], process: oracle.Process) -> list[str]:
    """The versions that arrived (so were written) before ``process``'s last line and read as ended."""
    end = process.ended_ms if process.ended_ms is not None else now_ms()
    return [f"rv {v.obj['metadata'].get('resourceVersion')}: {shape(v.obj)}" for v in versions
            if v.arrived_ms < end and v.ended]


def shim_of(pid: int) -> int:
    """The containerd shim a container's process runs under (its parent: runc leaves it to the shim)."""
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    assert argv and argv[0].endswith(b"containerd-shim-runc-v2"), f"the parent of {pid} is not a shim: {argv!r}"
    return ppid


def process_of(oracle_dir: Path, pod: str) -> list[oracle.Process]:
    return [p for p in oracle.processes(oracle.read(oracle_dir)) if p.pod == pod]


# ---------------------------------------------------------------- question 2a: an ephemeral container


def test_an_ephemeral_container_running_on_keeps_its_pod_unended_on_a_real_kubelet(
        adapter: Adapter, ns: str, node: str, tmp_path: Path, controller_kubeconfig: Path) -> None:
    """``kubectl debug`` adds an ephemeral container (the workload, writing the oracle as A=1, ignoring
    SIGTERM) to the pod of A=1; the pod's own container then exits 0 under ``restartPolicy: Never``. Observed on
    the real kubelet: see docs/findings.md. The object is held right after; nothing of dispatch reads the pod as
    ended while the debugger's process runs (every version the API server served, ``ceased``, ``release``, the
    keeper), and A=2 is admitted once it is gone."""
    runtime(ns, tmp_path, grace_period_seconds=30, lifetime="40s", exit_code=0,
            pod_spec={"restartPolicy": "Never"})
    adapter.open(spec("eph-s1"))
    assert adapter.release("eph-s1").admission == 1
    wait_for("A=1 runs", lambda: any(r.event == "TICK" and r.admission == "1" for r in oracle.read(tmp_path)), 90)
    pod = pods(ns, "eph-s1")[0]
    name = pod["metadata"]["name"]
    main = pod["spec"]["containers"][0]
    env = [e for e in main.get("env") or [] if e["name"] not in ("POD_NAME", "LIFETIME", "EXIT_CODE", "LINGER")]
    env += [{"name": "POD_NAME", "value": "debugger"}, {"name": "LINGER", "value": "1"}]
    custom = tmp_path / "debugger.json"
    custom.write_text(json.dumps({"env": env, "volumeMounts": [
        {"name": realnode.ORACLE_VOLUME, "mountPath": realnode.ORACLE_MOUNT}]}))
    with watching(ns, name) as watch:
        t0 = now_ms()
        got = testbed.kubectl("debug", name, "-n", ns, "--image", realnode.WORKLOAD_IMAGE,
                              "--image-pull-policy=Never", "--container=debugger", f"--target={main['name']}",
                              f"--custom={custom}", "--profile=general", "--", _node.WORKLOAD_PATH)
        print("KUBECTL DEBUG:", got.stdout.strip(), got.stderr.strip())
        wait_for("the debugger runs", lambda: any(p.alive for p in process_of(tmp_path, "debugger")), 60)
        [own] = [p for p in process_of(tmp_path, name) if p.admission == "1"]
        assert own.alive, "the pod's own container ended before the debugger started: lengthen its lifetime"
        wait_for("the pod's own container exits 0", lambda: not process_of(tmp_path, name)[0].alive, 90)
        time.sleep(2.0)  # the kubelet reports the exit
        print("JUST AFTER THE OWN CONTAINER'S EXIT:", shape(get("pod", name, "-n", ns)))
        # Held now, so that every verb is asked for real (a running object's ``ceased`` is false anyway): the
        # hold's delete comes while the kubelet is already killing the debugger for the pod's own end.
        adapter.hold("eph-s1")
        checks = 0
        while (debugger := process_of(tmp_path, "debugger")[0]).alive:
            assert now_ms() - t0 < 150_000, "the kubelet left the debugger running past the grace period"
            cessation = adapter.ceased("eph-s1")
            released_now = release_or_remaining(adapter, "eph-s1")
            outcome = keeper_pass(ns, controller_kubeconfig).get(f"{ns}/{name}", "gone")
            if cessation.ceased or not isinstance(released_now, str) or outcome != "unproven":
                # read as ended: right only if the debugger had ended by then (the calls take a second or so)
                assert not process_of(tmp_path, "debugger")[0].alive, (cessation, released_now, outcome)
                break
            checks += 1
            time.sleep(1.0)
        time.sleep(2.0)  # the kubelet's writes after the kill
    versions = watch.versions
    print("WHAT THE KUBELET WROTE (s after kubectl debug):", *timeline(versions, t0), sep="\n  ")
    print("DEBUGGER:", debugger, "OWN:", process_of(tmp_path, name)[0], "CHECKS WHILE IT RAN:", checks)
    assert checks > 0
    assert false_ends(versions, debugger) == []
    while_running = [v for v in versions if v.arrived_ms < (debugger.ended_ms or 0)
                     and (v.obj["status"].get("ephemeralContainerStatuses") or [])]
    assert while_running, "no status reported the debugger"
    print("THE LAST STATUS THE KUBELET WROTE:", json.dumps(versions[-1].obj["status"], indent=1))

    def admitted() -> int | None:
        keeper_pass(ns, controller_kubeconfig)
        got = release_or_remaining(adapter, "eph-s1")
        return got if isinstance(got, int) else None
    assert wait_for("A=2 once the debugger is gone", admitted, 90, poll=1.0) == 2
    oracle.assert_no_overlap(oracle.read(tmp_path))


# ---------------------------------------------------------------- question 3: restarts while Terminating


RESTARTS = {
    "kubelet": (("kubelet",), ("kubelet",)),
    "containerd": (("containerd",), ("containerd",)),
    "both": (("kubelet", "containerd"), ("containerd", "kubelet")),
    # containerd restarted while the container's shim does not answer (stopped): what containerd then reports,
    # and what the kubelet writes of it (an Unknown state becomes "terminated: ContainerStatusUnknown" in the
    # kubelet's status, with the very message of its last step for a terminal pod)
    "containerd-shim-stuck": (("shim", "containerd"), ("containerd", "shim")),
}
DOWN_SECONDS = 15.0
"""Past the node monitor's grace period: the node lifecycle controller writes its own Ready=False on the pod."""


@pytest.mark.parametrize("what", RESTARTS)
def test_a_restart_under_a_terminating_pod_is_no_end_on_a_real_kubelet(
        adapter: Adapter, ns: str, node: str, tmp_path: Path, admin_kubeconfig: str, controller_kubeconfig: Path,
        what: str) -> None:
    """A held object's pod in its grace period (60 s; the process ignores SIGTERM); the kubelet, containerd or
    both stopped for 15 s and started again, as the campaign's faults do. No status written in between reads as
    an end (every version the API server served, ``ceased``, ``release``, ``release-pod``, the keeper) while
    the process runs; A=2 is admitted once it is gone. The process oracle judges."""
    stop, start = RESTARTS[what]
    runtime(ns, tmp_path, grace_period_seconds=60, linger=True)
    adapter.open(spec("rst-s1"))
    assert adapter.release("rst-s1").admission == 1
    wait_for("A=1 runs", lambda: any(r.event == "TICK" and r.admission == "1" for r in oracle.read(tmp_path)), 90)
    name = pods(ns, "rst-s1")[0]["metadata"]["name"]
    events: list[str] = []
    with watching(ns, name) as watch:
        t0 = now_ms()
        adapter.hold("rst-s1")
        wait_for("the pod Terminating", lambda: "deletionTimestamp" in get("pod", name, "-n", ns)["metadata"], 60)
        wait_for("SIGTERM reached the process", lambda: any(p.termed_ms for p in process_of(tmp_path, name)), 30)
        stopped = False
        shim = 0
        try:
            for component in stop:
                if component == "shim":
                    shim = shim_of(process_of(tmp_path, name)[0].pid)
                    os.kill(shim, signal.SIGSTOP)
                else:
                    testbed.stop_component(component)
                events.append(f"{(now_ms() - t0) / 1000:+.1f}s {component} stopped")
            stopped = True
            down_until = time.monotonic() + DOWN_SECONDS
            while time.monotonic() < down_until:
                assert not adapter.ceased("rst-s1").ceased
                assert isinstance(release_or_remaining(adapter, "rst-s1"), str)
                time.sleep(1.0)
        finally:
            restarting_ms = now_ms()
            for component in start:
                if component == "shim":
                    if shim:
                        time.sleep(10.0)  # containerd's restore has given up on it by now
                        os.kill(shim, signal.SIGCONT)
                else:
                    testbed.start_component(component)
                events.append(f"{(now_ms() - t0) / 1000:+.1f}s {component} started" if stopped else
                              f"{component} started after a failed stop")
        checks = 0
        while any(p.alive for p in process_of(tmp_path, name)):
            assert now_ms() - t0 < 200_000, "the process outlived its grace period by far"
            cessation = adapter.ceased("rst-s1")
            assert not cessation.ceased, cessation.reason
            assert isinstance(release_or_remaining(adapter, "rst-s1"), str)
            outcome = keeper_pass(ns, controller_kubeconfig).get(f"{ns}/{name}", "gone")
            assert outcome == "unproven", outcome
            with Adapter.connect(ns, kubeconfig=admin_kubeconfig) as admin, pytest.raises(Refused):
                admin.release_pod(name)
            checks += 1
            time.sleep(1.0)
        [process] = [p for p in process_of(tmp_path, name) if p.admission == "1"]
        events.append(f"{(process.ended_ms or 0) - t0:+d}ms the process ended ({process})")
        time.sleep(2.0)
    versions = watch.versions
    print(f"RESTART {what}:", *events, sep="\n  ")
    print("WHAT THE API SERVED (s after the hold):", *timeline(versions, t0), sep="\n  ")
    if what == "containerd-shim-stuck" and checks == 0:
        # Seen on kubelet v1.37.2 / containerd: containerd, started again while the shim does not answer, gave up
        # on it after about 10 s and the process was killed within that start (so nothing was left to check
        # after it); the kubelet then wrote terminated (ContainerStatusUnknown, 255) and Failed, after the end
        assert process.ended_ms is not None and process.ended_ms >= restarting_ms, \
            "the process ended before containerd was started again: the stop alone ended it"
    else:
        assert checks > 0, "the process ended before the restart's writes could be checked"
    assert false_ends(versions, process) == []
    taken: list[str] = []

    def way_out() -> int | None:
        keeper_pass(ns, controller_kubeconfig)
        result = release_or_remaining(adapter, "rst-s1")
        if isinstance(result, int):
            return result
        if "--process-gone" in result and not taken:
            with Adapter.connect(ns, kubeconfig=admin_kubeconfig) as admin:
                try:
                    taken.append(admin.release_pod(name, process_gone=True).proof)
                except Refused as exc:
                    assert exc.reason in ("Unproven", "KubeletNotReported", "NodeNotReady"), exc
        return None
    assert wait_for("A=2 once the process is gone", way_out, 120, poll=1.0) == 2
    last = [v for v in versions if v.obj["metadata"]["name"] == name][-1]
    print("WAY OUT:", taken or ["its kubelet's own end"], "LAST STATUS:", json.dumps(ending_shape(last.obj["status"])))
    oracle.assert_no_overlap(oracle.read(tmp_path))


# ---------------------------------------------------------------- questions 2b and 2c: under the guard


@dataclass
class Guarded:
    kube: k.Kube
    ns: str
    adapter: AsyncAdapter


@pytest.fixture
async def guarded(node: str, tmp_path: Path) -> AsyncIterator[Guarded]:
    """The shipped guard narrowed to a fresh namespace, served by ``python -m dispatch.controller`` with the
    shipped controller role (which also runs the finalizer keeper), and a ``dispatch-writer`` of it."""
    path = running_testbed_kubeconfig()
    assert path is not None
    async with controller_env(path) as (kube, ns, _):
        port, name = free_port(), f"dispatch-guard-{ns}"
        hook, policy, binding = scoped(ns, port, name)
        await kube.create(api.VALIDATING_WEBHOOKS, hook)
        await kube.create(POLICIES, policy)
        await kube.create(BINDINGS, binding)
        try:
            async with subprocess_controller(ns, "--guard-port", str(port), "--guard-cert-dir",
                                             str(tmp_path / "certs"), "--guard-webhook", name,
                                             log=tmp_path / "controller.log"), as_role(kube, ns) as writer:
                async def published() -> bool:
                    got = await kube.get(api.VALIDATING_WEBHOOKS, name)
                    return all(w["clientConfig"].get("caBundle") for w in got["webhooks"])
                await until(published, what="the guard's CA in the caBundle")
                await until(lambda: probe_denied(kube, ns), what="the guard answering")
                yield Guarded(kube, ns, AsyncAdapter(writer))
        finally:
            await kube.delete(BINDINGS, name)
            await kube.delete(POLICIES, name)
            await kube.delete(api.VALIDATING_WEBHOOKS, name)


def bound(ns: str, account: str, role: str) -> str:
    """A ServiceAccount of ``ns`` bound in ``ns`` to the ClusterRole ``role``; the ``--as`` flag acting as it."""
    testbed.kubectl("create", "serviceaccount", account, "-n", ns)
    testbed.kubectl("create", "rolebinding", account, "-n", ns, f"--clusterrole={role}",
                    f"--serviceaccount={ns}:{account}")
    return f"--as=system:serviceaccount:{ns}:{account}"


def editor(ns: str) -> str:
    """A user of Kubernetes' built-in ``edit`` role in ``ns`` (it may create pods)."""
    return bound(ns, "editor", "edit")


def hand_made_pod(name: str, ns: str, oracle_dir: Path, node: str, *, job_id: str, submission: str, a: str,
                  finalizer: bool = True, extra_labels: dict[str, str] | None = None) -> Obj:
    """A pod as a user with ``create pods`` could write it: dispatch's labels (and finalizer), bound by
    ``spec.nodeName`` past the scheduler, running the workload as A=``a`` (its environment says so)."""
    pod = realnode.workload_pod(name, ns, oracle_dir, grace_period_seconds=5, labels={
        LABEL_JOB_ID: job_id, LABEL_SUBMISSION: submission, LABEL_ADMISSION: a, **(extra_labels or {})},
        env={"DISPATCH_JOB_ID": job_id, "DISPATCH_SUBMISSION": submission, "DISPATCH_ADMISSION": a})
    pod["spec"]["nodeName"] = node
    if finalizer:
        pod["metadata"]["finalizers"] = [POD_FINALIZER]
    return pod


def create_as(who: str, obj: Obj) -> subprocess.CompletedProcess[str]:
    return testbed.kubectl(who, "create", "-f", "-", input=json.dumps(obj), check=False)


async def a_release(g: Guarded, name: str) -> int | str:
    try:
        return (await g.adapter.release(name)).admission
    except PodsRemain as exc:
        return str(exc)


async def released(g: Guarded, name: str, timeout: float = 120) -> int:
    """``release``, again while it names pods that remain (their end is proven later) or unconfirmed Jobs."""
    got: list[int] = []

    async def once() -> bool:
        r = await a_release(g, name)
        if isinstance(r, int):
            got.append(r)
        return bool(got)
    await until(once, timeout=timeout, what=f"{name} admitted", poll=1.0)
    return got[0]


async def test_a_pod_made_by_hand_with_dispatchs_labels_and_a_node_name_meets_the_guard(
        guarded: Guarded, node: str, tmp_path: Path) -> None:
    """Question 2b: the shipped ``dispatch-writer`` may not create pods at all; Kubernetes' ``edit`` may. A pod
    it writes with dispatch's labels and ``spec.nodeName`` (no scheduler) reaches the pod guard all the same
    (admission comes before binding matters): refused without dispatch's finalizer, and refused while a pod
    of the submission may run, whatever its A. Once nothing of the submission runs, the guard admits it (it
    cannot tell a hand-made pod from the Job controller's), the real kubelet runs it, and it counts among the
    object's pods: the next ``release`` is refused until its end is proven. The oracle judges."""
    g = guarded
    await asyncio.to_thread(runtime, g.ns, tmp_path)
    await g.adapter.open(spec("hand-s1"))
    assert await released(g, "hand-s1") == 1
    await until(lambda: asyncio.to_thread(lambda: any(r.event == "TICK" for r in oracle.read(tmp_path))),
                what="A=1 runs", timeout=90)
    [running] = await asyncio.to_thread(pods, g.ns, "hand-s1")
    as_editor = await asyncio.to_thread(editor, g.ns)
    as_writer = await asyncio.to_thread(bound, g.ns, "writer-probe", "dispatch-writer")
    refused: dict[str, str] = {}

    writer_try = await asyncio.to_thread(create_as, as_writer, hand_made_pod(
        "by-writer", g.ns, tmp_path, node, job_id="hand", submission="s1", a="2"))
    refused["a dispatch-writer"] = writer_try.stderr.strip()
    assert writer_try.returncode != 0 and "forbidden" in writer_try.stderr.lower()
    cases = {
        "no finalizer": hand_made_pod("no-finalizer", g.ns, tmp_path, node, job_id="hand", submission="s1", a="2",
                                      finalizer=False),
        "another A beside A=1": hand_made_pod("other-a", g.ns, tmp_path, node, job_id="hand", submission="s1",
                                              a="2"),
        "A=1 again, its rank unknown": hand_made_pod("same-a", g.ns, tmp_path, node, job_id="hand",
                                                     submission="s1", a="1"),
        "a copy of A=1's pod (same rank)": hand_made_pod(
            "same-rank", g.ns, tmp_path, node, job_id="hand", submission="s1", a="1",
            extra_labels={key: v for key, v in running["metadata"]["labels"].items()
                          if key not in (LABEL_JOB_ID, LABEL_SUBMISSION, LABEL_ADMISSION)}),
    }
    for case, body in cases.items():
        got = await asyncio.to_thread(create_as, as_editor, body)
        refused[case] = got.stderr.strip()
        assert got.returncode != 0, f"{case}: created while A=1 runs"
        assert "denied the request" in got.stderr, got.stderr
    print("REFUSED:", json.dumps(refused, indent=1))

    # A pod posing as a static pod's mirror (the kubelet's annotation), which the guard admits: no kubelet runs
    # a pod that comes from the API with that annotation; the real one deletes it as an orphaned mirror.
    posing = hand_made_pod("posing", g.ns, tmp_path, node, job_id="hand", submission="s1", a="2", finalizer=False)
    posing["metadata"]["annotations"] = {MIRROR: "posing"}
    made_posing = await asyncio.to_thread(create_as, as_editor, posing)
    print("A POD POSING AS A MIRROR:", made_posing.returncode, made_posing.stdout.strip(), made_posing.stderr.strip())
    if made_posing.returncode == 0:
        async def posing_gone() -> bool:
            return await g.kube.get_or_none(k.PODS, "posing") is None
        with contextlib.suppress(AssertionError, TimeoutError):
            await until(posing_gone, what="the kubelet deletes the posing mirror", timeout=40)
        left = await g.kube.get_or_none(k.PODS, "posing")
        print("THE POSING MIRROR 40 s ON:", "gone" if left is None else shape(left))
        assert not any(r.pod == "posing" for r in oracle.read(tmp_path)), "a kubelet ran a pod posing as a mirror"
        if left is not None:
            await g.kube.delete(k.PODS, "posing")

    await g.adapter.hold("hand-s1")

    async def a1_gone() -> bool:
        return not any(p.alive for p in await asyncio.to_thread(lambda: oracle.processes(oracle.read(tmp_path))))
    await until(a1_gone, what="A=1's process gone", timeout=120)

    async def a1_pod_gone() -> bool:
        return not await asyncio.to_thread(pods, g.ns, "hand-s1")
    await until(a1_pod_gone, what="A=1's pod freed by the keeper and gone", timeout=120)
    forged = hand_made_pod("forged", g.ns, tmp_path, node, job_id="hand", submission="s1", a="1")
    made = await asyncio.to_thread(create_as, as_editor, forged)
    print("WITH NOTHING OF THE SUBMISSION RUNNING, THE GUARD SAID:", made.returncode, made.stdout.strip(),
          made.stderr.strip())
    if made.returncode == 0:
        await until(lambda: asyncio.to_thread(lambda: any(p.pod == "forged" and p.alive for p in
                                                          oracle.processes(oracle.read(tmp_path)))),
                    what="the hand-made pod's process runs", timeout=60)
        blocked = await a_release(g, "hand-s1")
        print("RELEASE WHILE IT RUNS:", blocked)
        assert isinstance(blocked, str) and "forged" in blocked
        await asyncio.to_thread(testbed.kubectl, "delete", "pod", "forged", "-n", g.ns, "--wait=false")
    assert await released(g, "hand-s1") == 2
    oracle.assert_no_overlap(oracle.read(tmp_path))


def static_manifest(name: str, ns: str, oracle_dir: Path, *, job_id: str, submission: str, a: str) -> Obj:
    """A static pod as a node's administrator writes it: dispatch's labels and finalizer, the workload as A=``a``."""
    pod = realnode.workload_pod(name, ns, oracle_dir, grace_period_seconds=5, labels={
        LABEL_JOB_ID: job_id, LABEL_SUBMISSION: submission, LABEL_ADMISSION: a},
        env={"DISPATCH_JOB_ID": job_id, "DISPATCH_SUBMISSION": submission, "DISPATCH_ADMISSION": a})
    pod["metadata"]["finalizers"] = [POD_FINALIZER]
    for key in ("nodeSelector", "tolerations"):
        pod["spec"].pop(key, None)  # a static pod is bound to its node by being in its directory
    return pod


async def test_a_static_pods_mirror_with_dispatchs_labels_on_a_real_kubelet(
        guarded: Guarded, node: str, tmp_path: Path) -> None:
    """Question 2c: a static pod on the real node (its kubelet's ``staticPodPath``) carrying dispatch's labels
    and finalizer, for an object opened but not yet released. Its process runs whatever the API says; its mirror
    pod counts among the object's pods, so ``release`` is refused while it runs; a delete of the mirror stops
    nothing (the kubelet runs the static pod on), and the mirror stays Terminating under dispatch's finalizer,
    read as running. Removing the manifest ends the process; what the kubelet then writes on the mirror, and
    whether the object is left blocked, is recorded."""
    g = guarded
    manifests = await asyncio.to_thread(_node.static_pod_dir)
    await asyncio.to_thread(runtime, g.ns, tmp_path)
    await g.adapter.open(spec("stat-s1"))
    path = manifests / f"{g.ns}-static.json"
    body = static_manifest("static", g.ns, tmp_path, job_id="stat", submission="s1", a="0")
    path.write_text(json.dumps(body))
    mirror_name = f"static-{node}"
    try:
        await until(lambda: asyncio.to_thread(lambda: any(p.pod.startswith("static") and p.alive for p in
                                                          oracle.processes(oracle.read(tmp_path)))),
                    what="the static pod's process runs", timeout=90)

        async def mirror() -> Obj | None:
            return await g.kube.get_or_none(k.PODS, mirror_name)
        await until(mirror, what="its mirror pod in the API", timeout=60)
        seen = await mirror()
        assert seen is not None
        print("MIRROR:", json.dumps({"annotations": seen["metadata"].get("annotations"),
                                     "finalizers": seen["metadata"].get("finalizers"),
                                     "ownerReferences": seen["metadata"].get("ownerReferences"),
                                     "status": ending_shape(seen.get("status") or {})}, indent=1))
        blocked = await a_release(g, "stat-s1")
        print("RELEASE WHILE THE STATIC POD RUNS:", blocked)
        assert isinstance(blocked, str) and mirror_name in blocked
        await g.kube.delete(k.PODS, mirror_name)
        await asyncio.sleep(15)  # a kubelet sync period and more: the process runs on
        assert any(p.alive for p in oracle.processes(oracle.read(tmp_path)) if p.pod.startswith("static"))
        after_delete = await mirror()
        print("MIRROR AFTER ITS DELETE:", after_delete and (after_delete["metadata"].get("deletionTimestamp"),
                                                            ending_shape(after_delete.get("status") or {})))
        assert after_delete is not None, "the mirror left the API while its static pod runs"
        assert isinstance(await a_release(g, "stat-s1"), str)
    finally:
        path.unlink(missing_ok=True)
    await until(lambda: asyncio.to_thread(lambda: not any(
        p.alive for p in oracle.processes(oracle.read(tmp_path)) if p.pod.startswith("static"))),
        what="the static pod's process ended once its manifest went", timeout=90)
    await asyncio.sleep(15)
    left = await g.kube.get_or_none(k.PODS, mirror_name)
    final = await a_release(g, "stat-s1")
    print("ONCE THE MANIFEST WENT: MIRROR", left and (left["metadata"].get("deletionTimestamp"),
                                                     json.dumps(left.get("status"))), "RELEASE:", final)
    if isinstance(final, str):
        # What ends the wait: the operator removes dispatch's finalizer as a cluster admin.
        await g.kube.merge_patch(k.PODS, mirror_name, {"metadata": {"finalizers": None}})
        final = await released(g, "stat-s1")
    assert final == 1
    oracle.assert_no_overlap(oracle.read(tmp_path))


def kubelet_log_lines(word: str, since: int) -> list[str]:
    """The real kubelet's log lines from byte ``since`` on that mention ``word``."""
    path = _paths.runtime_dir() / "logs" / "kubelet.log"
    with path.open("rb") as f:
        f.seek(since)
        return [line.decode(errors="replace").strip()[:400] for line in f if word.encode() in line]


async def test_a_static_pod_started_beside_a_running_execution_is_seen_through_its_mirror(
        guarded: Guarded, node: str, tmp_path: Path) -> None:
    """Question 2c, second part: a static pod with dispatch's labels appears on the node while A=1 of the object
    runs. The kubelet runs it whatever the API says; a webhook can refuse only its mirror, which would hide its
    process from the rule (the next release would admit beside it). The guard admits every mirror pod, so the
    static pod counts among the object's pods and the release after a hold is refused while it runs."""
    g = guarded
    manifests = await asyncio.to_thread(_node.static_pod_dir)
    await asyncio.to_thread(runtime, g.ns, tmp_path)
    await g.adapter.open(spec("side-s1"))
    assert await released(g, "side-s1") == 1
    await until(lambda: asyncio.to_thread(lambda: any(r.event == "TICK" for r in oracle.read(tmp_path))),
                what="A=1 runs", timeout=90)
    log = _paths.runtime_dir() / "logs" / "kubelet.log"
    since = log.stat().st_size if log.exists() else 0
    path = manifests / f"{g.ns}-beside.json"
    path.write_text(json.dumps(static_manifest("beside", g.ns, tmp_path, job_id="side", submission="s1", a="0")))
    mirror_name = f"beside-{node}"
    try:
        await until(lambda: asyncio.to_thread(lambda: any(p.pod.startswith("beside") and p.alive for p in
                                                          oracle.processes(oracle.read(tmp_path)))),
                    what="the static pod's process runs", timeout=90)

        async def mirror() -> bool:
            return await g.kube.get_or_none(k.PODS, mirror_name) is not None
        try:
            await until(mirror, what="its mirror pod in the API", timeout=60)
        finally:
            print("THE KUBELET ON THE MIRROR:", *(kubelet_log_lines("beside", since) or ["(nothing)"])[-6:],
                  sep="\n  ")
        await g.adapter.hold("side-s1")

        async def a1_gone() -> bool:
            return not any(p.alive and p.admission == "1" for p in await asyncio.to_thread(
                lambda: oracle.processes(oracle.read(tmp_path))))
        await until(a1_gone, what="A=1's process gone", timeout=120)
        await asyncio.sleep(5)
        blocked = await a_release(g, "side-s1")
        print("RELEASE WHILE THE STATIC POD RUNS:", blocked)
        assert isinstance(blocked, str) and mirror_name in blocked
    finally:
        path.unlink(missing_ok=True)
    await until(lambda: asyncio.to_thread(lambda: not any(
        p.alive for p in oracle.processes(oracle.read(tmp_path)) if p.pod.startswith("beside"))),
        what="the static pod's process ended once its manifest went", timeout=90)
    with contextlib.suppress(Exception):  # the way out of a mirror left behind (recorded by the test above)
        await asyncio.sleep(10)
        if await g.kube.get_or_none(k.PODS, mirror_name) is not None:
            await g.kube.merge_patch(k.PODS, mirror_name, {"metadata": {"finalizers": None}})
    assert await released(g, "side-s1") == 2
    # The static pod (A=0) ran beside A=1 by construction: its node's administrator started it, nothing of
    # dispatch did. A=2 never ran beside it.
    found = oracle.overlaps(oracle.read(tmp_path))
    assert all({o.first.admission, o.second.admission} == {"0", "1"} for o in found), [str(o) for o in found]
