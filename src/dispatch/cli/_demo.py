"""``dispatch demo``: the seed's story, told by the real library against the local real control plane.

Part 1, a reachable node: a TrainJob runs (A=1); it is held; its pod stays Terminating (the testbed's
KWOK keeps a deleted pod for a delay taken from a pod annotation, as a kubelet takes up to the grace
period); release is refused naming the pod; the pod goes; release admits with A=2 and the new pod
carries ``admission=2``.

Part 2, a lost node: a second TrainJob runs on a freezable node; the node's kubelet is frozen, so the
node goes ``Ready=Unknown`` and the held object's pod stays Terminating for good; ``ceased`` is false and
release is refused; the operator taints the node out-of-service; ``ceased`` is true; release admits.

All along, an independent observer lists the namespace's pods and fails the demo if two admission
numbers of one object ever had Running pods at the same time.

With ``--real-node`` both parts run on the testbed's real node (a real kubelet, containerd and runc):
real processes get SIGTERM and write on through their grace period, part 2's lost node is a kubelet
stopped by SIGSTOP whose container keeps running until the machine "goes down" (the testbed kills its
containers), and the process oracle (what the processes themselves wrote) is the judge.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .._adapter import Adapter
from .._api import Obj
from .._names import JOBSET_NAME_LABEL, LABEL_ADMISSION, OUT_OF_SERVICE_TAINT
from .._records import JobSpec, State, Status
from ..errors import PodsRemain
from ._output import status_table
from ._release import release_wait
from ._state import CliState

DELETE_DELAY = "20s"
"""How long the testbed keeps the first object's deleted pod Terminating (a kubelet's grace period)."""


class DemoFailed(Exception):
    """A step did not happen as the story says, or the promise was broken."""


# ----------------------------------------------------------------------------------------- plumbing


def _testbed() -> Any:
    from .. import testbed

    return testbed


def _kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    proc = _testbed().kubectl(*args, input=input, check=check)
    return str(proc.stdout)


def _get(*args: str) -> Obj:
    data: Obj = json.loads(_kubectl("get", *args, "-o", "json"))
    return data


def _pods(namespace: str, name: str) -> list[Obj]:
    items: list[Obj] = _get("pods", "-n", namespace, "-l", f"{JOBSET_NAME_LABEL}={name}")["items"]
    return items


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _deleting(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _node_ready(node: str) -> str:
    for cond in (_get("node", node).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return "missing"


@dataclass
class Watcher:
    """An independent observer: every half second, which admissions of each object have Running pods."""

    namespace: str
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dispatch-demo-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def check(self) -> None:
        """One look at the namespace's pods (Terminating ones included: their processes may still run)."""
        try:
            pods = _get("pods", "-n", self.namespace)["items"]
        except Exception:  # the observer must not die on a transient kubectl failure
            return
        self.samples += 1
        running: dict[str, dict[str, list[str]]] = {}
        for pod in pods:
            if not _running(pod):
                continue
            labels = _labels(pod)
            obj = labels.get(JOBSET_NAME_LABEL, "?")
            running.setdefault(obj, {}).setdefault(labels.get(LABEL_ADMISSION, "?"), []).append(
                str(pod["metadata"]["name"])
            )
        for obj, by_admission in running.items():
            if len(by_admission) > 1:
                detail = "; ".join(f"A={a}: {', '.join(p)}" for a, p in sorted(by_admission.items()))
                self.violations.append(f"{datetime.now():%H:%M:%S} {obj} has two executions running: {detail}")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check()
            self._stop.wait(0.5)


@dataclass
class Story:
    """The demo's narrator and its helpers."""

    console: Console
    adapter: Adapter
    namespace: str
    step_timeout: float
    watcher: Watcher
    n: int = 0
    runtime: str | None = None
    """A namespaced TrainingRuntime the objects run (``--real-node``: the real node's workload)."""
    oracle_dir: Path | None = None
    """Where the real processes write their lives (``--real-node``)."""
    powered_off: bool = False
    """The real node's power is cut (a failure must power it on, not thaw it)."""
    operator: Adapter | None = None
    """The operator's adapter (``dispatch-admin``), for ``release-pod``; ``adapter`` is a ``dispatch-writer``'s."""

    def spec(self, submission: str) -> JobSpec:
        extra: dict[str, Any] = {"runtime": self.runtime, "runtime_kind": "TrainingRuntime"} if self.runtime else {}
        return JobSpec(job_id="demo", submission=submission, num_nodes=1,
                       resources_per_node={"cpu": "1", "memory": "1Gi"}, **extra)

    def processes(self, submission: str, what: str) -> None:
        """Say what the real processes of ``submission`` wrote, and fail if two processes of one
        submission (any of the demo's) were ever alive at once."""
        if self.oracle_dir is None:
            return
        from ..testbed import oracle

        records = oracle.read(self.oracle_dir)
        for proc in oracle.processes(records):
            if proc.submission == submission:
                self.say(f"[dim]process oracle ({what}):[/] {escape(str(proc))}")
        found = oracle.overlaps(records)
        if found:
            raise DemoFailed("two processes of one submission ran at once: " + " | ".join(map(str, found)))

    # ------------------------------------------------------------------ narration

    def step(self, text: str) -> None:
        self.n += 1
        self.console.print(f"\n[dim]{datetime.now():%H:%M:%S}[/] [bold cyan]{self.n:>2}.[/] [bold]{text}[/]")

    def say(self, text: str) -> None:
        self.console.print(f"    {text}", highlight=False)

    def show(self, status: Status) -> None:
        self.console.print(status_table([status]))

    def promise(self) -> None:
        if self.watcher.violations:
            raise DemoFailed("the promise was broken: " + " | ".join(self.watcher.violations))

    def until(self, what: str, check: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.step_timeout)
        while not check():
            self.promise()
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out after {timeout or self.step_timeout:g}s waiting for {what}")
            time.sleep(0.5)
        self.promise()

    # ------------------------------------------------------------------ actions

    def open_on(self, spec: JobSpec, node: str, annotations: dict[str, str]) -> str:
        """Open held, its pods pinned to ``node`` (and carrying ``annotations``) through the JobSpec itself."""
        pinned = dataclasses.replace(spec, node_selector={"kubernetes.io/hostname": node},
                                     pod_annotations={**spec.pod_annotations, **annotations})
        status = self.adapter.open(pinned, hold=True)
        self.show(status)
        extra = f", pod annotations {annotations}" if annotations else ""
        self.say(f"pinned its pods to {node} (node selector{extra})")
        return status.name

    def running_pod(self, name: str, admission: int) -> Obj:
        """Wait for a Running, not Terminating pod of execution ``admission``; check its label."""
        found: list[Obj] = []

        def check() -> bool:
            found[:] = [p for p in _pods(self.namespace, name) if _running(p) and not _deleting(p)
                        and _labels(p).get(LABEL_ADMISSION) == str(admission)]
            return bool(found)

        self.until(f"a Running pod of {name} with {LABEL_ADMISSION}={admission}", check)
        pod = found[0]
        self.say(
            f"pod {pod['metadata']['name']} Running on {pod['spec'].get('nodeName')} with label "
            f"{LABEL_ADMISSION}={_labels(pod).get(LABEL_ADMISSION)}"
        )
        return pod

    def release_refused(self, name: str) -> PodsRemain:
        try:
            identity = self.adapter.release(name)
        except PodsRemain as exc:
            self.say(f"[yellow]refused (exit code 3, retryable):[/] {escape(str(exc))}")
            return exc
        raise DemoFailed(f"release admitted {name} as {identity} while pods of the previous execution remained")

    def release_waiting(self, name: str, expect: int, timeout: float | None = None) -> None:
        state = CliState(out=self.console, err=self.console)
        identity = release_wait(state, self.adapter, name, timeout=timeout or self.step_timeout, interval=1.0)
        self.say(f"[green]admitted[/] {name}: execution {identity} (A={identity.admission})")
        if identity.admission != expect:
            raise DemoFailed(f"expected A={expect}, got A={identity.admission}")
        self.promise()


# -------------------------------------------------------------------------------------------- story


def _part_one(story: Story, node: str) -> None:
    a = story.adapter
    story.step(f"Open a TrainJob, held; its pods will run on the reachable node {node}")
    name = story.open_on(story.spec("grace"), node, {_testbed().ANN_DELETE_DELAY: DELETE_DELAY})

    story.step(f"Release {name}: it is admitted, execution A=1 (once every layer has confirmed the suspension)")
    story.release_waiting(name, expect=1, timeout=story.step_timeout)
    story.show(a.wait(name, State.RUNNING, timeout=story.step_timeout))
    story.running_pod(name, 1)

    story.step(f"Hold {name}: suspended, its pod is deleted but stays Terminating (up to its grace period)")
    story.show(a.hold(name))
    story.until("its pod to be Terminating", lambda: any(_deleting(p) for p in _pods(story.namespace, name)))
    for pod in _pods(story.namespace, name):
        if _deleting(pod):
            keeps = (
                "its kubelet sent the process SIGTERM; the process writes on through its grace period and the pod "
                "goes once the kubelet has seen its container exit"
                if story.oracle_dir is not None else
                f"the testbed's kubelet keeps it {DELETE_DELAY}, as a real one takes up to the grace period")
            story.say(
                f"pod {pod['metadata']['name']} is Terminating (deleted at {pod['metadata']['deletionTimestamp']}, "
                f"phase {pod['status'].get('phase')}): {keeps}"
            )
    status = a.inspect(name)
    story.show(status)
    if not status.remaining:
        raise DemoFailed("inspect did not name the Terminating pod")

    story.step("Release again at once: refused, naming the pod that may still run")
    exc = story.release_refused(name)
    if not exc.pods:
        raise DemoFailed("PodsRemain named no pods")

    story.step("release --wait: retry until the pod has gone (its kubelet confirms), then admit with A=2")
    story.release_waiting(name, expect=2, timeout=story.step_timeout)
    story.show(a.wait(name, State.RUNNING, timeout=story.step_timeout))
    story.running_pod(name, 2)
    story.processes("grace", "A=1 got SIGTERM, wrote on through its grace and exited before A=2 started")


def _part_two(story: Story, node: str) -> None:
    a = story.adapter
    story.step(f"Open a second TrainJob on the freezable node {node}, release it: A=1")
    name = story.open_on(story.spec("lost"), node, {})
    story.release_waiting(name, expect=1, timeout=story.step_timeout)
    story.running_pod(name, 1)

    story.step(f"Freeze {node}: its kubelet stops answering, so Kubernetes cannot know whether the pod runs")
    _testbed().freeze(node)
    story.until(f"{node} to be Ready=Unknown", lambda: _node_ready(node) == "Unknown")
    story.say(f"{node} is Ready=Unknown")

    story.step(f"Hold {name}: its pod is deleted, but on a lost node it stays Terminating for good")
    a.hold(name)
    story.until("its pod to be Terminating", lambda: any(_deleting(p) for p in _pods(story.namespace, name)))
    status_box: list[Status] = []

    def unknown_shown() -> bool:
        status_box[:] = [a.inspect(name)]
        return "Ready=Unknown" in status_box[0].cause.detail

    story.until("status to show the node Ready=Unknown", unknown_shown)
    story.show(status_box[0])

    story.step("Has it ceased? No: nothing proves the process on the lost node has stopped")
    cessation = a.ceased(name)
    story.say(f"ceased={str(cessation.ceased).lower()}: {escape(cessation.reason)}")
    if cessation.ceased:
        raise DemoFailed("ceased was true while the node was only Ready=Unknown")
    story.release_refused(name)

    if story.oracle_dir is not None:
        story.step(f"{node} really goes down: the testbed cuts its power (its kubelet and containers die)")
        from ..testbed import oracle

        before = len(oracle.read(story.oracle_dir))
        story.say(f"the frozen kubelet's container wrote {before} lines so far, and was still writing")
        story.powered_off = True
        _testbed().power_off(node)
        story.until("the process to be gone", lambda: not any(
            p.alive for p in oracle.processes(oracle.read(story.oracle_dir or Path()))))
    story.step(f"The operator confirms {node} is shut down and taints it {OUT_OF_SERVICE_TAINT}")
    _kubectl("taint", "nodes", node, f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute", "--overwrite")
    cessation = a.ceased(name)
    story.say(f"ceased={str(cessation.ceased).lower()}: {escape(cessation.reason)}")
    if not cessation.ceased:
        raise DemoFailed(f"ceased was false after the out-of-service taint: {cessation.reason}")

    # dispatch's pod finalizer keeps the old pod until its end is proven and someone frees it: the controller's
    # finalizer keeper where the controller runs; here, with none, the operator (the admin role)
    for old in [p for p in _pods(story.namespace, name) if _deleting(p)]:
        pod = str(old["metadata"]["name"])
        story.step(f"No controller runs here, so the operator frees the old pod: dispatch admin release-pod {pod}")
        end = (story.operator or a).release_pod(pod)
        story.say(f"released {pod}: its end is proven ({end.proof})")

    story.step(f"Release {name}: admitted with A=2 once Kubernetes has force-deleted the old pod")
    story.release_waiting(name, expect=2, timeout=story.step_timeout)

    if story.oracle_dir is not None:
        story.step(f"The operator repairs {node} (powers it on, removes the taint): the new execution starts there")
        _testbed().power_on(node)
        story.powered_off = False
    else:
        story.step(f"The operator repairs {node} (thaw, remove the taint): the new execution starts there")
        _testbed().thaw(node)
    _kubectl("taint", "nodes", node, f"{OUT_OF_SERVICE_TAINT}-", check=False)
    story.show(a.wait(name, State.RUNNING, timeout=story.step_timeout))
    story.running_pod(name, 2)
    story.processes("lost", "A=2 started only after the machine of A=1 went down")


@contextmanager
def _namespace(keep: bool) -> Iterator[str]:
    name = f"dispatch-demo-{uuid.uuid4().hex[:6]}"
    _kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        if not keep:
            _kubectl("delete", "namespace", name, "--wait=false", check=False)


def _testbed_intro(tb: Any) -> str:
    """Say up front what starting the testbed will cost: a first build is long, later runs are not."""
    if tb.is_up():
        return f"Using the running local testbed (stack {tb.stack()})..."
    if tb.is_built():
        return f"Starting the local testbed (stack {tb.stack()}; this takes under a minute)..."
    minutes = max(1, round(tb.build_estimate() / 60)) if tb.build_estimate() else None
    how_long = f"about {minutes} minutes" if minutes else "tens of minutes"
    return (
        f"First run: building the local testbed (stack {tb.stack()}) from Go modules takes {how_long} on 2 cores; "
        "later runs start in seconds. Progress follows, one line per component; the Go tool's output goes to "
        "the log file named below."
    )


def run_demo(console: Console, *, keep: bool = False, step_timeout: float = 120.0, real_node: bool = False) -> None:
    """Tell the story; raise DemoFailed if a step goes otherwise or the promise is ever broken."""
    tb = _testbed()
    from ..testbed import harness

    console.print("[bold]dispatch demo[/]: one object never has two executions at once\n")
    console.print(_testbed_intro(tb), highlight=False)
    kubeconfig = Path(tb.up())
    console.print(f"testbed up; kubeconfig {kubeconfig}")
    regular = tb.regular_nodes()[0]
    freezable = tb.freezable_nodes()[0]
    oracle_dir: Path | None = None
    if real_node:
        real = tb.real_node()
        if real is None:
            raise DemoFailed(f"the testbed has no real node: {tb.real_node_problem()}")
        regular = freezable = real
        oracle_dir = Path(tempfile.mkdtemp(prefix="dispatch-demo-oracle-"))
    with _namespace(keep) as namespace:
        console.print(f"namespace {namespace}")
        runtime = None
        if oracle_dir is not None:
            from ..testbed import realnode

            runtime = "demo-real"
            _kubectl("apply", "-f", "-", input=json.dumps(realnode.training_runtime(
                runtime, oracle_dir, namespace=namespace, grace_period_seconds=30, grace="8s")))
            console.print(f"real node {regular}; its processes write their lives to {oracle_dir}")
        watcher = Watcher(namespace)
        watcher.start()
        frozen = False
        story: Story | None = None
        try:
            # the story's user holds the shipped writer role, and its operator the admin role, as installed
            with tempfile.TemporaryDirectory(prefix="dispatch-demo-roles-") as roles, \
                    harness.role_kubeconfig_file(namespace, Path(roles)) as writer, \
                    harness.role_kubeconfig_file(namespace, Path(roles), "dispatch-admin", home="default") as admin, \
                    Adapter.connect(namespace, kubeconfig=str(writer)) as adapter, \
                    Adapter.connect(namespace, kubeconfig=str(admin)) as operator:
                console.print(f"acting as a dispatch-writer of {namespace}; the operator as a dispatch-admin")
                story = Story(console, adapter, namespace, step_timeout, watcher, runtime=runtime,
                              oracle_dir=oracle_dir, operator=operator)
                _part_one(story, regular)
                frozen = True
                _part_two(story, freezable)
                frozen = False
        finally:
            watcher.stop()
            if frozen:
                powered_off = story is not None and story.powered_off
                try:
                    tb.power_on(freezable) if powered_off else tb.thaw(freezable)
                except (RuntimeError, ValueError, OSError) as exc:
                    what = "power on" if powered_off else "thaw"
                    console.print(f"could not {what} {freezable}: {escape(str(exc))}")
                _kubectl("taint", "nodes", freezable, f"{OUT_OF_SERVICE_TAINT}-", check=False)
        watcher.check()
        if watcher.violations:
            raise DemoFailed("the promise was broken: " + " | ".join(watcher.violations))
        console.print(
            f"\n[bold green]The promise held:[/] {watcher.samples} looks at every pod, never two executions of "
            "one object running at once."
        )
