"""A MultiKueue fleet on one machine: a manager and two workers, each its own control plane (issue 26).

Each cluster is a testbed of its own, started by ``python -m dispatch.testbed up`` in a child process with
its own ``DISPATCH_TESTBED_DIR`` (beside the single testbed's: ``<dir>-manager``, ``<dir>-worker-1``, ...)
and ``DISPATCH_TESTBED_PORT_OFFSET`` (200, 300, 400 by default), so the single testbed runs beside the fleet
untouched. The port plan is fixed when a process imports the testbed, which is why every per-cluster action
runs in a child process pointed at that cluster rather than in this one.

The manager (``DISPATCH_TESTBED_ROLE=manager``) has etcd, an API server, the controller-manager, Trainer
(its webhook checks a TrainJob's runtime, so the runtimes are installed there too) and Kueue with its
``multiKueue:`` block; no nodes, scheduler or JobSet controller: a TrainJob queued there gets
``spec.managedBy: kueue.x-k8s.io/multikueue`` and runs in a worker. The workers are full testbeds without
the real node (it belongs to the single testbed). :func:`up` wires the manager to the workers (Secrets,
MultiKueueClusters, MultiKueueConfig, AdmissionCheck ``multikueue``, ClusterQueue ``cq-multikueue``) and gives
each worker ClusterQueue ``cq-fleet``; :func:`namespace` makes a namespace and LocalQueue on all three.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dispatch._api import Obj
from dispatch.testbed import _manifests as mf
from dispatch.testbed import _paths
from dispatch.testbed._cluster import MULTIKUEUE_ENV, ROLE_ENV

MANAGER = "manager"
WORKERS = ("worker-1", "worker-2")
PORT_OFFSET_ENV = "DISPATCH_TESTBED_FLEET_PORT_OFFSET"
"""Port offset of the manager (default 200); worker-N gets it plus 100 * N."""
MULTIKUEUE_QUEUE = "cq-multikueue"
MULTIKUEUE_CONFIG = "multikueue"
"""The manager's MultiKueueConfig: the workers MultiKueue dispatches to and reads copies from."""
WORKER_QUEUE = "cq-fleet"
_DURATION = re.compile(r"([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+")


@dataclass(frozen=True)
class Cluster:
    """One cluster of the fleet: where its kubeconfig and runtime state are, and its port offset."""

    name: str
    role: str
    kubeconfig: Path
    runtime_dir: Path
    port_offset: int

    @property
    def server(self) -> str:
        """Its API server's URL."""
        return f"https://127.0.0.1:{mf._BASE_PORTS['apiserver'] + self.port_offset}"


@dataclass(frozen=True)
class Fleet:
    """The manager and the workers (whether or not they run: see :func:`is_up`)."""

    manager: Cluster
    workers: tuple[Cluster, ...]

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return (self.manager, *self.workers)

    def cluster(self, name: str) -> Cluster:
        """The cluster called ``name``; a clear error naming the known ones otherwise."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise ValueError(f"no cluster {name!r} in the fleet (known: {', '.join(c.name for c in self.clusters)})")


def _base_offset() -> int:
    raw = os.environ.get(PORT_OFFSET_ENV, "200").strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${PORT_OFFSET_ENV} must be an integer, not {raw!r}") from None


def fleet() -> Fleet:
    """The fleet's layout, next to the single testbed's runtime dir (``$DISPATCH_TESTBED_DIR``)."""
    base = _paths.runtime_dir()
    off = _base_offset()

    def make(name: str, role: str, i: int) -> Cluster:
        rt = base.parent / f"{base.name}-{name}"
        return Cluster(name, role, rt / "kubeconfig", rt, off + 100 * i)

    return Fleet(make(MANAGER, "manager", 0), tuple(make(w, "worker", i + 1) for i, w in enumerate(WORKERS)))


def _state_path() -> Path:
    base = _paths.runtime_dir()
    return base.parent / f"{base.name}-fleet.json"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise fleet up/down across processes (each cluster also has its own runtime-dir lock)."""
    base = _paths.runtime_dir()
    with (base.parent / f"{base.name}-fleet.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- children


def _env(c: Cluster, multikueue: Obj | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "DISPATCH_TESTBED_DIR": str(c.runtime_dir),
        "DISPATCH_TESTBED_PORT_OFFSET": str(c.port_offset),
        "DISPATCH_TESTBED_REAL_NODE": "0",  # the real node belongs to the single testbed
        ROLE_ENV: c.role,
    }
    env.pop(MULTIKUEUE_ENV, None)
    if multikueue is not None:
        env[MULTIKUEUE_ENV] = json.dumps(multikueue)
    return env


def _testbed(c: Cluster, *args: str, multikueue: Obj | None = None, timeout: float = 300.0,
             ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """``python -m dispatch.testbed ARGS`` pointed at cluster ``c``; raises with its stderr's tail unless its
    exit status is one of ``ok``."""
    argv = [sys.executable, "-m", "dispatch.testbed", *args]
    proc = subprocess.run(argv, env=_env(c, multikueue), capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode not in ok:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{c.name}: `dispatch.testbed {' '.join(args)}` failed (exit {proc.returncode}):\n{tail}")
    return proc


def _pump(prefix: str, stream: TextIO, out: TextIO, keep: list[str]) -> None:
    for line in stream:
        keep.append(line)
        print(f"[{prefix}] {line}", end="", file=out, flush=True)


def _start_all(plan: list[tuple[Cluster, Obj | None]], out: TextIO) -> None:
    """Start the clusters of ``plan`` at once (each ``up`` in a child), their log lines prefixed by name."""
    procs: list[tuple[Cluster, subprocess.Popen[str], list[str], threading.Thread]] = []
    for c, mk in plan:
        p = subprocess.Popen([sys.executable, "-m", "dispatch.testbed", "up"], env=_env(c, mk),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert p.stderr is not None
        keep: list[str] = []
        t = threading.Thread(target=_pump, args=(c.name, p.stderr, out, keep), daemon=True)
        t.start()
        procs.append((c, p, keep, t))
    failed = []
    for c, p, keep, t in procs:
        rc = p.wait()
        t.join()
        if rc != 0:
            failed.append(f"{c.name} (exit {rc}): {''.join(keep[-5:]).strip()}")
    if failed:
        raise RuntimeError("fleet start failed: " + "; ".join(failed))


def _bin(c: Cluster) -> Path:
    state = json.loads((c.runtime_dir / "state.json").read_text())
    return Path(state["bin"])


def kubectl(cluster: str, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60.0, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The stack's kubectl against one cluster of the fleet (``manager``, ``worker-1``, ``worker-2``), as its
    admin or as whoever ``kubeconfig`` holds the credentials of (a user of that cluster)."""
    c = fleet().cluster(cluster)
    try:
        bin_dir = _bin(c)
    except (OSError, ValueError, KeyError) as e:
        raise RuntimeError(f"{cluster} is not running (`python -m dispatch.testbed up --clusters`)") from e
    argv = [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or c.kubeconfig}", *args]
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{cluster}: kubectl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _apply(cluster: str, objs: list[Obj]) -> None:
    kubectl(cluster, "apply", "-f", "-", input=mf.dump_all(objs), timeout=120)


# --------------------------------------------------------------------------------------------- settings


def multikueue_block(worker_lost_timeout: str | None = None, gc_interval: str | None = None,
                     origin: str | None = None) -> Obj:
    """Kueue's ``multiKueue:`` Configuration block from the given settings (durations as Go durations)."""
    block: Obj = {}
    for key, val in (("workerLostTimeout", worker_lost_timeout), ("gcInterval", gc_interval)):
        if val is None:
            continue
        if not isinstance(val, str) or not _DURATION.fullmatch(val):
            raise ValueError(f"{key} must be a Go duration such as '30s' or '2m', not {val!r}")
        block[key] = val
    if origin is not None:
        if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", origin):
            raise ValueError(f"origin must be a valid label value, not {origin!r}")
        block["origin"] = origin
    return block


# --------------------------------------------------------------------------------------------- up/down


def up(*, worker_lost_timeout: str | None = None, gc_interval: str | None = None, origin: str | None = None,
       out: TextIO | None = None) -> Fleet:
    """Start the fleet (idempotent) and wire MultiKueue; returns where each cluster is.

    ``worker_lost_timeout``, ``gc_interval`` and ``origin`` set Kueue's ``multiKueue:`` block on the manager
    (unset: Kueue's defaults: 15m, 1m, ``multikueue``). A running manager with other settings gets its Kueue
    restarted with these (:func:`reconfigure`). Binaries come from the stack's build (built first if needed).
    """
    block = multikueue_block(worker_lost_timeout, gc_interval, origin)
    stream = out if out is not None else sys.stderr
    f = fleet()
    with _locked():
        t0 = time.monotonic()
        plan: list[tuple[Cluster, Obj | None]] = []
        for c in f.clusters:
            if not _cluster_up(c):
                plan.append((c, block if c.role == "manager" else None))
        if plan:
            _log(stream, f"starting {', '.join(c.name for c, _ in plan)}")
            # one build (a no-op when cached) before the children, so they never race to build the same stack
            _testbed(f.manager, "build", "--no-real-node", timeout=7200)
            _start_all(plan, stream)
        elif _manager_block(f.manager) != block:
            _reconfigure(f.manager, block)
        _wire(f)
        took = time.monotonic() - t0
        state: Obj = {"stack": _paths.stack(), "multikueue": block}
        if plan:
            state["start-seconds"] = round(took, 1)
            state["started"] = [c.name for c, _ in plan]
        _state_path().write_text(json.dumps(state))
        _log(stream, f"fleet up in {took:.1f}s; " + ", ".join(f"{c.name}: {c.kubeconfig}" for c in f.clusters))
    return f


def _log(out: TextIO, msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=out, flush=True)


def _cluster_up(c: Cluster) -> bool:
    if not (c.runtime_dir / "state.json").exists():
        return False
    try:
        rows = status_of(c.name)
    except RuntimeError:
        return False
    return all(r["healthy"] or r["frozen"] for r in rows)


def _manager_block(c: Cluster) -> Obj:
    try:
        raw = json.loads((c.runtime_dir / "state.json").read_text()).get("multikueue")
    except (OSError, ValueError):
        return {}
    return json.loads(raw) if raw else {}


def _wire(f: Fleet, timeout: float = 90.0) -> None:
    """MultiKueue's objects on the manager, the workers' queue; wait until MultiKueue says all is Active."""
    for w in f.workers:
        _apply(w.name, [mf.worker_queue()])
    kubeconfigs = {w.name: mf.embedded_kubeconfig(w.server, w.runtime_dir / "pki", w.name) for w in f.workers}
    deadline = time.monotonic() + 60
    while True:  # the manager's Kueue webhooks may still be warming up right after its start
        try:
            _apply(f.manager.name, mf.multikueue_fixtures(kubeconfigs))
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    for what in [*(f"multikueuecluster/{w.name}" for w in f.workers), "admissioncheck/multikueue",
                 f"clusterqueue/{MULTIKUEUE_QUEUE}"]:
        kubectl(f.manager.name, "wait", "--for=condition=Active", f"--timeout={int(timeout)}s", what,
                timeout=timeout + 10)


def down() -> None:
    """Stop every cluster of the fleet (the single testbed is not touched)."""
    f = fleet()
    with _locked():
        for c in reversed(f.clusters):
            if (c.runtime_dir / "state.json").exists() or (c.runtime_dir / "pids").is_dir():
                _testbed(c, "down")
        _state_path().unlink(missing_ok=True)


def status_of(cluster: str) -> list[dict[str, Any]]:
    """One cluster's components (name, pid, running, healthy, frozen)."""
    c = fleet().cluster(cluster)
    rows: list[dict[str, Any]] = json.loads(_testbed(c, "status", "--json", timeout=60, ok=(0, 1)).stdout)
    return rows


def status(verbose: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Every cluster's components; with ``verbose`` a table per cluster, and the fleet's memory."""
    out = {c.name: status_of(c.name) if (c.runtime_dir / "state.json").exists() else [] for c in fleet().clusters}
    if verbose:
        state = _read_state()
        for c in fleet().clusters:
            rows = out[c.name]
            print(f"{c.name}: {'not running' if not rows else c.server}  runtime dir: {c.runtime_dir}  "
                  f"kubeconfig: {c.kubeconfig}")
            for r in rows:
                st = "frozen" if r["frozen"] else ("healthy" if r["healthy"] else ("running" if r["running"] else
                                                                                     "stopped"))
                print(f"  {r['name']:26} pid {r['pid'] if r['pid'] is not None else '-':>8}  {st}")
        if any(out.values()):
            print(f"multiKueue: {json.dumps((state or {}).get('multikueue', {}))}  "
                  f"memory (RSS of all processes): {memory() / 2**20:.0f} MiB")
    return out


def is_up() -> bool:
    """True if every cluster runs and answers (a partitioned worker is not up)."""
    return all(_cluster_up(c) for c in fleet().clusters)


def is_present() -> bool:
    """True if any component of any cluster of the fleet runs (healthy or not): someone's fleet (a campaign's,
    with a worker powered off or partitioned), not to be taken down by a caller that did not start it."""
    for c in fleet().clusters:
        if not ((c.runtime_dir / "state.json").exists() or (c.runtime_dir / "pids").is_dir()):
            continue
        try:
            if any(r["running"] for r in status_of(c.name)):
                return True
        except RuntimeError:
            continue
    return False


def _read_state() -> Obj | None:
    try:
        data: Obj = json.loads(_state_path().read_text())
        return data
    except (OSError, ValueError):
        return None


def memory() -> int:
    """Bytes: the sum of the resident set sizes of every process of the fleet (from their pid files)."""
    total = 0
    for c in fleet().clusters:
        for pidfile in (c.runtime_dir / "pids").glob("*.pid"):
            try:
                pid = int(pidfile.read_text().split()[0])
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except (OSError, ValueError, IndexError):
                continue
    return total


# --------------------------------------------------------------------------------------------- faults


def _worker(name: str) -> Cluster:
    c = fleet().cluster(name)
    if c.role != "worker":
        raise ValueError(f"{name} is not a worker (workers: {', '.join(WORKERS)})")
    return c


def partition(worker: str) -> None:
    """Cut ``worker`` off: its API server stops, so the manager (and everyone) loses it; its controllers,
    kwok nodes and so its pods keep running, as behind a network partition. :func:`heal` undoes it."""
    _testbed(_worker(worker), "stop-component", "kube-apiserver")


def heal(worker: str) -> None:
    """Start the partitioned worker's API server again (same arguments, same data); waits until it answers."""
    _testbed(_worker(worker), "start-component", "kube-apiserver")


def detach(worker: str) -> None:
    """Take ``worker`` out of the manager's MultiKueueConfig (its MultiKueueCluster stays): MultiKueue then
    dispatches nothing there and reads none of its copies. Kueue v0.19.2, on reaching a worker again, takes the
    earliest admitted copy it sees for the admitted one and deletes the others, so a worker confirmed down that
    comes back with an old admitted copy would cost the current copy elsewhere; this is the operator's step before
    such a worker answers again, until its old copies are deleted. :func:`attach` undoes it."""
    _set_member(_worker(worker).name, False)


def attach(worker: str) -> None:
    """Put ``worker`` back in the manager's MultiKueueConfig (undoes :func:`detach`)."""
    _set_member(_worker(worker).name, True)


def with_member(clusters: list[str], worker: str, member: bool) -> list[str]:
    """``clusters`` with ``worker`` in it (appended if missing) or not, the others in their order; unchanged if
    it already is as asked, so a repeated call writes nothing MultiKueue would react to."""
    if member:
        return list(clusters) if worker in clusters else [*clusters, worker]
    return [c for c in clusters if c != worker]


def _set_member(worker: str, member: bool) -> None:
    cfg = json.loads(kubectl(MANAGER, "get", "multikueueconfig", MULTIKUEUE_CONFIG, "-o", "json").stdout)
    now = list(cfg.get("spec", {}).get("clusters") or [])
    clusters = with_member(now, worker, member)
    if clusters == now:
        return
    if not clusters:
        raise ValueError(f"taking {worker} out would leave MultiKueueConfig {MULTIKUEUE_CONFIG} with no worker")
    kubectl(MANAGER, "patch", "multikueueconfig", MULTIKUEUE_CONFIG, "--type=merge",
            "-p", json.dumps({"spec": {"clusters": clusters}}))


def freeze(worker: str, node: str) -> None:
    """Freeze one of ``worker``'s freezable KWOK nodes (node-2, node-3): its kubelet stops answering."""
    _testbed(_worker(worker), "freeze", node)


def thaw(worker: str, node: str) -> None:
    """Thaw a node :func:`freeze` froze."""
    _testbed(_worker(worker), "thaw", node)


def reconfigure(*, worker_lost_timeout: str | None = None, gc_interval: str | None = None,
                origin: str | None = None) -> None:
    """Restart the manager's Kueue with this ``multiKueue:`` block (unset settings: Kueue's defaults)."""
    block = multikueue_block(worker_lost_timeout, gc_interval, origin)
    with _locked():
        _reconfigure(fleet().manager, block)
        state = _read_state() or {}
        state["multikueue"] = block
        _state_path().write_text(json.dumps(state))


def _reconfigure(c: Cluster, block: Obj) -> None:
    _testbed(c, "reconfigure-kueue", "--multikueue", json.dumps(block))


# --------------------------------------------------------------------------------------------- queues


def namespace(name: str, local_queue: str = "lq", cluster_queue: str = MULTIKUEUE_QUEUE,
              labels: Mapping[str, str] | None = None) -> None:
    """Namespace ``name`` with LocalQueue ``local_queue`` on the manager (to ``cluster_queue``) and the same
    namespace and LocalQueue on every worker (to ``cq-fleet``): MultiKueue makes a Workload's remote copies
    in the namespace of the same name and its queue-name label must resolve there."""
    f = fleet()
    for c in f.clusters:
        cq = cluster_queue if c.role == "manager" else WORKER_QUEUE
        ns: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if labels:
            ns["metadata"]["labels"] = dict(labels)
        lq: Obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                   "metadata": {"name": local_queue, "namespace": name}, "spec": {"clusterQueue": cq}}
        _apply(c.name, [ns])
        _apply(c.name, [lq])


def delete_namespace(name: str) -> None:
    """Delete ``name`` in every cluster (without waiting)."""
    for c in fleet().clusters:
        kubectl(c.name, "delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)
