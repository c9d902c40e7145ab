"""The testbed harness shared by the controller's testbed tests and the benchmarks in ``bench/``.

It lives in the package, not under ``tests/``, so that neither tests nor benchmarks import the other.
A namespace with a ClusterQueue and an AdmissionCheck of its own (under a controllerName of its own, so
another dispatch controller running on the shared testbed never decides these Workloads), the
controller as a subprocess as the Deployment runs it, a recorder of pod and Workload events, and the
hold/release re-admission round whose last-pod-gone -> Ready time the latency benchmark reports, and the
shipped guard's objects narrowed to one namespace (``deploy/base/guard.yaml``, read from the repository).
"""

from __future__ import annotations

# ruff: noqa: ASYNC220, ASYNC230  (harness: subprocesses and files, off the hot path)
import asyncio
import base64
import contextlib
import copy
import functools
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, AsyncAdapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch._api import Obj
from dispatch.controller import _guard as g_
from dispatch.errors import DispatchError, NotFound, Refused
from dispatch.testbed._manifests import ANN_HOLD_DELETE
from dispatch.testbed._paths import source_dir

A = LABEL_ADMISSION
T = TypeVar("T")
LOCALQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTERQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
PRIORITIES = k.Res("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass",
                   namespaced=False)


def running_testbed_kubeconfig() -> Path | None:
    """The running testbed's kubeconfig, or None when it is not up."""
    from dispatch import testbed

    return testbed.kubeconfig_path() if testbed.is_up() else None


def keeper_pass(ns: str, kubeconfig: Path | None = None) -> dict[str, str]:
    """One pass of the controller's finalizer keeper over a namespace's pods, as a running controller's keeper
    acts (by default with the shipped controller role, whose ``release`` on ``podfinalizers`` the dispatch-pods
    policy asks for): for a scenario that runs no controller, the step the shipped install's controller takes
    by itself."""
    from dispatch.controller._finalizers import FinalizerKeeper
    from dispatch.controller._metrics import Metrics

    async def go() -> dict[str, str]:
        async with contextlib.AsyncExitStack() as stack:
            path = kubeconfig or await stack.enter_async_context(controller_kubeconfig(ns, lease=False))
            kube = k.Kube.connect(namespace=ns, kubeconfig=path)
            stack.push_async_callback(kube.aclose)
            keeper = FinalizerKeeper(kube, Metrics.create())
            keeper.list_pods((await kube.list(k.PODS)).items)
            return {key: await keeper.release(key) for key in sorted(keeper.signatures)}
        raise AssertionError("unreachable")  # for mypy: the with block returns

    return asyncio.run(go())


@asynccontextmanager
async def controller_env(path: Path) -> AsyncIterator[tuple[k.Kube, str, str]]:
    """(admin Kube in a fresh namespace, namespace, ClusterQueue name); all removed afterwards."""
    suffix = uuid.uuid4().hex[:6]
    ns, cq = f"ctl-{suffix}", f"ctl-{suffix}"
    kube = k.Kube.connect(namespace=ns, kubeconfig=path)
    await kube.create(k.NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(k.ADMISSION_CHECKS, {"apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                                           "metadata": {"name": cq}, "spec": {"controllerName": f"{CTL}-{suffix}"}})
    await kube.create(CLUSTERQUEUES, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "preemption": {"withinClusterQueue": "LowerPriority"},
                 # `pods` covered: Kueue v0.19 skips the checks of a Workload that gets no flavor (one whose
                 # pods request none of the covered resources), so a check-gated queue must cover `pods`.
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "pods"], "flavors": [{"name": "default",
                     "resources": [{"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "8Gi"},
                                   {"name": "pods", "nominalQuota": "1000"}]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": cq}]}}})
    await kube.create(LOCALQUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                    "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": cq}})
    for name, value in (("ctl-low", 100), ("ctl-high", 1000)):
        try:
            await kube.create(PRIORITIES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                                           "metadata": {"name": name}, "value": value})
        except Exception:
            pass
    try:
        yield kube, ns, cq
    finally:
        for tj in (await kube.list(k.TRAINJOBS)).items:
            await kube.delete(k.TRAINJOBS, tj["metadata"]["name"])
        for pod in (await kube.list(k.PODS)).items:
            try:
                await kube.merge_patch(k.PODS, pod["metadata"]["name"], {"metadata": {"annotations": {
                    ANN_HOLD_DELETE: None}}})
            except NotFound:  # gone since the list (its TrainJob's deletion took it)
                pass
        try:
            await kube.delete(k.NAMESPACES, ns)
        except DispatchError:  # gone already, or being deleted (a campaign's namespace_cycle): the rest still goes
            pass
        await kube.delete(CLUSTERQUEUES, cq)
        await kube.delete(k.ADMISSION_CHECKS, cq)
        await kube.aclose()


CTL = "dispatch.phpboyscout.uk/admission-test"


# ---------------------------------------------------------------- the shipped roles

RBAC_YAML = source_dir().parent / "deploy" / "base" / "rbac.yaml"
"""The shipped roles (ClusterRoles, the controller's bindings and its leader-election Role)."""
ROLE_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", status=False)
CLUSTER_ROLE_BINDINGS = k.Res("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
                              namespaced=False, status=False)
SERVICE_ACCOUNTS = k.Res("", "v1", "serviceaccounts", "ServiceAccount", status=False)
ROLE_BOUND_WITH: dict[str, tuple[str, ...]] = {
    "dispatch-writer": ("dispatch-writer", "dispatch-node-reader"),
    "dispatch-reader": ("dispatch-reader", "dispatch-node-reader"),
    "dispatch-admin": ("dispatch-admin",),
    "dispatch-controller": ("dispatch-controller",),
}
"""What a user of each role is bound to, as the install docs bind them (a writer or reader in its namespace
and to ``dispatch-node-reader`` cluster-wide, which a RoleBinding cannot grant; an admin to ``dispatch-admin``
cluster-wide, and to nothing else)."""
NAMESPACED_ROLES = frozenset({"dispatch-writer", "dispatch-reader"})
"""The roles the install docs bind per namespace (RoleBinding); every other one is bound cluster-wide."""
RBAC_ROLES = k.Res("rbac.authorization.k8s.io", "v1", "roles", "Role", status=False)
CLUSTER_ROLES = k.Res("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False,
                      status=False)
SHIPPED_WEBHOOK_NAME = "dispatch-guard"
"""The one webhook configuration name the shipped controller role may patch (its caBundle)."""


def shipped_rbac() -> list[Obj]:
    """Every object of ``deploy/base/rbac.yaml`` as it is in this checkout."""
    return [d for d in yaml.safe_load_all(RBAC_YAML.read_text()) if d]


def apply_shipped_roles() -> None:
    """``kubectl apply`` the shipped ClusterRoles as they are in this checkout, so a test holds the library to
    the roles it ships, not to whatever an earlier run (or another tree) left on the shared testbed."""
    from dispatch import testbed

    roles = [d for d in shipped_rbac() if d["kind"] == "ClusterRole"]
    testbed.kubectl("apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(r) for r in roles))


def token_kubeconfig(ns: str, account: str, token: str) -> str:
    """A kubeconfig (text) for the testbed's API server, its CA inline, holding only ``token``."""
    from dispatch import testbed

    cluster = copy.deepcopy(yaml.safe_load(testbed.kubeconfig_path().read_text())["clusters"][0])
    ca = cluster["cluster"].pop("certificate-authority", None)
    if ca is not None:
        cluster["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account, "namespace": ns}}],
        "current-context": account})


Made = list[tuple[k.Res, str, str | None]]
"""What ``_bind`` made that does not go with the test's namespace: (kind, name, namespace)."""


def controller_rules_for(webhook: str) -> list[Obj]:
    """The shipped controller role's rules on webhook configurations, re-targeted from ``dispatch-guard`` at a
    test's own configuration name (tests on the shared testbed install the guard under a name of their own):
    the same verbs on one name, and nothing more."""
    [role] = [d for d in shipped_rbac()
              if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "dispatch-controller"]
    rules = [copy.deepcopy(r) for r in role["rules"] if r.get("resourceNames") == [SHIPPED_WEBHOOK_NAME]]
    if not rules:
        raise AssertionError("the shipped dispatch-controller role names no webhook configuration")
    for rule in rules:
        rule["resourceNames"] = [webhook]
    return rules


def controller_lease_role(ns: str) -> Obj:
    """The shipped leader-election Role, in ``ns`` rather than the controller's own namespace (a test's replicas
    take their Lease in the test's namespace)."""
    [role] = [d for d in shipped_rbac() if d["kind"] == "Role"]
    return {"metadata": {"name": role["metadata"]["name"], "namespace": ns}, "rules": copy.deepcopy(role["rules"])}


async def _bind(admin: k.Kube, ns: str, role: str, home: str | None,
                webhook: str | None = None, lease: bool = True) -> tuple[str, Made]:
    """(kubeconfig text for ``ns``, what to remove) of a fresh account bound as a user of ``role`` (named afresh,
    so a test may hold several); it lives in ``home`` (default ``ns``). Nothing is left behind when a step fails.
    The controller's account is bound as ``deploy/`` binds it: ``dispatch-controller`` cluster-wide and the
    leader-election Role (here in ``ns``; ``lease=False`` leaves it out, for a pass that takes no Lease in a
    namespace being deleted); ``webhook`` re-targets its webhook rule (``controller_rules_for``)."""
    from dispatch.testbed._container import token

    await asyncio.to_thread(apply_shipped_roles)
    account, home = f"as-{role}-{uuid.uuid4().hex[:4]}", home or ns
    made: Made = []
    try:
        await admin.create(SERVICE_ACCOUNTS, {"metadata": {"name": account}}, namespace=home)
        if home != ns:
            made.append((SERVICE_ACCOUNTS, account, home))
        subject = {"kind": "ServiceAccount", "name": account, "namespace": home}
        if role == "dispatch-controller" and lease:
            lease_role = controller_lease_role(ns)
            try:
                await admin.create(RBAC_ROLES, lease_role, namespace=ns)
            except Refused as e:  # one Role per namespace serves every replica of the test
                if e.code != 409:
                    raise
            await admin.create(ROLE_BINDINGS, {
                "metadata": {"name": f"{account}-lease"}, "subjects": [subject],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                            "name": lease_role["metadata"]["name"]}}, namespace=ns)
        if role == "dispatch-controller" and webhook and webhook != SHIPPED_WEBHOOK_NAME:
            name = f"{ns}-{account}-webhook"
            await admin.create(CLUSTER_ROLES, {"metadata": {"name": name}, "rules": controller_rules_for(webhook)})
            made.append((CLUSTER_ROLES, name, None))
            await admin.create(CLUSTER_ROLE_BINDINGS, {
                "metadata": {"name": name}, "subjects": [subject],
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}})
            made.append((CLUSTER_ROLE_BINDINGS, name, None))
        for bound in ROLE_BOUND_WITH[role]:
            ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": bound}
            if bound in NAMESPACED_ROLES:
                await admin.create(ROLE_BINDINGS, {"metadata": {"name": f"{account}-{bound}"}, "roleRef": ref,
                                                   "subjects": [subject]}, namespace=ns)
            else:
                name = f"{ns}-{account}-{bound}"
                await admin.create(CLUSTER_ROLE_BINDINGS, {"metadata": {"name": name}, "roleRef": ref,
                                                           "subjects": [subject]})
                made.append((CLUSTER_ROLE_BINDINGS, name, None))
        return token_kubeconfig(ns, account, await asyncio.to_thread(token, home, account, 3600)), made
    except BaseException:
        await _unbind(admin, made)
        raise


async def _unbind(admin: k.Kube, made: Made) -> None:
    """Remove what ``_bind`` made outside the test's namespace (the rest goes with the namespace)."""
    for res, name, namespace in made:
        try:
            await admin.delete(res, name, namespace=namespace)
        except NotFound:
            pass


@asynccontextmanager
async def role_kubeconfig(admin: k.Kube, ns: str, role: str = "dispatch-writer", *,
                          home: str | None = None, webhook: str | None = None,
                          lease: bool = True) -> AsyncIterator[str]:
    """A kubeconfig (text) for ``ns`` of a ServiceAccount bound exactly as the install docs bind a user of
    ``role`` (``ROLE_BOUND_WITH``) to the shipped roles of this checkout, its token from a TokenRequest. The
    account lives in ``ns`` unless ``home`` names another namespace (one that outlives ``ns``: a test that
    deletes ``ns`` and then acts as a cluster-wide admin, who is nobody of that namespace)."""
    text, made = await _bind(admin, ns, role, home, webhook, lease)
    try:
        yield text
    finally:
        await _unbind(admin, made)


@contextmanager
def role_kubeconfig_file(ns: str, directory: Path, role: str = "dispatch-writer", *,
                         home: str | None = None) -> Iterator[Path]:
    """``role_kubeconfig`` for a synchronous test (``Adapter.connect``, the ``dispatch`` command): the file
    in ``directory``; the testbed's admin makes and removes the bindings."""
    from dispatch import testbed

    async def as_admin(step: Callable[[k.Kube], Awaitable[T]]) -> T:
        admin = k.Kube.connect(namespace=ns, kubeconfig=testbed.kubeconfig_path())
        try:
            return await step(admin)
        finally:
            await admin.aclose()

    text, made = asyncio.run(as_admin(lambda admin: _bind(admin, ns, role, home)))
    path = directory / f"{ns}-{role}.kubeconfig"
    path.write_text(text)
    try:
        yield path
    finally:
        asyncio.run(as_admin(lambda admin: _unbind(admin, made)))


@asynccontextmanager
async def as_role(admin: k.Kube, ns: str, role: str = "dispatch-writer") -> AsyncIterator[k.Kube]:
    """A Kube in ``ns`` holding only the token of an account bound as a user of ``role`` (``role_kubeconfig``):
    the library's calls of a testbed test go through it, so a verb the shipped roles do not allow fails
    there as it would in a cluster, while the test's own operator writes keep the admin's ``Kube``."""
    async with role_kubeconfig(admin, ns, role) as text:
        kube = k.Kube.connect_inline(text, f"the {role} account of {ns}", namespace=ns)
        try:
            yield kube
        finally:
            await kube.aclose()


def controller_name(ns: str) -> str:
    """The controllerName of the test's own AdmissionCheck (named like its namespace and ClusterQueue)."""
    return f"{CTL}-{ns.split('-', 1)[1]}"


_OWN_PORTS_ABOVE = 20000


def free_port() -> int:
    """A port free now, for a server a test starts in a moment (a controller's probes, a guard replica).

    Chosen below the kernel's ephemeral range: a port the kernel hands out for ``bind(0)`` is also one it may
    hand to any outgoing connection (the suite beside this one makes thousands) before the server binds it,
    and the server then fails with "address already in use". Above the testbed's own fixed ports (10247 to
    about 20000 with a fleet's offsets), which a component restarted by a test binds again."""
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(_OWN_PORTS_ABOVE, low) if low > _OWN_PORTS_ABOVE + 1000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Launched:
    """A controller started by a launcher: its process and the host port of its probes and /metrics."""

    proc: subprocess.Popen[bytes]
    port: int
    container: str = ""
    """The container's name (podman), for a launcher that runs the image."""


@asynccontextmanager
async def controller_kubeconfig(ns: str, *, webhook: str | None = None, lease: bool = True) -> AsyncIterator[Path]:
    """A kubeconfig file holding only a token of an account bound as ``deploy/`` binds the controller's
    (``_bind``): what a test's controller runs with unless the test is about another identity. The account
    lives in ``default``, as the shipped one lives in a namespace of its own: it serves a namespace that
    is being deleted, where nothing can be created."""
    from dispatch import testbed

    admin = k.Kube.connect(namespace=ns, kubeconfig=testbed.kubeconfig_path())
    try:
        async with role_kubeconfig(admin, ns, "dispatch-controller", home="default", webhook=webhook,
                                   lease=lease) as text:
            directory = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="dispatch-controller-"))
            path = directory / "kubeconfig"
            path.write_text(text)
            try:
                yield path
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        await admin.aclose()


def _flag(args: tuple[str, ...], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``args``, or None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@asynccontextmanager
async def subprocess_controller(ns: str, *extra: str, kubeconfig_path: Path | None = None,
                                log: Path | None = None) -> AsyncIterator[Launched]:
    """``python -m dispatch.controller`` for one namespace, as the Deployment runs it: with the shipped
    controller role (``controller_kubeconfig``) unless ``kubeconfig_path`` names another identity."""
    async with contextlib.AsyncExitStack() as stack:
        if kubeconfig_path is None:
            kubeconfig_path = await stack.enter_async_context(
                controller_kubeconfig(ns, webhook=_flag(extra, "--guard-webhook")))
        logfile = stack.enter_context(open(log or os.devnull, "wb"))  # noqa: SIM115
        port = free_port()
        argv = [sys.executable, "-m", "dispatch.controller", "--kubeconfig", str(kubeconfig_path),
                "--namespace", ns, "--metrics-port", str(port), "--controller-name", controller_name(ns), *extra]
        if "--leader-elect" not in extra:
            argv.append("--no-leader-elect")
        proc = subprocess.Popen(argv, stderr=logfile)
        try:
            yield Launched(proc, port)
        finally:
            proc.terminate()
            proc.wait(10)


@asynccontextmanager
async def container_controller(ns: str, *extra: str, kubeconfig_path: Path | None = None,
                               log: Path | None = None) -> AsyncIterator[Launched]:
    """The controller's image for one namespace, as a pod of the shipped Deployment runs it: only the
    ServiceAccount token of ``dispatch-system/dispatch-controller`` and the shipped roles (deploy/ must be
    applied). ``kubeconfig_path`` is ignored: a pod has none. Yields once ``/readyz`` answers."""
    from dispatch.testbed import _container

    port = free_port()
    args = ["--namespace", ns, "--metrics-port", str(port), "--controller-name", controller_name(ns), *extra]
    if "--leader-elect" not in extra:
        args.append("--no-leader-elect")
    ctr = _container.run(args, log=log)
    try:
        await asyncio.to_thread(_container.wait_ready, port, 90.0, ctr)
        yield Launched(ctr.proc, port, ctr.name)
    finally:
        await asyncio.to_thread(ctr.stop)


Launcher = Callable[..., AbstractAsyncContextManager[Launched]]
LAUNCHERS: dict[str, Launcher] = {"process": subprocess_controller, "container": container_controller}


async def scrape(port: int, sample: str) -> float:
    """One sample's value from the controller's plain /metrics on ``port`` (0 when it has none yet)."""
    import httpx2
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx2.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).raise_for_status().text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and not s.labels:
                return float(s.value)
    return 0.0


async def until(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
                poll: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = pred()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


async def workload_of(kube: k.Kube, trainjob: str) -> Obj | None:
    tj = await kube.get(k.TRAINJOBS, trainjob)
    found = (await kube.list(k.WORKLOADS, labels=f"kueue.x-k8s.io/job-uid={tj['metadata']['uid']}")).items
    return found[0] if found else None


def check_of(workload: Obj | None) -> Obj:
    """The test's own check entry (named ``ctl-<suffix>``, like the namespace)."""
    ns = str(((workload or {}).get("metadata") or {}).get("namespace", ""))
    for c in ((workload or {}).get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == ns:
            return dict(c)
    return {}


def cond(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


async def pods_of(kube: k.Kube, name: str) -> list[Obj]:
    return (await kube.list(k.PODS, labels=f"jobset.sigs.k8s.io/jobset-name={name}")).items


async def hold_pods(kube: k.Kube, name: str) -> list[str]:
    """Keep the object's pods Terminating once deleted, until ``release_pods``."""
    names = []
    for pod in await pods_of(kube, name):
        await kube.merge_patch(k.PODS, pod["metadata"]["name"],
                               {"metadata": {"annotations": {ANN_HOLD_DELETE: "true"}}})
        names.append(pod["metadata"]["name"])
    return names


async def release_pods(kube: k.Kube, names: list[str]) -> None:
    for pod in names:
        try:
            await kube.merge_patch(k.PODS, pod, {"metadata": {"annotations": {ANN_HOLD_DELETE: None}}})
        except Exception:
            pass


def running_pods(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


class Recorder:
    """A test-side watch of pods and Workloads: when the last blocking pod went, when the check turned Ready."""

    def __init__(self, kube: k.Kube, watched: tuple[tuple[k.Res, str], ...] = ((k.PODS, "pod"),
                                                                              (k.WORKLOADS, "workload"))) -> None:
        self.kube = kube
        self.watched = watched
        self.events: list[tuple[float, str, str, Obj]] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def _watch(self, res: k.Res, label: str) -> None:
        listed = await self.kube.list(res)
        rv = listed.resource_version
        while True:
            try:
                async for etype, obj in self.kube.watch(res, resource_version=rv, timeout_seconds=60):
                    rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        self.events.append((time.monotonic(), label, etype, obj))
            except Exception:
                listed = await self.kube.list(res)
                rv = listed.resource_version

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._watch(res, label)) for res, label in self.watched]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def gone_at(self, pods: list[str], after: float) -> float | None:
        """When the last of ``pods`` stopped blocking (terminal phase or deleted), seen after ``after``."""
        last: dict[str, float] = {}
        for t, label, etype, obj in self.events:
            if label != "pod" or t < after or obj["metadata"]["name"] not in pods:
                continue
            if etype == "DELETED" or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                last.setdefault(obj["metadata"]["name"], t)
        return max(last.values()) if len(last) == len(pods) else None

    def ready_at(self, workload: str, after: float) -> float | None:
        for t, label, _, obj in self.events:
            if label == "workload" and t >= after and obj["metadata"]["name"] == workload \
                    and check_of(obj).get("state") == "Ready":
                return t
        return None


async def is_running(kube: k.Kube, name: str) -> bool:
    return bool(running_pods(await pods_of(kube, name)))


async def all_terminating(kube: k.Kube, pods: list[str]) -> bool:
    got = {p["metadata"]["name"]: p for p in (await kube.list(k.PODS)).items}
    return all(name in got and got[name]["metadata"].get("deletionTimestamp") for name in pods)


async def readmission_latencies(kube: k.Kube, ns: str, rounds: int, *, log: Path | None = None,
                                name: str = "lat-s1", metrics: dict[str, str] | None = None) -> list[float]:
    """Seconds from the last old pod going to the check turning Ready, over ``rounds`` re-admissions.

    Each round holds the object (its Workload deactivated, so Kueue evicts it and its pod stays
    Terminating under the testbed's hold-delete annotation), releases it (Kueue re-reserves quota at
    once; the check must wait), then lets the pod go. Every round also checks the promise: the first
    pod of the new execution appeared only after the old one went, and carries the next A. The verbs are a
    ``dispatch-writer``'s (``as_role``); ``kube`` is the operator's, who lets the held pod go. ``metrics``, if
    given, gets the controller's metrics text after the last round (key ``"text"``).
    """
    job_id, submission = name.rsplit("-", 1)
    rec = Recorder(kube)
    rec.start()
    latencies: list[float] = []
    try:
        async with as_role(kube, ns) as writer, subprocess_controller(ns, log=log or Path(os.devnull)) as launched:
            adapter = AsyncAdapter(writer)
            await adapter.open(JobSpec(job_id=job_id, submission=submission, queue="lq"))
            await until(lambda: is_running(kube, name), what="running")
            for i in range(rounds):
                held = await hold_pods(kube, name)
                await adapter.hold(name)                     # Workload deactivated: evicted, pod Terminating
                await until(functools.partial(all_terminating, kube, held), what="old pod terminating")
                await adapter.release(name)                  # re-queued: the check must wait for the pod

                async def waits() -> bool:
                    return bool(check_of(await workload_of(kube, name)).get("message", "").startswith(
                        "waiting for pods of the previous execution"))
                await until(waits, what=f"round {i}: waiting")
                mark = time.monotonic()
                await release_pods(kube, held)
                wl = await workload_of(kube, name)
                assert wl is not None
                wl_name = str(wl["metadata"]["name"])
                await until(functools.partial(rec.ready_at, wl_name, mark), what="Ready")
                gone = rec.gone_at(held, mark)
                ready = rec.ready_at(wl_name, mark)
                assert gone is not None and ready is not None and ready >= gone
                latencies.append(ready - gone)
                await until(lambda: is_running(kube, name), what="running again")
                born = min(t for t, label, etype, obj in rec.events if label == "pod" and etype == "ADDED"
                           and obj["metadata"]["labels"].get(A) == str(i + 2))
                assert born > gone, "a pod of the new execution appeared before the old one went"
                pods = running_pods(await pods_of(kube, name))
                assert [p["metadata"]["labels"][A] for p in pods] == [str(i + 2)]
            if metrics is not None:
                metrics["text"] = await asyncio.to_thread(_scrape, launched.port)
    finally:
        await rec.stop()
    return latencies


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


RTT_ANNOTATION = "dispatch.test/rtt"


async def _round_trips(rec: Recorder, label: str, rounds: int, write: Callable[[str], Any]) -> list[float]:
    """Seconds from sending each of ``rounds`` writes (``write(value)`` sets the rtt annotation to
    ``value``) to its watch event reaching ``rec``."""
    out: list[float] = []
    for i in range(rounds):
        want = f"{label}-{i}"
        mark = time.monotonic()
        await write(want)

        def seen(want: str = want) -> float | None:
            return next((t for t, got, _, obj in rec.events if got == label
                         and (obj["metadata"].get("annotations") or {}).get(RTT_ANNOTATION) == want), None)
        await until(lambda: seen() is not None, what="watch event", poll=0.001)
        out.append(max(0.0, (seen() or mark) - mark))
    return out


async def webhooked_round_trips(kube: k.Kube, trainjob: str, rounds: int) -> dict[str, list[float]]:
    """The floor of the two writes every Kueue-mode admission makes, each measured alone as a write's trip
    to its own watch event: a TrainJob write (through Trainer's and Kueue's TrainJob webhooks) and a
    Workload write (through Kueue's Workload webhook, which also judges ``workloads/status``). Each
    write sets an annotation only, which neither the controller nor Kueue acts on."""
    wl = await workload_of(kube, trainjob)
    assert wl is not None, f"no Workload for {trainjob}"
    workload = str(wl["metadata"]["name"])
    rec = Recorder(kube, ((k.TRAINJOBS, "trainjob"), (k.WORKLOADS, "workload")))
    rec.start()
    try:
        await asyncio.sleep(0.5)

        def annotate(res: k.Res, name: str) -> Callable[[str], Any]:
            return lambda value: kube.merge_patch(res, name, {"metadata": {"annotations": {RTT_ANNOTATION: value}}})
        return {"trainjob": await _round_trips(rec, "trainjob", rounds, annotate(k.TRAINJOBS, trainjob)),
                "workload": await _round_trips(rec, "workload", rounds, annotate(k.WORKLOADS, workload))}
    finally:
        await rec.stop()


async def watch_round_trips(kube: k.Kube, rounds: int) -> list[float]:
    """The API's own floor: seconds from sending a write to its watch event reaching the same process.

    The latency benchmark's baseline, measured in the same run: the controller's figure includes one
    such hop (the pod's deletion reaching its watch) plus its read, decision and write.
    """
    rec = Recorder(kube)
    rec.start()
    try:
        await asyncio.sleep(0.5)
        await kube.create(k.PODS, {"metadata": {"name": "rtt"}, "spec": {
            "nodeName": "node-0", "containers": [{"name": "c", "image": "example.invalid/x"}]}})
        return await _round_trips(rec, "pod", rounds, lambda value: kube.merge_patch(
            k.PODS, "rtt", {"metadata": {"annotations": {RTT_ANNOTATION: value}}}))
    finally:
        await rec.stop()
        await kube.delete(k.PODS, "rtt", grace_seconds=0)


GUARD_YAML = source_dir().parent / "deploy" / "base" / "guard.yaml"
"""The shipped guard: its webhooks, CEL policy and binding."""


def guard_docs() -> dict[str, Obj]:
    """The objects of ``deploy/base/guard.yaml`` by kind (of the policies, the TrainJobs' ``dispatch-identity``;
    ``guard_doc`` gives any by kind and name)."""
    out: dict[str, Obj] = {}
    for d in yaml.safe_load_all(GUARD_YAML.read_text()):
        if d and (d["kind"] not in out or d["metadata"]["name"] == "dispatch-identity"):
            out[d["kind"]] = d
    return out


def guard_doc(kind: str, name: str) -> Obj:
    """One object of ``deploy/base/guard.yaml``."""
    return next(d for d in yaml.safe_load_all(GUARD_YAML.read_text())
                if d and d["kind"] == kind and d["metadata"]["name"] == name)


def scoped_pods(ns: str, name: str) -> tuple[Obj, Obj]:
    """The shipped ``dispatch-pods`` policy and its binding, renamed and narrowed to ``ns``."""
    policy = copy.deepcopy(guard_doc("ValidatingAdmissionPolicy", "dispatch-pods"))
    policy["metadata"] = {"name": name}
    binding = copy.deepcopy(guard_doc("ValidatingAdmissionPolicyBinding", "dispatch-pods"))
    binding["metadata"] = {"name": name}
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
    return policy, binding


CRDS = k.Res("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
             namespaced=False, status=False)
POLICIES = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 namespaced=False, status=False)
BINDINGS = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False, status=False)


@asynccontextmanager
async def floors_of_this_tree(kube: k.Kube, in_force: Callable[[], Any]) -> AsyncIterator[str]:
    """This tree's identity CRDs (their rules and bounds) and the shipped ``dispatch-floors`` policy, renamed
    (floors are cluster-scoped: a binding cannot narrow it to a namespace), until ``in_force()`` (awaitable)
    says the policy answers; yields its name. The CRDs as they were are put back after, so other runs on the
    shared testbed keep theirs."""
    docs = [d for d in yaml.safe_load_all((source_dir().parent / "deploy" / "base" / "crd.yaml").read_text()) if d]
    before = {d["metadata"]["name"]: await kube.get(CRDS, d["metadata"]["name"]) for d in docs}

    async def put(name: str, spec: Obj) -> None:
        current = await kube.get(CRDS, name)
        await kube.merge_patch(CRDS, name, {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                                            "spec": {"versions": spec["versions"]}})
    name = f"dispatch-floors-{uuid.uuid4().hex[:6]}"
    policy = copy.deepcopy(guard_doc("ValidatingAdmissionPolicy", "dispatch-floors"))
    policy["metadata"] = {"name": name}
    binding = copy.deepcopy(guard_doc("ValidatingAdmissionPolicyBinding", "dispatch-floors"))
    binding["metadata"] = {"name": name}
    binding["spec"]["policyName"] = name
    for doc in docs:
        await put(doc["metadata"]["name"], doc["spec"])
    await asyncio.sleep(2)  # the API server rebuilds the CRDs' validators (no status says when)
    await kube.create(POLICIES, policy)
    await kube.create(BINDINGS, binding)
    try:
        await until(in_force, what="the dispatch-floors policy in force", timeout=30)
        yield name
    finally:
        await kube.delete(BINDINGS, name)
        await kube.delete(POLICIES, name)
        for crd, obj in before.items():
            await put(crd, obj["spec"])


def scoped_mutating(ns: str, port: int, name: str) -> Obj:
    """Enrolment's webhook of ``deploy/base/guard.yaml``, renamed, at ``127.0.0.1:port``, for ``ns`` only
    once it carries the opt-in label (the shipped namespaceSelector, narrowed to the test's namespace)."""
    hook = copy.deepcopy(guard_docs()["MutatingWebhookConfiguration"])
    hook["metadata"] = {"name": name}
    for w in hook["webhooks"]:
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{g_.MUTATE_PATH}"}
        w["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] = ns
    return hook


def scoped(ns: str, port: int, name: str) -> tuple[Obj, Obj, Obj]:
    """The shipped guard's objects, renamed and narrowed to ``ns``, the webhook at ``127.0.0.1:port``, so
    other tests on the same testbed never meet them."""
    docs = guard_docs()
    only_ns = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    hook = copy.deepcopy(docs["ValidatingWebhookConfiguration"])
    hook["metadata"] = {"name": name}
    for w in hook["webhooks"]:
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{w['clientConfig']['service']['path']}"}
        w["namespaceSelector"] = only_ns
    policy = copy.deepcopy(docs["ValidatingAdmissionPolicy"])
    policy["metadata"] = {"name": name}
    binding = copy.deepcopy(docs["ValidatingAdmissionPolicyBinding"])
    binding["metadata"] = {"name": name}
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"] = {"namespaceSelector": only_ns}
    return hook, policy, binding


async def probe_denied(kube: k.Kube, ns: str, answers: list[str] | None = None) -> bool:
    """Whether the guard answers yet: a dry-run create of an unsuspended dispatch TrainJob is refused.
    ``answers`` collects what the API server said, so a test that expected the guard's word can show it."""
    body = {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
            "metadata": {"name": "guard-probe", "namespace": ns,
                         "labels": {LABEL_JOB_ID: "probe", LABEL_SUBMISSION: "s1"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": False}}
    try:
        await kube.create(api.TRAINJOBS, body, dry_run=True)
    except Exception as exc:
        if answers is not None:
            answers.append(str(exc))
        return "is created suspended" in str(exc)
    if answers is not None:
        answers.append("created (dry run): nothing refused it")
    return False
