"""The campaign's driver: a schedule of :mod:`.campaign` played on the running testbed, judged after every round.

dispatch as deployed: two ``python -m dispatch.controller`` replicas with leader election, each with only the
token of an account bound as ``deploy/`` binds the controller (``harness.controller_kubeconfig``), each serving
the guard's webhooks, which the shipped ``ValidatingWebhookConfiguration`` (narrowed to the campaign's
namespace, ``harness.scoped``) reaches through a forwarder standing in for the guard's Service; their Lease
lives in a namespace of its own, as the shipped one lives in ``dispatch-system``, so a ``namespace_cycle``
(the namespace deleted and made again) leaves them a leader. The namespace
has its own ClusterQueue and AdmissionCheck (``harness.controller_env``), its queue holds two pods, so a release
of the high-priority submission preempts a low one. The writers are two users bound to the shipped
``dispatch-writer`` role (``harness.as_role``); the deletes are a user of Kubernetes' built-in ``edit`` role.
Every execution runs on the real node as the fenced training process (``realnode.fenced_runtime``), appending
to the process oracle and committing checkpoints through ``dispatch.fence`` in a hostPath directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, AsyncAdapter, JobSpec, testbed
from dispatch import _api as api
from dispatch import _decision as d
from dispatch import _kube as k
from dispatch._api import Obj
from dispatch._views import POD_FINALIZER
from dispatch.errors import DispatchError, NotFound, PodsRemain, Refused
from dispatch.testbed import harness, oracle, realnode
from dispatch.testbed.campaign import (
    CONTROLLER_FAULTS,
    FAULTS,
    KUEUE,
    NAMESPACE_CYCLE,
    PREEMPTOR,
    SUBMISSIONS,
    TOKEN_SECONDS,
    Credential,
    FenceEvent,
    Judgement,
    LogEntry,
    Op,
    Report,
    Round,
    Schedule,
    Word,
    excused_by_taint,
    judge,
    kin_layers,
    named_word,
    namespace_remains,
    parse_fence_events,
    renewals_due,
    shrink,
)

NODE = "node-real"
OOS = "node.kubernetes.io/out-of-service"
RUNTIME = "fenced"
LEASE = "dispatch-admission-controller"
EDIT_ANNOTATION = "campaign.dispatch.test/edit"
SUBMISSION = "s1"
NODE_READY_TIMEOUT = 150.0
NAMESPACE_GONE_TIMEOUT = 300.0
"""How long a ``namespace_cycle`` waits for the deleted namespace to go, twice at most: its pods keep dispatch's
finalizer until the controller proves their end (5 s of grace here), and the namespace waits for them."""
NAMESPACED_KINDS = (k.PODS, k.TRAINJOBS, k.JOBSETS, k.JOBS, k.WORKLOADS, api.SUBMISSION_RECORDS, k.CONFIGMAPS,
                    api.RUNTIMES, harness.LOCALQUEUES, harness.SERVICE_ACCOUNTS, harness.ROLE_BINDINGS)
"""What a namespace that does not go is searched for (``namespace_remains``)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, PodsRemain):
        return "pods remain"
    if isinstance(exc, NotFound):
        return "not found"
    if isinstance(exc, Refused):
        return f"refused {exc.reason or type(exc).__name__}"
    if isinstance(exc, DispatchError):
        return f"error {type(exc).__name__}"
    return f"error {type(exc).__name__}"


def token_file_kubeconfig(text: str, token_path: Path) -> tuple[str, str]:
    """(the kubeconfig ``text`` with its user's inline token replaced by ``tokenFile: token_path``, the
    account it names): dispatch's client reads a token file again each minute, so renewing the file renews
    a running client's credential, as a pod's rotated projected token does."""
    config = yaml.safe_load(text)
    [user] = config["users"]
    user["user"] = {"tokenFile": str(token_path)}
    return yaml.safe_dump(config), str(user["name"])


def write_token(path: Path, token: str) -> None:
    """Replace the token file at once (a reader never sees half a token)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(token)
    tmp.chmod(0o600)
    tmp.replace(path)


UNANSWERED = "cannot reach the API server"
"""How the library says a request never reached the API server (a connection refused or dropped)."""


class Forwarder:
    """The guard's Service: each connection goes to a replica that accepts it (a dead replica's endpoint
    leaves a real Service within moments; here a refused connection goes to the next one at once)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.sent = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i in range(len(self.ports)):
            port = self.ports[(self.sent + i) % len(self.ports)]
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.sent += 1

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                with contextlib.suppress(Exception):
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                with contextlib.suppress(Exception):
                    dst.close()
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
            return
        writer.close()


@dataclass
class Replica:
    """One controller replica: ``python -m dispatch.controller`` as the Deployment's pod runs it."""

    index: int
    ns: str
    lease_ns: str
    """Where the replicas' Lease lives: a namespace of its own, as the shipped one lives in ``dispatch-system``,
    so a deletion of the namespace they serve leaves them a leader, whose keeper frees the pods' finalizers
    the deletion waits for."""
    kubeconfig: Path
    port: int
    webhook: str
    workdir: Path
    starts: int = 0
    held_down: bool = False
    """Kept down by a fault until its heal (else the runner restarts it, as a Deployment would)."""
    stack: contextlib.AsyncExitStack | None = None
    launched: harness.Launched | None = None

    @property
    def identity(self) -> str:
        return f"campaign-{self.index}"

    def alive(self) -> bool:
        return self.launched is not None and self.launched.proc.poll() is None

    async def start(self) -> None:
        await self.stop()
        self.starts += 1
        self.stack = contextlib.AsyncExitStack()
        self.launched = await self.stack.enter_async_context(harness.subprocess_controller(
            self.ns, "--leader-elect", "--lease-namespace", self.lease_ns, "--identity", self.identity,
            "--guard-port", str(self.port), "--guard-cert-dir", str(self.workdir / f"certs-{self.index}"),
            "--guard-webhook", self.webhook, kubeconfig_path=self.kubeconfig,
            log=self.workdir / f"replica-{self.index}-{self.starts}.log"))

    def kill(self) -> None:
        """SIGKILL, as ``kill -9`` (or a node's OOM killer) ends it: no lease released, no request finished."""
        if self.launched is not None and self.launched.proc.poll() is None:
            self.launched.proc.send_signal(signal.SIGKILL)
            self.launched.proc.wait(10)

    async def stop(self) -> None:
        if self.stack is not None:
            with contextlib.suppress(Exception):
                await self.stack.aclose()
        self.stack, self.launched = None, None


@dataclass
class Campaign:
    schedule: Schedule
    workdir: Path
    liveness_seconds: float = 240.0
    report: Report = field(init=False)
    ns: str = ""
    admin: k.Kube | None = None
    writers: list[AsyncAdapter] = field(default_factory=list)
    editor: k.Kube | None = None
    operator: AsyncAdapter | None = None
    """A user bound as the install docs bind ``dispatch-admin``: the operator's words (``release-pod``)."""
    replicas: list[Replica] = field(default_factory=list)
    desired: dict[str, str] = field(default_factory=dict)
    """What each submission should be doing after the writers' last word: running, held or absent."""
    active: set[str] = field(default_factory=set)
    taint_windows: list[tuple[int, int | None]] = field(default_factory=list)
    """When an out-of-service taint was on a node whose processes had not been shown to stop
    (the operator's error the non-graceful shutdown contract rules out): (from, until) in Unix ms."""
    excused: dict[str, str] = field(default_factory=dict)
    edits: int = 0
    round_no: int = 0
    log_entries: dict[tuple[str, str], dict[int, LogEntry]] = field(default_factory=dict)
    credentials: dict[str, Credential] = field(default_factory=dict)
    """Each identity's token, renewed before it expires (``_renewer``): a campaign outlives any one token."""
    cq: str = ""
    lease_ns: str = ""
    in_ns: contextlib.AsyncExitStack | None = None
    """The bindings of the identities living in the namespace (``_provision``), made again after a cycle."""
    ns_gone: bool = False
    """The namespace was deleted by a ``namespace_cycle`` and is not made again yet (its identities wait)."""
    ns_pending: bool = False
    """A ``namespace_cycle`` whose namespace did not go within twice the bound: made again once it goes."""

    def __post_init__(self) -> None:
        self.report = Report(seed=self.schedule.seed)
        self.oracle_dir = self.workdir / "oracle"
        self.checkpoints = self.workdir / "checkpoints"

    def log(self, msg: str) -> None:
        line = f"[campaign {time.strftime('%H:%M:%S')} r{self.round_no}] {msg}"
        print(line, flush=True)
        with (self.workdir / "campaign.log").open("a") as f:
            f.write(line + "\n")

    def note(self, text: str) -> None:
        self.report.findings.append(f"round {self.round_no}: {text}")
        self.log(f"NOTE {text}")

    # ------------------------------------------------------------------------------------------ set-up

    @contextlib.asynccontextmanager
    async def installed(self, path: Path) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            # the tokens go last, once nothing uses them (nothing of a campaign's credentials outlives it)
            stack.callback(shutil.rmtree, self.workdir / "credentials", ignore_errors=True)
            kube, ns, cq = await stack.enter_async_context(harness.controller_env(path))
            self.admin, self.ns, self.cq, self.lease_ns = kube, ns, cq, f"{ns}-lease"
            self.log(f"namespace {ns}; workdir {self.workdir}")
            got = await kube.get(harness.CLUSTERQUEUES, cq)
            for res in got["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
                if res["name"] == "pods":
                    res["nominalQuota"] = str(len(KUEUE))  # the preemptor needs a low one's place
            # a merge patch of the whole list (no resourceVersion): Kueue writes the queue's status meanwhile
            groups = got["spec"]["resourceGroups"]
            await kube.merge_patch(harness.CLUSTERQUEUES, cq, {"spec": {"resourceGroups": groups}})
            await asyncio.to_thread(realnode.python_image)
            # the guard: its webhooks (through the forwarder), its identity policy, its pods policy
            ports = [harness.free_port(), harness.free_port()]
            fwd = Forwarder(ports)
            server = await asyncio.start_server(fwd.handle, "127.0.0.1", 0)
            stack.push_async_callback(self._close_server, server)
            webhook = f"dispatch-guard-{ns}"
            hook, policy, binding = harness.scoped(ns, int(server.sockets[0].getsockname()[1]), webhook)
            pods_policy, pods_binding = harness.scoped_pods(ns, f"dispatch-pods-{ns}")
            made: list[tuple[k.Res, Obj]] = [(api.VALIDATING_WEBHOOKS, hook), (harness.POLICIES, policy),
                                             (harness.BINDINGS, binding), (harness.POLICIES, pods_policy),
                                             (harness.BINDINGS, pods_binding)]
            for res, obj in made:
                await kube.create(res, obj)
                stack.push_async_callback(self._delete, res, obj["metadata"]["name"])
            minted = await stack.enter_async_context(harness.controller_kubeconfig(ns, webhook=webhook, lease=False))
            # the account lives in default (harness.controller_kubeconfig), as the shipped one lives apart
            kubeconfig = await self._hold("controller", "default", minted.read_text())
            await self._lease_namespace(stack, self.credentials["controller"].account)
            self.replicas = [Replica(i, ns, self.lease_ns, kubeconfig, ports[i], webhook, self.workdir) for i in (0, 1)]
            for r in self.replicas:
                stack.push_async_callback(r.stop)
                await r.start()
            stack.push_async_callback(self._drain)  # runs before the replicas stop: pods go while they serve

            async def published() -> bool:
                got = await kube.get(api.VALIDATING_WEBHOOKS, webhook)
                return all(w["clientConfig"].get("caBundle") for w in got["webhooks"])
            await harness.until(published, timeout=90, what="the guard's CA in the caBundle")
            await harness.until(lambda: harness.probe_denied(kube, ns), timeout=60, what="the guard answering")
            stack.push_async_callback(self._close_in_ns)  # after the clients below close
            paths = await self._provision()
            for i in (0, 1):  # harness.as_role's binding, its token in a file the runner renews
                writer = k.Kube.connect(namespace=ns, kubeconfig=paths[f"writer-{i}"])
                stack.push_async_callback(writer.aclose)
                self.writers.append(AsyncAdapter(writer))
            self.editor = k.Kube.connect(namespace=ns, kubeconfig=paths["editor"])
            stack.push_async_callback(self.editor.aclose)
            operator = k.Kube.connect(namespace=ns, kubeconfig=paths["operator"])
            stack.push_async_callback(operator.aclose)
            self.operator = AsyncAdapter(operator)
            renewer = asyncio.create_task(self._renewer())
            stack.push_async_callback(self._stop_task, renewer)
            yield

    async def _lease_namespace(self, stack: contextlib.AsyncExitStack, account: str) -> None:
        """The replicas' Lease namespace with the shipped leader-election Role bound to their account (which
        lives in ``default``); it goes once the replicas have stopped."""
        assert self.admin is not None
        await self.admin.create(k.NAMESPACES, {"metadata": {"name": self.lease_ns}})
        stack.push_async_callback(self._delete, k.NAMESPACES, self.lease_ns)
        role = harness.controller_lease_role(self.lease_ns)
        await self.admin.create(harness.RBAC_ROLES, role, namespace=self.lease_ns)
        await self.admin.create(harness.ROLE_BINDINGS, {
            "metadata": {"name": f"{account}-lease"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}},
            namespace=self.lease_ns)

    async def _provision(self) -> dict[str, Path]:
        """What lives in the namespace, beside what ``harness.controller_env`` made there: the fenced runtime,
        and the writers', editor's and operator's accounts and bindings, each token in the file its kubeconfig
        names (``_hold``). Run again after a ``namespace_cycle`` (which also makes the namespace and its
        LocalQueue again): the same files, so the clients made from them go on, reading the new tokens after
        the old ones' 401. Returns the kubeconfig files by identity."""
        assert self.admin is not None
        kube, ns = self.admin, self.ns
        await self._close_in_ns()  # the old accounts' cluster-wide bindings (the accounts went with the namespace)
        self.in_ns = stack = contextlib.AsyncExitStack()
        rt = realnode.fenced_runtime(RUNTIME, self.oracle_dir, self.checkpoints, namespace=ns, commit_every=1.0,
                                     fenced_tries=2, grace_period_seconds=5)
        await kube.create(api.RUNTIMES, rt)
        paths: dict[str, Path] = {}
        for i in (0, 1):
            text = await stack.enter_async_context(harness.role_kubeconfig(kube, ns))
            paths[f"writer-{i}"] = await self._hold(f"writer-{i}", ns, text)
        paths["editor"] = await self._hold("editor", ns, await self._editor(kube, ns))
        text = await stack.enter_async_context(harness.role_kubeconfig(kube, ns, "dispatch-admin"))
        paths["operator"] = await self._hold("operator", ns, text)
        return paths

    async def _close_in_ns(self) -> None:
        if self.in_ns is not None:
            stack, self.in_ns = self.in_ns, None
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def _close_server(self, server: asyncio.Server) -> None:
        server.close()

    @staticmethod
    async def _stop_task(task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _hold(self, name: str, namespace: str, text: str) -> Path:
        """A kubeconfig file for the identity of ``text`` (a kubeconfig with an inline token of ``account`` in
        ``namespace``) that reads its token from a file; a fresh ``TOKEN_SECONDS`` token is minted into it now
        and renewed by ``_renewer``."""
        directory = self.workdir / "credentials"
        directory.mkdir(mode=0o700, exist_ok=True)
        token_path = directory / f"{name}.token"
        config, account = token_file_kubeconfig(text, token_path)
        self.credentials[name] = Credential(name, namespace, account, token_path, 0.0, 0.0)
        await self._renew(self.credentials[name])
        path = directory / f"{name}.kubeconfig"
        path.write_text(config)
        path.chmod(0o600)
        return path

    async def _renew(self, cred: Credential) -> None:
        from dispatch.testbed._container import token

        fresh = await asyncio.to_thread(token, cred.namespace, cred.account, TOKEN_SECONDS)
        write_token(cred.path, fresh)
        self.credentials[cred.name] = Credential.of(cred.name, cred.namespace, cred.account, cred.path, fresh,
                                                    time.time())

    async def _renewer(self) -> None:
        """Renew each token past ``RENEW_FRACTION`` of its life (tried again each pass while the API server is
        down): without it every identity's requests fail with 401 an hour into a campaign."""
        while True:
            await asyncio.sleep(15)
            for cred in renewals_due(self.credentials.values(), time.time()):
                if self.ns_gone and cred.namespace == self.ns:
                    continue  # its account went with the namespace; _provision mints its successor's
                try:
                    await self._renew(cred)
                    self.report.renewals["renewed"] += 1
                    self.log(f"renewed the {cred.name} token (it would have expired at "
                             f"{time.strftime('%H:%M:%S', time.localtime(cred.expires))})")
                except Exception as e:
                    self.report.renewals["failed"] += 1
                    self.log(f"renewing the {cred.name} token failed ({e!r}); tried again in 15 s")

    async def _delete(self, res: k.Res, name: str) -> None:
        assert self.admin is not None
        with contextlib.suppress(Exception):
            await self.admin.delete(res, name)

    async def _editor(self, admin: k.Kube, ns: str) -> str:
        """A user of Kubernetes' built-in ``edit`` ClusterRole in ``ns`` (what ``kubectl delete`` runs as): its
        kubeconfig (text, an inline token)."""
        from dispatch.testbed._container import token

        account = "campaign-editor"
        await admin.create(harness.SERVICE_ACCOUNTS, {"metadata": {"name": account}}, namespace=ns)
        await admin.create(harness.ROLE_BINDINGS, {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]}, namespace=ns)
        return harness.token_kubeconfig(ns, account, await asyncio.to_thread(token, ns, account, TOKEN_SECONDS))

    async def _drain(self) -> None:
        """Every object closed and its pods gone while the replicas still serve (dispatch's pod finalizer is
        freed by their keeper), so the namespace's deletion does not wait on a finalizer nobody frees."""
        assert self.admin is not None
        with contextlib.suppress(Exception):
            await self._heal_everything()
        for tj in (await self.admin.list(k.TRAINJOBS)).items:
            with contextlib.suppress(Exception):
                await self.admin.delete(k.TRAINJOBS, tj["metadata"]["name"], propagation="Background")

        async def no_pods() -> bool:
            assert self.admin is not None
            return not (await self.admin.list(k.PODS)).items
        try:
            await harness.until(no_pods, timeout=120, what="the campaign's pods gone")
        except AssertionError:
            self.log("pods still there 120 s after their objects were deleted")

    # ------------------------------------------------------------------------------------------ the objects

    def name_of(self, sub: str, variant: str) -> str:
        return f"{sub}-{SUBMISSION}" if variant != "b" else f"{sub}-{SUBMISSION}-b"

    def spec(self, sub: str, variant: str) -> JobSpec:
        kueue = sub in (*KUEUE, PREEMPTOR)
        return JobSpec(job_id=sub, submission=SUBMISSION, runtime=RUNTIME, runtime_kind="TrainingRuntime",
                       num_nodes=1, name=self.name_of(sub, variant), queue="lq" if kueue else None,
                       priority_class=("ctl-high" if sub == PREEMPTOR else "ctl-low") if kueue else None)

    async def current(self, sub: str) -> str | None:
        """The submission's TrainJob that is not being deleted (the newest, should there be two)."""
        assert self.admin is not None
        items = [t for t in (await self.admin.list(k.TRAINJOBS, labels=f"{LABEL_JOB_ID}={sub}")).items
                 if not t["metadata"].get("deletionTimestamp")]
        items.sort(key=lambda t: t["metadata"].get("creationTimestamp", ""))
        return str(items[-1]["metadata"]["name"]) if items else None

    async def pods(self, sub: str) -> list[Obj]:
        assert self.admin is not None
        return [p for p in (await self.admin.list(k.PODS, labels=f"{LABEL_JOB_ID}={sub}")).items
                if not p["metadata"].get("deletionTimestamp")]

    # ------------------------------------------------------------------------------------------ actions

    async def act(self, op: Op) -> str:
        assert self.admin is not None and self.editor is not None
        adapter = self.writers[op.who % len(self.writers)]
        sub = op.target
        if op.kind == NAMESPACE_CYCLE:
            return await self.namespace_cycle()
        if self.ns_gone:
            return "skipped (the namespace is not made again yet)"
        if op.kind == "open" or (op.kind == "preempt" and await self.current(sub) is None):
            try:
                await adapter.open(self.spec(sub, op.arg or "a"), hold=False)
            except PodsRemain:  # opened, held while the previous execution's pods go
                self.desired[sub] = "running"
                raise
            self.desired[sub] = "running"
            return "ok"
        if op.kind == "edit_runtime":
            self.edits += 1
            rt = await self.admin.get(api.RUNTIMES, RUNTIME)
            tmpl = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            tmpl.setdefault("metadata", {}).setdefault("annotations", {})[EDIT_ANNOTATION] = str(self.edits)
            await self.admin.replace(api.RUNTIMES, RUNTIME, rt)
            return "ok"
        name = await self.current(sub)
        if name is None:
            return "skipped (not open)"
        if op.kind in ("release", "preempt"):
            self.desired[sub] = "running"
            await adapter.release(name)
        elif op.kind == "hold":
            self.desired[sub] = "held"
            await adapter.hold(name)
        elif op.kind == "close":
            self.desired[sub] = "absent"
            await adapter.close(name)
        elif op.kind == "sdk_delete":
            self.desired[sub] = "absent"
            await asyncio.to_thread(self._sdk_delete, op.who % len(self.writers), name)
        elif op.kind in ("delete_pod", "force_delete_pod"):
            pods = sorted(p["metadata"]["name"] for p in await self.pods(sub))
            if not pods:
                return "skipped (no pod)"
            await self.editor.delete(k.PODS, pods[0], grace_seconds=0 if op.kind == "force_delete_pod" else None)
        elif op.kind == "delete_job":
            jobs = sorted(j["metadata"]["name"] for j in (await self.editor.list(
                k.JOBS, labels=f"jobset.sigs.k8s.io/jobset-name={name}")).items)
            if not jobs:
                return "skipped (no Job)"
            await self.editor.delete(k.JOBS, jobs[0], propagation="Background")
        elif op.kind == "delete_jobset":
            try:
                await self.editor.delete(k.JOBSETS, name, propagation="Background")
            except Refused as e:
                if e.code != 403:
                    raise
                # the built-in edit role covers no JobSets unless JobSet's install aggregates a role to it
                # (the testbed's does not): the operator deletes it instead
                await self.admin.delete(k.JOBSETS, name, propagation="Background")
                return "ok (by the operator: edit may not delete JobSets)"
        else:
            raise ValueError(f"unknown action {op.kind}")
        return "ok"

    async def namespace_cycle(self) -> str:
        """A cluster admin deletes the namespace while things run, waits for it to go, creates it again under
        its name and makes again what lives in it (``_provision``); the writers then go on. Every submission
        is absent after it (its record went with the namespace); the oracles judge on across it, per
        submission: A keeps rising (the cluster-scoped floor stays) and no two processes overlap. A namespace
        that does not go within the bound is noted with what remains in it and waited for once more, the
        faults in force healed first (a frozen node keeps its pods); then the campaign goes on without it, and
        it is made again once it goes (``_namespace_back``)."""
        assert self.admin is not None
        if self.ns_gone:
            return "skipped (the namespace is not made again yet)"
        ns, t0 = self.ns, time.monotonic()
        await self.admin.delete(k.NAMESPACES, ns)
        self.ns_gone = True
        for sub in SUBMISSIONS:  # every record and object goes with it: nothing is open any more
            if sub in self.desired:
                self.desired[sub] = "absent"
        if await self._wait_gone(NAMESPACE_GONE_TIMEOUT):
            return await self._recreate(t0)
        self.note(f"namespace_cycle({ns}): not gone {NAMESPACE_GONE_TIMEOUT:.0f} s after its deletion: "
                  f"{await self._remains()}")
        if self.active:
            self.log(f"namespace_cycle({ns}): healing the faults in force ({', '.join(sorted(self.active))}) "
                     "and waiting once more")
            await self._heal_everything()
        if await self._wait_gone(NAMESPACE_GONE_TIMEOUT):
            return await self._recreate(t0)
        self.ns_pending = True
        self.note(f"namespace_cycle({ns}): not gone {time.monotonic() - t0:.0f} s after its deletion; the "
                  f"campaign goes on without it, made again once it goes: {await self._remains()}")
        return "not gone"

    async def _wait_gone(self, bound: float) -> bool:
        """Whether the namespace went within ``bound`` s (polled each 1.5 s; a replica that exited meanwhile is
        started again, as its Deployment would: its keeper frees the pods the deletion waits for)."""
        assert self.admin is not None
        t0 = time.monotonic()
        while True:
            try:
                if await self.admin.get_or_none(k.NAMESPACES, self.ns) is None:
                    return True
            except DispatchError as e:
                self.log(f"namespace_cycle({self.ns}): reading the namespace: {_outcome(e)}")
            if time.monotonic() - t0 >= bound:
                return False
            await self.supervise()
            await asyncio.sleep(1.5)

    async def _remains(self) -> str:
        """What is still in the namespace (``namespace_remains``), read as the admin."""
        assert self.admin is not None
        objects: list[Obj] = []
        with contextlib.suppress(DispatchError):
            got = await self.admin.get_or_none(k.NAMESPACES, self.ns)
            if got is not None:
                objects.append({**got, "kind": "Namespace"})
        for res in NAMESPACED_KINDS:
            try:
                objects += [{**o, "kind": res.kind} for o in (await self.admin.list(res, self.ns)).items]
            except DispatchError as e:
                objects.append({"kind": res.kind, "metadata": {"name": f"(not listed: {_outcome(e)})"}})
        return namespace_remains(self.ns, objects)

    async def _namespace_back(self, bound: float = 0.0) -> bool:
        """Whether the namespace is there again: a cycle whose namespace did not go is finished once it has
        (waiting up to ``bound`` s for it), so the writers go on."""
        if not self.ns_gone:
            return True
        if not self.ns_pending or not await self._wait_gone(bound):
            return False
        self.ns_pending = False
        outcome = await self._recreate(None)
        self.report.outcomes[f"{NAMESPACE_CYCLE}: late {outcome}"] += 1
        return not self.ns_gone

    async def _recreate(self, t0: float | None) -> str:
        """The namespace made again under its name, its LocalQueue (at the campaign's ClusterQueue) and what
        ``_provision`` makes; the guard answering there again (its webhooks and policies select the namespace
        by name, and stayed)."""
        assert self.admin is not None
        ns = self.ns
        took = f"gone in {time.monotonic() - t0:.0f} s" if t0 is not None else "gone late"
        try:
            await self.admin.create(k.NAMESPACES, {"metadata": {"name": ns}})
            await self.admin.create(harness.LOCALQUEUES, {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": self.cq}})
            await self._provision()
        except Exception as e:
            self.note(f"namespace_cycle({ns}): {took}, but making it again failed: {e!r}; tried again in the "
                      "next round")
            with contextlib.suppress(Exception):  # from scratch: what was made goes, then all is made again
                await self.admin.delete(k.NAMESPACES, ns)
            self.ns_pending = True
            return f"not made again ({_outcome(e)})"
        self.ns_gone = False
        admin = self.admin
        try:
            await harness.until(lambda: harness.probe_denied(admin, ns), timeout=60, what="the guard answering")
        except AssertionError:
            self.note(f"namespace_cycle({ns}): the guard does not answer in the new namespace within 60 s")
        self.note(f"namespace_cycle({ns}): ok ({took})")  # the time in the report's notes; the outcome is "ok"
        return "ok"

    def _sdk_delete(self, who: int, name: str) -> None:
        """``TrainerClient().delete_job(name)`` of the Kubeflow SDK, with writer ``who``'s kubeconfig: the
        TrainJob goes as any SDK user deletes one, its layers left to the garbage collector."""
        from kubeflow.common.types import KubernetesBackendConfig
        from kubeflow.trainer import TrainerClient

        config = KubernetesBackendConfig(namespace=self.ns,
                                         config_file=str(self.workdir / "credentials" / f"writer-{who}.kubeconfig"))
        TrainerClient(config).delete_job(name)

    # ------------------------------------------------------------------------------------------ faults

    async def node(self) -> Obj | None:
        assert self.admin is not None
        return await self.admin.get_or_none(k.NODES, NODE)

    @staticmethod
    def ready(node: Obj | None) -> str:
        if node is None:
            return "gone"
        return next((str(c.get("status")) for c in (node.get("status") or {}).get("conditions") or []
                     if c.get("type") == "Ready"), "?")

    async def leader(self) -> Replica | None:
        assert self.admin is not None
        lease = await self.admin.get_or_none(k.LEASES, LEASE, self.lease_ns)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return next((r for r in self.replicas if r.identity == holder), None)

    async def fault(self, op: Op) -> str:
        assert self.admin is not None
        kind = op.kind
        if kind == "freeze":
            await asyncio.to_thread(testbed.freeze, NODE)
        elif kind in ("kubelet_restart", "containerd_restart"):
            await asyncio.to_thread(testbed.stop_component, kind.split("_")[0])
        elif kind == "node_delete":
            await self.admin.delete(k.NODES, NODE)
        elif kind == "power_off":
            await asyncio.to_thread(testbed.power_off, NODE)
        elif kind == "oos_taint":
            state = "frozen" if "freeze" in self.active else self.ready(await self.node())
            if state == "gone":
                return "skipped (no Node to taint)"
            try:
                await asyncio.to_thread(testbed.kubectl, "taint", "node", NODE, f"{OOS}=nodeshutdown:NoExecute",
                                        "--overwrite")
            except RuntimeError as exc:
                if "NotFound" not in str(exc):
                    raise
                return "skipped (the Node was deleted meanwhile)"  # a node_delete fault racing this one
            self.taint_windows.append((_now_ms(), None))
            self.note(f"out-of-service taint on {NODE} while its kubelet was {state} (its processes not shown "
                      "to have stopped: the operator's error the contract rules out)")
        elif kind == "apiserver_restart":
            return await self._apiserver_restart(op)
        elif kind == "leader_kill":
            name = await self.current(op.target)
            if name is not None:  # something for the leader to admit: held, its pods gone, then released
                self.desired[op.target] = "running"
                with contextlib.suppress(Exception):
                    await self.writers[0].hold(name)

                    async def gone() -> bool:
                        return not await self.pods(op.target)
                    await harness.until(gone, timeout=30, what="its pods gone", poll=0.2)
                with contextlib.suppress(Exception):
                    await self.writers[0].release(name)
            await asyncio.sleep(float(op.arg or 0))
            leader = await self.leader()
            if leader is None:
                return "skipped (no leader)"
            leader.held_down = True
            leader.kill()
            self.log(f"killed the leader, replica {leader.index}")
        elif kind == "replicas_down":
            for r in self.replicas:
                r.held_down = True
                r.kill()
            if not self.ns_gone:  # nothing to create in a namespace that is not there
                await self._guard_down_checks()
        else:
            raise ValueError(f"unknown fault {kind}")
        self.active.add(kind)
        return "ok"

    async def _apiserver_restart(self, op: Op) -> str:
        before, _, down = (op.arg or "0:5").partition(":")
        name = await self.current(op.target)
        call: asyncio.Task[Any] | None = None
        if name is not None:
            self.desired[op.target] = "running"
            call = asyncio.create_task(self.writers[0].release(name))
        await asyncio.sleep(float(before))
        await asyncio.to_thread(testbed.stop_component, "kube-apiserver")
        try:
            await asyncio.sleep(float(down or 5))
        finally:
            await asyncio.to_thread(testbed.start_component, "kube-apiserver")
        if call is not None:
            try:
                await asyncio.wait_for(call, 60)
                return "ok (release went through)"
            except Exception as e:
                return f"ok (release: {_outcome(e)})"
        return "ok"

    async def _guard_down_checks(self) -> None:
        """With no replica answering: every start of a dispatch object is refused, and other writes pass."""
        assert self.admin is not None
        c = self.report.guard_down
        answers: list[str] = []
        await harness.probe_denied(self.admin, self.ns, answers)  # a create of an unsuspended dispatch TrainJob
        if answers and answers[-1].startswith("created"):
            c["accepted"] += 1
            self.note("an unsuspended dispatch TrainJob was created (dry run) while no guard replica answered")
        else:
            c["refused"] += 1
        pod = realnode.workload_pod("campaign-probe", self.ns, self.oracle_dir,
                                    labels={LABEL_JOB_ID: "probe", LABEL_SUBMISSION: SUBMISSION})
        try:
            await self.admin.create(k.PODS, pod, dry_run=True)
            c["accepted"] += 1
            self.note("a pod of a dispatch object was created (dry run) while no guard replica answered")
        except DispatchError:
            c["refused"] += 1
        for sub in SUBMISSIONS:
            name = await self.current(sub)
            if name is None:
                continue
            tj = await self.admin.get(k.TRAINJOBS, name)
            if not (tj.get("spec") or {}).get("suspend"):
                continue
            got = await asyncio.to_thread(testbed.kubectl, "-n", self.ns, "patch", "trainjob", name, "--type",
                                          "merge", "-p", '{"spec":{"suspend":false}}', "--dry-run=server",
                                          check=False)
            if got.returncode == 0:
                c["accepted"] += 1
                self.note(f"{name} was unsuspended (dry run) while no guard replica answered")
            else:
                c["refused"] += 1
        other = {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
                 "metadata": {"name": "campaign-other", "namespace": self.ns},
                 "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": False}}
        plain = realnode.workload_pod("campaign-other", self.ns, self.oracle_dir)
        for res, obj in ((k.TRAINJOBS, other), (k.PODS, plain)):
            # only an answer of the API server counts: a create that never reached it (the API server's own
            # restart overlapping the replicas' outage, seen twice in each campaign with both faults) is asked
            # again, and counted apart if it never is answered
            for attempt in range(5):
                try:
                    await self.admin.create(res, obj, dry_run=True)
                    c["other passed"] += 1
                except DispatchError as e:
                    if UNANSWERED in str(e):
                        if attempt < 4:
                            await asyncio.sleep(3)
                            continue
                        c["other unanswered"] += 1
                    else:
                        c["other refused"] += 1
                        self.note(f"a {res.kind} of no dispatch object was refused while the guard was down: {e}")
                break

    async def heal(self, kind: str) -> str:
        if kind not in self.active:
            return "skipped (not in force)"
        if kind == "freeze":
            await asyncio.to_thread(testbed.thaw, NODE)
        elif kind in ("kubelet_restart", "containerd_restart"):
            await asyncio.to_thread(testbed.start_component, kind.split("_")[0])
        elif kind == "node_delete":
            await self._node_back()
        elif kind == "power_off":
            await asyncio.to_thread(testbed.power_on, NODE)
        elif kind == "oos_taint":
            await asyncio.to_thread(testbed.kubectl, "taint", "node", NODE, f"{OOS}-", check=False)
            self.taint_windows = [(a, b if b is not None else _now_ms()) for a, b in self.taint_windows]
        elif kind in CONTROLLER_FAULTS:
            for r in self.replicas:
                if r.held_down:
                    r.held_down = False
                    await r.start()
        self.active.discard(kind)
        return "ok"

    async def _node_back(self) -> None:
        """The deleted Node registered again by its live kubelet, or (a finding) the kubelet restarted to."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            if await self.node() is not None:
                self.note(f"{NODE}'s live kubelet registered its Node again {time.monotonic() - t0:.1f} s after "
                          "the heal began")
                return
            await asyncio.sleep(1)
        self.note(f"{NODE}'s live kubelet did not register its deleted Node again within 30 s; restarted it")
        await asyncio.to_thread(testbed.stop_component, "kubelet")
        await asyncio.to_thread(testbed.start_component, "kubelet")

    async def _heal_everything(self) -> None:
        """Every fault healed, whatever the schedule did: the node thawed, untainted, its kubelet and containerd
        running and Ready; both replicas up. Also after a failure: the testbed is shared."""
        for kind in ("freeze", "oos_taint", "power_off", "kubelet_restart", "containerd_restart", "node_delete",
                     "leader_kill", "replicas_down"):
            if kind in self.active:
                try:
                    await self.heal(kind)
                except Exception as e:
                    self.log(f"heal {kind} failed: {e!r}")
        with contextlib.suppress(Exception):
            await asyncio.to_thread(testbed.thaw, NODE)
        await asyncio.to_thread(testbed.kubectl, "taint", "node", NODE, f"{OOS}-", check=False)
        for component in ("kube-apiserver", "containerd", "kubelet"):
            await asyncio.to_thread(testbed.start_component, component)
        for r in self.replicas:
            if not r.alive():
                r.held_down = False
                await r.start()

    async def supervise(self) -> None:
        """A replica that exited by itself is started again, as its Deployment would (and noted)."""
        for r in self.replicas:
            if not r.held_down and not r.alive():
                code = r.launched.proc.returncode if r.launched is not None else None
                self.note(f"replica {r.index} exited by itself (code {code}); started again")
                await r.start()

    # ------------------------------------------------------------------------------------------ oracles

    def observe(self) -> list[str]:
        records = oracle.read(realnode.oracle_file(self.oracle_dir)) if self.oracle_dir.exists() else []
        procs = oracle.processes(records)
        report = realnode.fence_report(self.oracle_dir)
        events: list[FenceEvent] = parse_fence_events(report.read_text()) if report.exists() else []
        logs = self._read_logs()
        found = judge(records, procs, events, logs)
        by_run = {p.run: p for p in procs}
        for kind in (found.overlaps, found.same_a_overlaps):
            for key in list(kind):
                first, second = (by_run[r] for r in key.split("+"))
                if excused_by_taint(first, second, self.taint_windows):
                    self.excused[key] = kind.pop(key)
        new = self.report.judgement.merge(found)
        r = self.report
        r.processes = len(procs)
        r.executions = len({(p.job_id, p.submission, p.admission) for p in procs})
        r.commits = sum(1 for e in events if e.event == "commit")
        r.fenced = sum(1 for e in events if e.event in ("fenced", "refused"))
        return new

    def _read_logs(self) -> dict[tuple[str, str], list[LogEntry]]:
        """Every fence log under the checkpoint root, reading only entries not read before."""
        for log in sorted(self.checkpoints.glob("*/*/log")) if self.checkpoints.exists() else []:
            known = self.log_entries.setdefault((log.parent.parent.name, log.parent.name), {})
            seq = max(known, default=0) + 1
            while True:
                f = log / f"{seq:012d}"
                try:
                    raw = json.loads(f.read_text())
                except (OSError, ValueError):
                    break
                known[seq] = LogEntry(seq, str(raw["kind"]), int(raw["admission"]), int(raw.get("step", -1)))
                seq += 1
        return {key: list(v.values()) for key, v in self.log_entries.items()}

    # ------------------------------------------------------------------------------------------ liveness

    async def running_as_admitted(self, sub: str) -> tuple[bool, str]:
        """Whether the submission runs: its TrainJob Running and a live process of its A on the node."""
        name = await self.current(sub)
        if name is None:
            return False, "no object"
        st = await self.writers[0].inspect(name)
        a = str(st.identity.admission)
        if st.state.value != "Running":
            orphan = [w for w in st.warnings if d.ORPHANED in w]
            return False, f"{st.state.value}: {st.cause.reason}: {st.cause.detail}" + "".join(f"; {w}" for w in orphan)
        procs = oracle.processes(oracle.read(realnode.oracle_file(self.oracle_dir)))
        if not any(p.alive and p.job_id == sub and p.admission == a for p in procs):
            # what status says of it (a rank kept from starting names the pod and the word that ends its wait)
            said = st.cause.detail if st.cause is not None else ""
            more = f" (status: {said})" if said and said != f"execution {a} admitted" else ""
            return False, f"Running as A={a} but no live process of A={a} on the node yet{more}"
        return True, f"A={a}"

    async def liveness(self) -> None:
        """Once every fault is healed: every submission (but the preemptor, held so the queue has room) runs
        within the bound, the runner doing what its status names (open a closed one, release a held one; a
        Failed one closed and opened again)."""
        assert self.admin is not None
        await self._heal_everything()
        if self.ns_gone and not await self._namespace_back(NAMESPACE_GONE_TIMEOUT):
            self.note(f"namespace {self.ns} not there again at the liveness pass: nothing can run again")
        async def node_ready() -> bool:
            return self.ready(await self.node()) == "True"
        try:
            await harness.until(node_ready, timeout=NODE_READY_TIMEOUT, what=f"{NODE} Ready", poll=1)
        except AssertionError:
            self.note(f"{NODE} not Ready {NODE_READY_TIMEOUT:.0f} s after every fault was healed")
        if self.desired.get(PREEMPTOR) == "running":
            # the queue holds two: with the preemptor running one low submission waits for quota by design
            name = await self.current(PREEMPTOR)
            if name is not None:
                with contextlib.suppress(Exception):
                    await self.writers[0].hold(name)
                    self.report.liveness_actions["hold the preemptor"] += 1
            self.desired[PREEMPTOR] = "held"
        # every object, not only those the writers left running: the held ones released, the closed ones
        # opened again (each an action the runner takes, counted), then each must run within the bound
        want = sorted(s for s in SUBMISSIONS if s != PREEMPTOR)
        for sub in want:
            if self.desired.get(sub) != "running":
                self.report.liveness_actions[f"bring {self.desired.get(sub, 'unopened')} back"] += 1
                self.desired[sub] = "running"
        last: dict[str, str] = {}
        t0 = time.monotonic()
        waiting = set(want)
        while waiting and time.monotonic() - t0 < self.liveness_seconds:
            for sub in sorted(waiting):
                try:
                    ok, why = await self.running_as_admitted(sub)
                except Exception as e:
                    ok, why = False, f"inspect: {_outcome(e)}"
                last[sub] = why
                if ok:
                    waiting.discard(sub)
                    continue
                await self._liveness_action(sub, why)
            await asyncio.sleep(3)
        for sub in sorted(waiting):
            self.report.stalls[sub] = last.get(sub, "?")
            try:
                where = await self.diagnose(sub)
                self.report.stalls[sub] += f" (what the cluster held: {where})"
            except Exception as e:
                self.log(f"diagnose {sub}: {e!r}")
        self.log(f"liveness: {len(want) - len(waiting)} of {len(want)} running "
                 f"{time.monotonic() - t0:.0f} s after healing")

    async def diagnose(self, sub: str) -> str:
        """What the cluster holds of a stalled submission (its TrainJob, JobSet, Jobs, pods and their Events),
        written to ``stall-<sub>.json``; returns the file's name and a one-line summary of the pods and Jobs."""
        assert self.admin is not None
        name = await self.current(sub)
        out: dict[str, Any] = {"trainjob": None, "jobset": None, "jobs": [], "pods": [], "events": []}
        if name is not None:
            out["trainjob"] = await self.admin.get_or_none(k.TRAINJOBS, name)
            out["jobset"] = await self.admin.get_or_none(k.JOBSETS, name)
            out["jobs"] = (await self.admin.list(k.JOBS, labels=f"jobset.sigs.k8s.io/jobset-name={name}")).items
        pods = (await self.admin.list(k.PODS, labels=f"{LABEL_JOB_ID}={sub}")).items
        out["pods"] = pods
        names = {name, *(j["metadata"]["name"] for j in out["jobs"]), *(p["metadata"]["name"] for p in pods)}
        out["events"] = [e for e in (await self.admin.list(api.EVENTS)).items
                         if (e.get("involvedObject") or {}).get("name") in names]
        path = self.workdir / f"stall-{sub}.json"
        path.write_text(json.dumps(out, indent=1, default=str))
        said = [f"pod {p['metadata']['name']} {(p.get('status') or {}).get('phase')}"
                f"{' deleting' if p['metadata'].get('deletionTimestamp') else ''}"
                f" A={p['metadata'].get('labels', {}).get('dispatch.phpboyscout.uk/admission')}" for p in pods]
        said += [f"Job {j['metadata']['name']} active={(j.get('status') or {}).get('active', 0)} "
                 f"failed={(j.get('status') or {}).get('failed', 0)}" for j in out["jobs"]]
        last = sorted(out["events"], key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))[-3:]
        said += [f"{e.get('reason')}: {str(e.get('message'))[:160]}" for e in last]
        return f"{path.name}: " + "; ".join(said)

    async def _liveness_action(self, sub: str, why: str) -> None:
        name = await self.current(sub)
        adapter = self.writers[0]
        try:
            if d.FOREIGN_FINALIZER in why:
                freed = await self._remove_foreign_finalizers(sub)
                self.report.liveness_actions[f"remove another controller's finalizer from {freed} pod(s)"] += 1
            elif name is not None and (d.ORPHANED in why or d.ORPHANED_JOB in why):
                gone = await self._remove_orphans(name)
                self.report.liveness_actions[f"delete an earlier TrainJob's {gone or 'nothing'}"] += 1
            elif d.KIN in why and (kin := await self._remove_kin(why)):
                self.report.liveness_actions[f"delete a closed TrainJob's {kin}"] += 1
            elif name is None:
                await adapter.open(self.spec(sub, "a"), hold=False)
                self.report.liveness_actions["open"] += 1
            elif name is not None and why.startswith("Running") and (word := named_word(why)) is not None:
                await self._give_word(sub, word)
            elif why.startswith(("Failed", "Succeeded")) or d.KUEUE_NEVER_ADMITS in why:
                await adapter.close(name)
                self.report.liveness_actions["close and open again"] += 1
            elif why.startswith(("Held", "Queued")):
                await adapter.release(name)
                self.report.liveness_actions["release"] += 1
        except Exception as e:
            self.report.liveness_actions[f"{'open' if name is None else 'release'} {_outcome(e)}"] += 1
            if name is not None and (d.ORPHANED in str(e) or d.ORPHANED_JOB in str(e)):  # refused naming them
                with contextlib.suppress(Exception):
                    gone = await self._remove_orphans(name)
                    self.report.liveness_actions[f"delete an earlier TrainJob's {gone or 'nothing'}"] += 1

    async def _remove_foreign_finalizers(self, sub: str) -> int:
        """What status names for a deleted pod whose end is proven but another controller's finalizer keeps:
        that finalizer removed (the operator's patch). Only pods being deleted, never dispatch's finalizer."""
        assert self.admin is not None
        freed = 0
        for pod in (await self.admin.list(k.PODS, labels=f"{LABEL_JOB_ID}={sub}")).items:
            fins = pod["metadata"].get("finalizers") or []
            if pod["metadata"].get("deletionTimestamp") and fins and POD_FINALIZER not in fins:
                await self.admin.merge_patch(k.PODS, pod["metadata"]["name"], {"metadata": {"finalizers": None}})
                freed += 1
        return freed

    async def _give_word(self, sub: str, word: Word) -> None:
        """The operator's word a running object's status names for the pod that keeps a rank of it from starting
        (``campaign.named_word``), given as the runbook says: only once the process oracle shows no live process
        of the submission (the operator checked the machine), and for ``node-down`` with the node shut down
        first (powered off, then on again once the word was taken)."""
        assert self.operator is not None
        procs = oracle.processes(oracle.read(realnode.oracle_file(self.oracle_dir)))
        if any(p.alive and p.job_id == sub for p in procs):
            self.report.liveness_actions[f"release-pod --{word.kind}: not given, a process of {sub} lives"] += 1
            return
        if word.kind == "process-gone":
            await self.operator.release_pod(word.pod, process_gone=True)
            self.report.liveness_actions["release-pod --process-gone"] += 1
            self.note(f"released pod {word.pod} of {sub} with --process-gone, as its status named")
            return
        self.note(f"shutting {word.node} down to release pod {word.pod} of {sub} with --node-confirmed-down, as its "
                  "status named")
        await asyncio.to_thread(testbed.power_off, word.node)
        try:
            async def taken() -> bool:
                assert self.operator is not None
                try:
                    await self.operator.release_pod(word.pod, node_confirmed_down=True)
                except Refused as e:
                    if e.reason != "NodeReady":  # refused until the node controller stops calling it Ready
                        raise
                    return False
                return True
            await harness.until(taken, timeout=NODE_READY_TIMEOUT, what=f"{word.node} no longer Ready", poll=2)
            self.report.liveness_actions["shut the node down, release-pod --node-confirmed-down"] += 1
        finally:
            await asyncio.to_thread(testbed.power_on, word.node)

    async def _remove_kin(self, why: str) -> str:
        """What status names for layers of the submission under another TrainJob name that a close left and the
        collector missed (``d.kin_blockers``, seen after kube-apiserver restarts: a closed TrainJob's JobSet, not
        suspended, its pod running on): its JobSet and snapshot deleted as the named command does, each only
        while the TrainJob that controlled it is gone, and a named Job only while its JobSet is gone. Their pods
        then stay under dispatch's rule until each one's end is proven. Returns what was deleted."""
        assert self.admin is not None
        gone: list[str] = []
        jobsets, jobs = kin_layers(why)
        for js_name in jobsets:
            jobset = await self.admin.get_or_none(k.JOBSETS, js_name)
            owner = next((o for o in (jobset or {}).get("metadata", {}).get("ownerReferences") or []
                          if o.get("controller") and o.get("kind") == "TrainJob"), None)
            if jobset is None or owner is None:
                continue
            tj = await self.admin.get_or_none(k.TRAINJOBS, str(owner.get("name")))
            if tj is not None and tj["metadata"]["uid"] == owner.get("uid"):
                continue  # its TrainJob lives: not the collector's miss
            await self.admin.delete(k.JOBSETS, js_name, propagation="Background")
            gone.append(f"JobSet {js_name}")
            with contextlib.suppress(NotFound):
                await self.admin.delete(k.CONFIGMAPS, f"{js_name}-runtime-snapshot", propagation="Background")
                gone.append(f"ConfigMap {js_name}-runtime-snapshot")
        for job_name in jobs:
            job = await self.admin.get_or_none(k.JOBS, job_name)
            owner = next((o for o in (job or {}).get("metadata", {}).get("ownerReferences") or []
                          if o.get("controller") and o.get("kind") == "JobSet"), None)
            if job is None:
                continue
            if owner is not None:
                jobset = await self.admin.get_or_none(k.JOBSETS, str(owner.get("name")))
                if jobset is not None and jobset["metadata"]["uid"] == owner.get("uid"):
                    continue
            await self.admin.delete(k.JOBS, job_name, propagation="Background")
            gone.append(f"Job {job_name}")
        if gone:
            self.note(f"deleted {', '.join(gone)} of a closed TrainJob of the submission, as status named")
        return " and ".join(gone)

    async def _remove_orphans(self, name: str) -> str:
        """The actions status names for layers an earlier TrainJob or JobSet of the name left
        (``d.orphan_removal``, ``d.job_removal``), taken by the operator: its JobSet and Trainer's snapshot
        ConfigMap, each only while still controlled by a TrainJob uid other than the current one's, and child
        Jobs of the name controlled by a JobSet uid other than the current JobSet's. Returns what was deleted."""
        assert self.admin is not None
        tj = await self.admin.get_or_none(k.TRAINJOBS, name)
        uid = str(tj["metadata"]["uid"]) if tj is not None else ""
        gone = []
        for res, obj_name in ((k.JOBSETS, name), (k.CONFIGMAPS, f"{name}-runtime-snapshot")):
            got = await self.admin.get_or_none(res, obj_name)
            owners = [o for o in (got or {}).get("metadata", {}).get("ownerReferences") or []
                      if o.get("controller") and o.get("kind") == "TrainJob"]
            if got is not None and owners and owners[0].get("uid") != uid:
                await self.admin.delete(res, obj_name, propagation="Background")
                gone.append(res.kind)
        jobset = await self.admin.get_or_none(k.JOBSETS, name)
        current = str(jobset["metadata"]["uid"]) if jobset is not None else ""
        for job in (await self.admin.list(k.JOBS, labels=f"jobset.sigs.k8s.io/jobset-name={name}")).items:
            owners = [o for o in job["metadata"].get("ownerReferences") or []
                      if o.get("controller") and o.get("kind") == "JobSet"]
            if not owners or owners[0].get("uid") != current:
                await self.admin.delete(k.JOBS, job["metadata"]["name"], propagation="Background")
                gone.append(f"Job {job['metadata']['name']}")
        self.note(f"deleted {', '.join(gone) or 'nothing'} of an earlier TrainJob {name}, as its status named")
        return " and ".join(gone)

    # ------------------------------------------------------------------------------------------ the run

    async def one(self, op: Op) -> None:
        kind = op.kind
        try:
            if kind == "heal":
                outcome = await self.heal(op.target)
            elif kind in FAULTS:
                self.report.faults[kind] += 1
                outcome = await self.fault(op)
            else:
                self.report.actions[kind] += 1
                outcome = await self.act(op)
        except Exception as e:
            outcome = _outcome(e)
            if not isinstance(e, DispatchError):
                self.log(f"{op}: {''.join(traceback.format_exception_only(e)).strip()}")
        self.report.outcomes[f"{kind}: {outcome}"] += 1
        self.log(f"{op}: {outcome}")

    async def play(self, minutes: float | None) -> Schedule:
        """Play the rounds (until ``minutes`` if given); returns the rounds played (what a replay runs)."""
        deadline = None if minutes is None else time.monotonic() + minutes * 60
        played: list[Round] = []
        sched_file = self.workdir / "schedule.json"
        self.report.schedule_file = str(sched_file)
        for rnd in self.schedule.rounds:
            if deadline is not None and time.monotonic() > deadline:
                break
            self.round_no = len(played) + 1
            played.append(rnd)
            if self.ns_gone:  # a cycle whose namespace had not gone: made again now if it has
                await self._namespace_back()
            sched_file.write_text(json.dumps(Schedule(self.schedule.seed, tuple(played),
                                                      self.schedule.faults).to_json(), indent=1))
            # a namespace_cycle runs once the round's other ops are done, and nothing runs beside its wait
            await asyncio.gather(*(self.one(op) for op in rnd.ops if op.kind != NAMESPACE_CYCLE))
            for op in rnd.ops:
                if op.kind == NAMESPACE_CYCLE:
                    await self.one(op)
            await asyncio.sleep(rnd.pause)
            await self.supervise()
            for text in self.observe():
                self.log(f"ORACLE {text}")
        self.report.rounds = len(played)
        self.report.ops = sum(len(r.ops) for r in played)
        return Schedule(self.schedule.seed, tuple(played), self.schedule.faults)

    async def run(self, minutes: float | None) -> Report:
        path = harness.running_testbed_kubeconfig()
        if path is None:
            raise RuntimeError("the testbed is not up (python -m dispatch.testbed status)")
        if testbed.real_node() is None:
            raise RuntimeError(f"the testbed has no real node: {testbed.real_node_problem()}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.report.stack = testbed.stack()
        async with self.installed(path):
            try:
                played = await self.play(minutes)
                (self.workdir / "schedule.json").write_text(json.dumps(played.to_json(), indent=1))
                self.round_no += 1
                await self.liveness()
                for text in self.observe():
                    self.log(f"ORACLE {text}")
                assert self.admin is not None
                for e in (await self.admin.list(api.EVENTS)).items:
                    self.report.events[f"{e.get('reason', '?')}"] += int(e.get("count") or 1)
            finally:
                await self._heal_everything()
        self.report.minutes = (time.monotonic() - t0) / 60
        if self.excused:
            self.report.findings += [f"overlap after an out-of-service taint on a node not shut down: {t}"
                                     for t in sorted(self.excused.values())]
        (self.workdir / "report.json").write_text(json.dumps(self.report.to_json(), indent=1))
        return self.report


def run(schedule: Schedule, *, minutes: float | None, workdir: Path | None = None, liveness_seconds: float = 240.0,
        shrink_budget: int = 0) -> Report:
    """Run ``schedule`` (until ``minutes``, if given) on the running testbed; when it fails and
    ``shrink_budget`` allows, replay ever smaller schedules and write the smallest that still fails to
    ``<workdir>/shrunk.json``."""
    base = workdir or Path(tempfile.mkdtemp(prefix="dispatch-campaign-"))
    base.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(Campaign(schedule, base / "run", liveness_seconds).run(minutes))
    if report.failed and shrink_budget > 0:
        played = Schedule.from_json(json.loads(Path(report.schedule_file).read_text()))
        tries = 0

        def fails(candidate: Schedule) -> bool:
            nonlocal tries
            tries += 1
            got = asyncio.run(Campaign(candidate, base / f"shrink-{tries}-{uuid.uuid4().hex[:4]}",
                                       liveness_seconds).run(None))
            print(f"[campaign] shrink try {tries}: {len(candidate.ops)} ops: "
                  f"{'fails' if got.failed else 'passes'} {got.counts()}", flush=True)
            return got.failed
        small = shrink(played, fails, budget=shrink_budget, log=print)
        out = base / "shrunk.json"
        out.write_text(json.dumps(small.to_json(), indent=1))
        report.findings.append(f"shrunk to {len(small.ops)} ops in {len(small.rounds)} rounds ({tries} replays): "
                               f"{out}; " + "; ".join(str(op) for op in small.ops))
        (base / "run" / "report.json").write_text(json.dumps(report.to_json(), indent=1))
    return report


__all__ = ["Campaign", "Forwarder", "Judgement", "Replica", "run"]
