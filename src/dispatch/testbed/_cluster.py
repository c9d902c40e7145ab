"""Start, stop and inspect the local control plane.

Every component is a plain child process in its own session, with its pid recorded under the runtime
dir, so ``down`` (possibly from another process) stops exactly what ``up`` started and nothing else.
Only kubectl (the one built with the control plane) is used to talk to the API: this module is test
infrastructure and deliberately does not use the project's Kubernetes client.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TextIO

import yaml

from dispatch._api import Obj
from dispatch.testbed import _manifests as mf
from dispatch.testbed import _paths
from dispatch.testbed._pki import ensure_pki, install_kueue_metrics_cert
from dispatch.testbed._progress import BuildProgress, read_build_times

REGULAR_NODES = ["node-0", "node-1"]
FREEZABLE_NODES = ["node-2", "node-3"]
WARMUP_TIMEOUT = float(os.environ.get("DISPATCH_TESTBED_TIMEOUT", "120"))
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "jobset",
    "trainer",
    "kueue",
)
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # hard-coded in Kueue when cert management is off
ROLE_ENV = "DISPATCH_TESTBED_ROLE"
"""``manager`` starts a fleet's MultiKueue manager (no nodes, no scheduler, no JobSet controller); ``worker``
is a full testbed that says it belongs to a fleet; unset is the single testbed."""
MULTIKUEUE_ENV = "DISPATCH_TESTBED_MULTIKUEUE"
"""JSON of Kueue's ``multiKueue:`` block for a manager's start (``dispatch.testbed.fleet`` sets it)."""
ROLES = ("", "manager", "worker")
MANAGER_COMPONENTS = ("etcd", "kube-apiserver", "trainer", "kueue", "kube-controller-manager")


def trainer_honours_managed_by(version: str) -> bool:
    """Trainer leaves a TrainJob with ``spec.managedBy: kueue.x-k8s.io/multikueue`` alone from v2.3.0 on; an
    older one would build the manager's JobSet and write its status, racing MultiKueue's status copy."""
    parts = version.lstrip("v").split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (2, 3)
    except (IndexError, ValueError):
        return False


def _log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- build


def build(quiet: bool = False, out: TextIO | None = None) -> Path:
    """Build (or reuse) the selected stack's binaries; returns their directory.

    Cached per stack by versions, wrapper modules and Go version. Progress goes to ``out`` (default
    stderr) one line per component; the Go tool's output goes to a log file the first lines name, and its
    tail is shown if the build fails. ``DISPATCH_TESTBED_BUILD_SCRIPT`` names a stand-in build script
    (tests use one that only prints the events). The real node's kubelet and images are built too (cached
    apart, under keys of their own) unless ``$DISPATCH_TESTBED_REAL_NODE`` is 0.
    """
    return Path(_build(quiet, out)["bin"])


def _build(quiet: bool = False, out: TextIO | None = None) -> dict[str, str]:
    """What ``build`` builds: ``bin`` (the control plane's dir) and, when built, ``kubelet`` (the binary)
    and ``node-images`` (the dir of the pause and workload programs)."""
    stack = _paths.stack()
    script = Path(os.environ.get("DISPATCH_TESTBED_BUILD_SCRIPT") or _paths.source_dir() / "build.sh")
    stream: TextIO | None = None if quiet else (out if out is not None else sys.stderr)
    progress = BuildProgress(
        stream,
        stack,
        _paths.versions(stack),
        read_build_times(_paths.stack_dir(stack) / "build-times"),
        tty=stream is not None and out is None and stream.isatty(),
    )
    # The lock (one per cache key, so two stacks build side by side) is taken inside build.sh.
    rc, stdout = _run_build(["bash", str(script), "--stack", stack], progress)
    progress.finish(rc == 0)
    if rc != 0:
        where = f"; the Go tool's output is in {progress.log}" if progress.log else ""
        said = f": {progress.other[-1]}" if progress.other else ""
        raise RuntimeError(f"testbed build of stack {stack} failed (exit {rc}){said}{where}")
    lines = stdout.strip().splitlines()
    if not lines:
        raise RuntimeError("testbed build printed no output directory")
    outputs = {k: v for k, sep, v in (line.partition("=") for line in lines[:-1]) if sep and k in _NODE_OUTPUTS}
    outputs["bin"] = lines[-1]
    return outputs


_NODE_OUTPUTS = ("kubelet", "node-images")


def is_built() -> bool:
    """True if the selected stack's binaries are in the cache (so ``up`` starts in seconds)."""
    script = _paths.source_dir() / "build.sh"
    proc = subprocess.run(
        ["bash", str(script), "--stack", _paths.stack(), "--check"], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0


def build_estimate() -> float:
    """Seconds a cold build of the selected stack takes on 2 cores (its measured ``build-times``)."""
    return sum(read_build_times(_paths.stack_dir() / "build-times").values())


def _run_build(argv: list[str], progress: BuildProgress) -> tuple[int, str]:
    """Run the build, feeding its stderr lines to ``progress`` as they come (ticking once a second)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    out = bytearray()
    err = bytearray()
    open_ = 2
    while open_:
        events = sel.select(timeout=1.0)
        if not events:
            progress.tick()
        for key, _ in events:
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            if key.data == "out":
                out += chunk
                continue
            err += chunk
            while b"\n" in err:
                line, _, rest = err.partition(b"\n")
                err = bytearray(rest)
                progress.feed(line.decode(errors="replace"))
    if err:
        progress.feed(err.decode(errors="replace"))
    sel.close()
    proc.stdout.close()
    proc.stderr.close()
    return proc.wait(), out.decode(errors="replace")


def _bin_dir() -> Path:
    """The binaries recorded by the running testbed, or a fresh build."""
    state = _read_state()
    if state and Path(state["bin"]).is_dir():
        return Path(state["bin"])
    return build()


# --------------------------------------------------------------------------------------------- state


def _state_file() -> Path:
    return _paths.runtime_dir() / "state.json"


def _read_state() -> dict[str, str] | None:
    try:
        data: dict[str, str] = json.loads(_state_file().read_text())
        return data
    except (OSError, ValueError):
        return None


def _pid_dir() -> Path:
    return _paths.runtime_dir() / "pids"


def _read_pid(name: str) -> int | None:
    try:
        return int((_pid_dir() / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _proc_state(pid: int) -> str | None:
    """Kernel state letter of ``pid`` (R, S, T, Z, ...) or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _is_ours(name: str, pid: int) -> bool:
    """True if ``pid`` still runs the executable we recorded for ``name`` (guards against pid reuse)."""
    try:
        recorded = (_pid_dir() / f"{name}.pid").read_text().split(maxsplit=1)[1].strip()
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, IndexError):
        return False
    return exe.removesuffix(" (deleted)") == recorded


def _alive(name: str) -> int | None:
    pid = _read_pid(name)
    if pid is None:
        return None
    st = _proc_state(pid)
    if st is None or st in ("Z", "X") or not _is_ours(name, pid):
        return None
    return pid


def _role() -> str:
    """The running testbed's role (its state), else the one asked for (``$DISPATCH_TESTBED_ROLE``)."""
    state = _read_state()
    role = state.get("role", "") if state is not None else os.environ.get(ROLE_ENV, "").strip()
    if role not in ROLES:
        raise ValueError(f"unknown testbed role {role!r} (known: manager, worker, or unset)")
    return role


def _component_names() -> list[str]:
    if _role() == "manager":
        off = (_read_state() or {}).get("trainer") == "off"
        return [n for n in MANAGER_COMPONENTS if not (off and n == "trainer")]
    real = ["containerd", "kubelet"] if (_read_state() or {}).get("real-node") else []
    return [
        "etcd",
        "kube-apiserver",
        "jobset",
        "trainer",
        "kueue",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        *[f"kwok-{n}" for n in FREEZABLE_NODES],
        *real,
    ]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise up/down/freeze/thaw across processes sharing one runtime dir."""
    rt = _paths.runtime_dir()
    rt.mkdir(parents=True, exist_ok=True)
    with (rt / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- processes


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _start(name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Start ``argv`` detached (own session), logging to logs/<name>.log; record its pid."""
    rt = _paths.runtime_dir()
    (rt / "logs").mkdir(parents=True, exist_ok=True)
    _pid_dir().mkdir(parents=True, exist_ok=True)
    with (rt / "logs" / f"{name}.log").open("ab") as logf:
        p = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=rt,
        )
    (_pid_dir() / f"{name}.pid").write_text(f"{p.pid} {Path(argv[0]).resolve()}\n")
    # what start_component needs to start it again exactly so (a fleet's partition heals this way)
    (_pid_dir() / f"{name}.argv.json").write_text(json.dumps({"argv": list(argv), "env": env or {}}))
    _CHILDREN[p.pid] = p  # keep a reference: no "still running" warnings, and we can reap it
    return p.pid


def _stop(name: str, timeout: float = 10.0) -> None:
    pid = _alive(name)
    if pid is not None:
        for sig in (signal.SIGCONT, signal.SIGTERM):  # a frozen (SIGSTOPped) process must run to exit
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _proc_state(pid) not in (None, "Z", "X"):
            time.sleep(0.1)
        if _proc_state(pid) not in (None, "Z", "X"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1)  # reap our own child
    (_pid_dir() / f"{name}.pid").unlink(missing_ok=True)


def stop_component(name: str) -> None:
    """Stop one component of the running testbed (its API server, say: to every client, the cluster is
    gone, as behind a partition); ``start_component`` starts it again with the same arguments."""
    with _locked():
        if _read_state() is None:
            raise RuntimeError(f"no testbed runs in {_paths.runtime_dir()}")
        if name not in _component_names():
            raise ValueError(f"unknown component {name!r} (known: {', '.join(_component_names())})")
        _stop(name)


def start_component(name: str) -> None:
    """Start a component ``stop_component`` stopped, with the arguments it first had; waits until healthy.
    A running one is left alone."""
    with _locked():
        if _read_state() is None:
            raise RuntimeError(f"no testbed runs in {_paths.runtime_dir()}")
        if name not in _component_names():
            raise ValueError(f"unknown component {name!r} (known: {', '.join(_component_names())})")
        if _alive(name) is not None:
            return
        try:
            rec = json.loads((_pid_dir() / f"{name}.argv.json").read_text())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"{name} has no recorded command line to start it again with") from e
        _start(name, rec["argv"], rec["env"])
        _wait([name], 90)
    if name == "kubelet":  # a Node registered again has no address (``_node.ensure_address``)
        _real().ensure_address()


# --------------------------------------------------------------------------------------------- health


def _ssl_ctx(verify: bool) -> ssl.SSLContext:
    pki = _paths.runtime_dir() / "pki"
    if verify:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _get(url: str, verify: bool = True, timeout: float = 2.0) -> bool:
    try:
        ctx = _ssl_ctx(verify) if url.startswith("https") else None
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError, ValueError):
        return False


HEALTH: dict[str, Callable[[], bool]] = {
    "etcd": lambda: _get(f"http://127.0.0.1:{mf.PORTS['etcd']}/health"),
    "kube-apiserver": lambda: _get(f"https://127.0.0.1:{mf.PORTS['apiserver']}/readyz"),
    "kube-controller-manager": lambda: _get(
        f"https://127.0.0.1:{mf.PORTS['controller-manager']}/healthz", verify=False
    ),
    "kube-scheduler": lambda: _get(f"https://127.0.0.1:{mf.PORTS['scheduler']}/healthz", verify=False),
    "kwok": lambda: _get(f"http://127.0.0.1:{mf.PORTS['kwok']}/healthz"),
    "jobset": lambda: _get(f"http://127.0.0.1:{mf.PORTS['jobset-probe']}/readyz"),
    "trainer": lambda: _get(f"http://127.0.0.1:{mf.PORTS['trainer-probe']}/readyz"),
    "kueue": lambda: _get(f"http://127.0.0.1:{mf.PORTS['kueue-probe']}/readyz"),
    "containerd": lambda: _real()._socket_answers(_real().socket_path()),
    "kubelet": lambda: _real().kubelet_healthy(),
}


def _real() -> ModuleType:
    """The real node's module (imported late: it builds on this one)."""
    from dispatch.testbed import _node

    return _node


def _healthy(name: str) -> bool:
    if _alive(name) is None:
        return False
    check = HEALTH.get(name)
    return True if check is None else check()


def _wait(names: Sequence[str], timeout: float = WARMUP_TIMEOUT) -> None:
    t0 = time.monotonic()
    deadline = t0 + timeout
    pending = list(names)
    while pending:
        for n in list(pending):
            if _alive(n) is None:
                raise RuntimeError(f"{n} exited during start-up; see {_paths.runtime_dir()}/logs/{n}.log")
            if _healthy(n):
                pending.remove(n)
                _log(f"{n:<24} healthy after {time.monotonic() - t0:.1f}s")
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {', '.join(pending)} (logs in {_paths.runtime_dir()}/logs)")
        if pending:
            time.sleep(0.25)


# --------------------------------------------------------------------------------------------- kubectl


def kubectl_argv(*args: str) -> list[str]:
    """The command line of the testbed's own kubectl with ``args``, for a caller that streams its output (a
    ``--watch``) instead of waiting for it to end."""
    return [str(_bin_dir() / "kubectl"), f"--kubeconfig={_paths.kubeconfig_path()}", *args]


def kubectl(
    *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the testbed's own kubectl against the testbed (never the system one).

    A request the server never received (its TLS handshake timed out or the dial was refused, as a busy
    2-core machine does now and then) is sent again, twice at most: it cannot have been applied, so even a
    write is safe to repeat, and a test does not fail on the machine's load."""
    argv = kubectl_argv(*args)
    for attempt in range(3):
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode == 0 or not _never_sent(proc.stderr) or attempt == 2:
            break
        time.sleep(2.0 * (attempt + 1))
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


_NEVER_SENT = ("net/http: TLS handshake timeout", "connect: connection refused")


def _never_sent(stderr: str) -> bool:
    """kubectl could not reach the server at all: the request was never sent."""
    return "Unable to connect to the server" in stderr and any(m in stderr for m in _NEVER_SENT)


def _apply(objs: list[Obj], server_side: bool = False) -> None:
    if not objs:
        return
    args = ["apply", "-f", "-"]
    if server_side:
        args += ["--server-side", "--force-conflicts", "--field-manager=dispatch-testbed"]
    kubectl(*args, input=mf.dump_all(objs), timeout=120)


# --------------------------------------------------------------------------------------------- config files


def _write_kubeconfig(rt: Path) -> None:
    pki = rt / "pki"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dispatch-testbed",
                "cluster": {
                    "server": f"https://127.0.0.1:{mf.PORTS['apiserver']}",
                    "certificate-authority": str(pki / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(pki / "admin.crt"),
                    "client-key": str(pki / "admin.key"),
                },
            }
        ],
        "contexts": [{"name": "dispatch-testbed", "context": {"cluster": "dispatch-testbed", "user": "admin"}}],
        "current-context": "dispatch-testbed",
    }
    path = _paths.kubeconfig_path()
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)


def _install_cert(pki: Path, d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki / "admin.crt", d / "tls.crt")
    shutil.copyfile(pki / "admin.key", d / "tls.key")
    (d / "tls.key").chmod(0o600)


# --------------------------------------------------------------------------------------------- up/down


@dataclass(frozen=True)
class ComponentStatus:
    """One component's state as ``status`` reports it."""

    name: str
    pid: int | None
    running: bool
    healthy: bool
    frozen: bool


def status(verbose: bool = False) -> list[ComponentStatus]:
    """State of every component; with ``verbose`` also print a table."""
    out: list[ComponentStatus] = []
    for n in _component_names():
        pid = _alive(n)
        frozen = pid is not None and _proc_state(pid) == "T"
        healthy = pid is not None and not frozen and _healthy(n)
        out.append(ComponentStatus(n, pid, pid is not None, healthy, frozen))
    if verbose:
        stack = (_read_state() or {}).get("stack", "-")
        print(f"stack: {stack}  runtime dir: {_paths.runtime_dir()}  kubeconfig: {_paths.kubeconfig_path()}")
        for s in out:
            state = "frozen" if s.frozen else ("healthy" if s.healthy else ("running" if s.running else "stopped"))
            print(f"  {s.name:26} pid {s.pid if s.pid is not None else '-':>8}  {state}")
        if _read_state() is not None:
            for line in _real().describe():
                print(line)
    return out


def is_up() -> bool:
    """True if every component runs and answers its health check (frozen kwoks count as up)."""
    return all(s.healthy or s.frozen for s in status())


def up() -> Path:
    """Bring the testbed up (idempotent: a healthy testbed returns at once). Returns the kubeconfig path.

    Safe to call from several processes at once: they serialise on a lock and later ones find it up.
    """
    stack = _paths.stack()
    with _locked():
        if is_up():
            running = (_read_state() or {}).get("stack")
            if running and running != stack:
                raise RuntimeError(
                    f"the testbed in {_paths.runtime_dir()} runs stack {running}, not {stack}: take it down first "
                    "(`dispatch testbed down`) or use another DISPATCH_TESTBED_DIR and DISPATCH_TESTBED_PORT_OFFSET"
                )
            return _paths.kubeconfig_path()
        if any(s.running for s in status()):
            # Someone may be operating it: a campaign stops the API server, kubelet or containerd, or powers its
            # node off, for seconds or minutes at a time, and restarting the whole testbed killed such a run
            # (twice). A partly running testbed is waited for, and otherwise left to whoever runs it.
            if _healthy_within(PARTIAL_GRACE_SECONDS):
                return _paths.kubeconfig_path()
            raise RuntimeError(partial_text(status()))
        _check_ports_free()
        try:
            return _up()
        except BaseException:
            _log(f"start-up failed; stopping what was started (logs kept in {_paths.runtime_dir()}/logs)")
            _down()
            raise


PARTIAL_GRACE_SECONDS = 90.0
"""How long ``up`` waits for a partly running testbed to answer again before restarting it: longer than any
component restart or outage the campaign's faults make."""


def _healthy_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if is_up():
            return True
        time.sleep(1.0)
    return is_up()


def partial_text(components: Sequence[ComponentStatus]) -> str:
    """Why ``up`` stops at a testbed that runs in part, and what to do."""
    stopped = [c.name for c in components if not c.running]
    sick = [c.name for c in components if c.running and not (c.healthy or c.frozen)]
    what = "; ".join(filter(None, [f"not running: {', '.join(stopped)}" if stopped else "",
                                   f"not answering: {', '.join(sick)}" if sick else ""]))
    return (f"the testbed in {_paths.runtime_dir()} runs in part and was not healthy within "
            f"{PARTIAL_GRACE_SECONDS:g} s ({what}): someone may be using it (a campaign stops components on "
            "purpose), so it is left as it is; `python -m dispatch.testbed start-component NAME` starts a stopped "
            "one, `python -m dispatch.testbed down` and `up` start it afresh")


def is_present() -> bool:
    """True if any component of the testbed runs (healthy or not): someone's testbed, not to be taken down by a
    caller that did not start it."""
    return any(s.running for s in status())


def _check_ports_free() -> None:
    """Fail early and clearly if something else (e.g. another testbed) holds one of our ports."""
    busy = []
    for name, port in mf.PORTS.items():
        if name in mf.REAL_NODE_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                busy.append(f"{name}={port}")
    if busy:
        raise RuntimeError(
            f"ports in use: {', '.join(busy)}; another testbed may be running "
            "(use its DISPATCH_TESTBED_DIR, or set DISPATCH_TESTBED_PORT_OFFSET)"
        )


def _up() -> Path:
    t0 = time.monotonic()
    outputs = _build()
    bin_dir = Path(outputs["bin"])
    rt = _paths.runtime_dir()
    rt.mkdir(parents=True, exist_ok=True)
    pki = rt / "pki"
    ensure_pki(pki)
    _write_kubeconfig(rt)
    role = os.environ.get(ROLE_ENV, "").strip()
    if role not in ROLES:
        raise ValueError(f"unknown testbed role {role!r} (${ROLE_ENV}: manager, worker, or unset)")
    manager = role == "manager"
    multikueue = _multikueue_from_env() if manager else None
    state = {"bin": str(bin_dir), "stack": _paths.stack(),
             **{k: v for k, v in outputs.items() if k in _NODE_OUTPUTS}}
    if role:
        state["role"] = role
    if multikueue is not None:
        state["multikueue"] = json.dumps(multikueue)
    # a manager runs Trainer (its webhook checks runtimes) only where Trainer honours managedBy; else the
    # manager has Trainer's CRDs and runtimes only, as Kueue's docs ask for Trainer v2.2
    run_trainer = not manager or trainer_honours_managed_by(_paths.versions()["TRAINER_VERSION"])
    if not run_trainer:
        state["trainer"] = "off"
    _state_file().write_text(json.dumps(state))
    _log(f"starting stack {_paths.stack()} in {rt} (usually under a minute)")
    kubeconfig = str(_paths.kubeconfig_path())
    mods = _paths.modules()
    bundle = mf.ca_bundle(pki)

    # Serving certs where each controller looks for them (cert management is off everywhere).
    certdir = rt / "webhook-certs"
    _install_cert(pki, certdir)
    trainer_tmp = rt / "trainer-tmp"  # trainer has no certDir setting: it uses $TMPDIR/k8s-webhook-server/...
    _install_cert(pki, trainer_tmp / "k8s-webhook-server" / "serving-certs")
    try:
        install_kueue_metrics_cert(KUEUE_METRICS_CERT_DIR)
    except PermissionError as e:
        raise RuntimeError(f"Kueue needs {KUEUE_METRICS_CERT_DIR} (hard-coded); run as root or create it") from e

    cfgdir = rt / "config"
    cfgdir.mkdir(exist_ok=True)
    for name, obj in mf.controller_configs(certdir, multikueue).items():
        (cfgdir / f"{name}.yaml").write_text(yaml.safe_dump(obj, sort_keys=False))
    (cfgdir / "kwok-stages.yaml").write_text(mf.dump_all(mf.kwok_stages(mods.kwok)))

    b = {n: str(bin_dir / n) for n in BINARIES}
    p = mf.PORTS
    etcd_data = _paths.etcd_data_dir()
    shutil.rmtree(etcd_data, ignore_errors=True)
    _start(
        "etcd",
        [
            b["etcd"],
            "--name=testbed",
            f"--data-dir={etcd_data}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=testbed=http://127.0.0.1:{p['etcd-peer']}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=5m",
            "--log-level=warn",
        ],
    )
    _wait(["etcd"], 30)
    _start(
        "kube-apiserver",
        [
            b["kube-apiserver"],
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={pki / 'admin.crt'}",
            f"--tls-private-key-file={pki / 'admin.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer=https://127.0.0.1:{p['apiserver']}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--default-not-ready-toleration-seconds=5",
            "--default-unreachable-toleration-seconds=5",
            "--profiling=false",
            "--endpoint-reconciler-type=none",  # 127.0.0.1 is not a valid Endpoints address
            "--v=1",
        ],
    )
    _wait(["kube-apiserver"], 90)

    _apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for ns in ("jobset-system", "kubeflow-system", "kueue-system")
        ]
    )
    crds = mf.crds(mods.jobset, mods.trainer, mods.kueue, bundle)
    _apply(crds, server_side=True)
    kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        *[f"crd/{c['metadata']['name']}" for c in crds],
    )
    _log(f"{len(crds)} CRDs established")

    ctl_env = {"KUBECONFIG": kubeconfig}
    if not manager:  # a manager's TrainJobs are MultiKueue's: no JobSet is ever made there
        _start("jobset", [b["jobset"], f"--config={cfgdir / 'jobset.yaml'}", f"--kubeconfig={kubeconfig}"],
               ctl_env)
    if run_trainer:
        _start(
            "trainer",
            [b["trainer"], f"--config={cfgdir / 'trainer.yaml'}", f"--kubeconfig={kubeconfig}"],
            {**ctl_env, "TMPDIR": str(trainer_tmp)},
        )
    _start("kueue", [b["kueue"], f"--config={cfgdir / 'kueue.yaml'}", f"--kubeconfig={kubeconfig}"], ctl_env)
    _start(
        "kube-controller-manager",
        [
            b["kube-controller-manager"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['controller-manager']}",
            "--controllers=*",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=false",
            "--node-monitor-period=1s",
            "--node-monitor-grace-period=10s",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--v=1",
        ],
    )
    if manager:
        return _up_manager(t0, state, mods, bundle, cfgdir)
    _start(
        "kube-scheduler",
        [
            b["kube-scheduler"],
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['scheduler']}",
            "--v=1",
        ],
    )
    kwok_common = [
        f"--kubeconfig={kubeconfig}",
        f"--config={cfgdir / 'kwok-stages.yaml'}",
        "--node-lease-duration-seconds=8",
        "--cidr=10.244.0.0/16",
    ]
    kwok_env = {**ctl_env, "HOME": str(rt)}  # keep kwok away from a user's ~/.kwok/kwok.yaml
    _start(
        "kwok",
        [
            b["kwok"],
            *kwok_common,
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{p['kwok']}",
        ],
        kwok_env,
    )
    for n in FREEZABLE_NODES:
        _start(f"kwok-{n}", [b["kwok"], *kwok_common, f"--manage-single-node={n}"], kwok_env)

    _wait(["jobset", "trainer", "kueue"])
    _register_webhooks(
        cfgdir,
        mf.jobset_webhooks(mods.jobset, bundle)
        + mf.trainer_webhooks(mods.trainer, bundle)
        + mf.kueue_webhooks(mods.kueue, bundle),
    )
    _wait(["kube-controller-manager", "kube-scheduler", "kwok"])

    _apply_runtimes(mods.trainer)
    _apply(mf.nodes(REGULAR_NODES, FREEZABLE_NODES))
    _apply_retry(mf.kueue_fixtures())
    _wait_nodes_ready()
    # cq-dispatch stays inactive until something (the project's admission-check controller) marks the
    # AdmissionCheck `dispatch` Active, exactly as on a real cluster; only the plain queue is awaited.
    kubectl("wait", "--for=condition=Active", "--timeout=60s", "clusterqueue/cq")
    state.update(_start_real_node(outputs))
    _state_file().write_text(json.dumps(state))
    _log(f"testbed up in {time.monotonic() - t0:.1f}s; KUBECONFIG={kubeconfig}")
    return _paths.kubeconfig_path()


def _register_webhooks(cfgdir: Path, webhooks: list[Obj]) -> None:
    """Register the controllers' webhook configurations, kept in ``cfgdir`` too for whoever debugs them."""
    (cfgdir / "webhooks.yaml").write_text(mf.dump_all(webhooks))
    _apply(webhooks)
    _log(f"{len(webhooks)} webhook configurations registered")


def _apply_runtimes(trainer: Path) -> None:
    """Trainer's public ConfigMap (its version, as the upstream manager overlay makes it) and default runtimes."""
    _apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kubeflow-trainer-public", "namespace": "kubeflow-system"},
                "data": {"kubeflow_trainer_version": _paths.versions()["TRAINER_VERSION"].lstrip("v")},
            }
        ]
    )
    _apply_retry(mf.training_runtimes(trainer), server_side=True)


def _multikueue_from_env() -> Obj:
    """Kueue's ``multiKueue:`` block for a manager (``$DISPATCH_TESTBED_MULTIKUEUE``; empty: Kueue's defaults)."""
    raw = os.environ.get(MULTIKUEUE_ENV, "").strip()
    if not raw:
        return {}
    try:
        block = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"${MULTIKUEUE_ENV} is not JSON: {e}") from e
    if not isinstance(block, dict):
        raise ValueError(f"${MULTIKUEUE_ENV} must be a JSON object (Kueue's multiKueue block), not {raw!r}")
    return block


def _up_manager(t0: float, state: dict[str, str], mods: _paths.Modules, bundle: str, cfgdir: Path) -> Path:
    """The rest of a fleet manager's start: Trainer's and Kueue's webhooks, the runtimes (Trainer's webhook
    refuses a TrainJob whose runtime is missing), Kueue's queues. No nodes: nothing runs here."""
    run_trainer = state.get("trainer") != "off"
    _wait(["trainer", "kueue"] if run_trainer else ["kueue"])
    trainer_webhooks = mf.trainer_webhooks(mods.trainer, bundle) if run_trainer else []
    _register_webhooks(cfgdir, trainer_webhooks + mf.kueue_webhooks(mods.kueue, bundle))
    _wait(["kube-controller-manager"])
    _apply_runtimes(mods.trainer)
    _apply_retry(mf.kueue_fixtures())
    kubectl("wait", "--for=condition=Active", "--timeout=60s", "clusterqueue/cq")
    _state_file().write_text(json.dumps(state))
    _log(f"manager up in {time.monotonic() - t0:.1f}s; KUBECONFIG={_paths.kubeconfig_path()}")
    return _paths.kubeconfig_path()


def _start_real_node(outputs: Mapping[str, str]) -> dict[str, str]:
    """Start the real node where the host allows (``$DISPATCH_TESTBED_REAL_NODE``: auto, 0, 1); returns what
    the state records: the node, or why there is none (read by ``status`` and by the tests, which fail on it
    in CI and skip on it elsewhere)."""
    node = _real()
    mode = node.mode()
    if mode == "off":
        return {"real-node-problem": f"turned off (${node.MODE_ENV}=0)"}
    why = node.unsupported(outputs.get("kubelet"), outputs.get("node-images"))
    if why is None:
        try:
            return dict(node.start(outputs["kubelet"], outputs["node-images"]))
        except Exception as e:
            if mode == "required":
                raise
            why = f"it failed to start: {e}"
    if mode == "required":
        raise RuntimeError(f"the real node cannot start (${node.MODE_ENV}=1): {why}")
    _log(f"real node: not started: {why}")
    return {"real-node-problem": why}


def _apply_retry(objs: list[Obj], server_side: bool = False, timeout: float = 60.0) -> None:
    """Apply, retrying while a just-registered webhook is not serving yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _apply(objs, server_side=server_side)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def _wait_nodes_ready(timeout: float = 60.0) -> None:
    """Wait until every node is Ready and schedulable (KCM removed the not-ready taint)."""
    deadline = time.monotonic() + timeout
    while True:
        data = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
        ok = 0
        for n in data["items"]:
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
            )
            tainted = any(t["key"].startswith("node.kubernetes.io/") for t in n.get("spec", {}).get("taints", []) or [])
            ok += ready and not tainted
        if ok == len(REGULAR_NODES) + len(FREEZABLE_NODES):
            _log("all nodes Ready")
            return
        if time.monotonic() > deadline:
            raise RuntimeError("nodes did not become Ready and untainted in time")
        time.sleep(0.5)


def down() -> None:
    """Stop the testbed: webhook configurations first (so nothing is left pointing at dead servers)."""
    with _locked():
        _down()


def _down() -> None:
    if _alive("kube-apiserver") is not None and _paths.kubeconfig_path().exists():
        kubectl(
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            "--all",
            "--ignore-not-found",
            "--wait=false",
            check=False,
            timeout=20,
        )
    if _role() != "manager":
        _real().stop()  # before the control plane: its pods are deleted through the apiserver first
    for n in reversed(_component_names()):
        _stop(n)
    for rec in _pid_dir().glob("*.argv.json"):  # start_component has nothing to restart once all is down
        rec.unlink(missing_ok=True)
    shutil.rmtree(_paths.etcd_data_dir(), ignore_errors=True)
    _state_file().unlink(missing_ok=True)


def _kwok_for(node: str) -> str:
    """The process that is ``node``'s kubelet: its kwok, or the real node's kubelet."""
    real = real_node()
    if real is not None and node == real:
        return "kubelet"
    if node not in FREEZABLE_NODES:
        also = f", {real}" if real else ""
        raise ValueError(f"{node} is not freezable (freezable: {', '.join(FREEZABLE_NODES)}{also})")
    return f"kwok-{node}"


def _signal_kubelet(node: str, sig: signal.Signals) -> None:
    name = _kwok_for(node)
    pid = _alive(name)
    if pid is None:
        raise RuntimeError(f"{name} is not running")
    os.kill(pid, sig)


def freeze(node: str) -> None:
    """Stop the node's kubelet (SIGSTOP of its kwok, or of the real node's kubelet): no more lease renewals,
    so the node really goes Ready=Unknown; a real node's containers keep running."""
    _signal_kubelet(node, signal.SIGSTOP)


def thaw(node: str) -> None:
    """Resume the node's kubelet (SIGCONT): it renews its lease and finalizes what piled up."""
    _signal_kubelet(node, signal.SIGCONT)


def _real_only(node: str) -> None:
    real = (_read_state() or {}).get("real-node")  # powered off, its kubelet is not alive: still the real node
    if not real or node != real:
        raise ValueError(f"{node} is not the real node: only a real machine can lose power "
                         f"(the real node: {real or 'none runs'}); freeze/thaw a KWOK node instead")


def power_off(node: str) -> None:
    """The real node loses power: its kubelet dies with its memory and every container with it, the API is
    told nothing. Unlike freeze, what comes back (:func:`power_on`) is a fresh kubelet."""
    _real_only(node)
    _real().power_off()


def power_on(node: str) -> None:
    """The real node boots: a fresh kubelet that knows only what the API holds; waits until it is Ready."""
    _real_only(node)
    _real().power_on()


def restart_kubelet(node: str) -> None:
    """The real node's kubelet restarts, its containers running on (a kubelet whose Node was deleted registers
    it again); waits until the node is Ready."""
    _real_only(node)
    _real().restart_kubelet()


def reconfigure_kueue(changes: Mapping[str, object] | None = None) -> None:
    """Restart Kueue with ``changes`` over the testbed's own Configuration (none: the testbed's as is), for a
    scenario that needs another Kueue setting (``manageJobsWithoutQueueName``, say); waits until it is ready
    again. Its webhooks stay registered and answer again once it is back."""
    with _locked():
        if _alive("kube-apiserver") is None:
            raise RuntimeError("the testbed is not running (`dispatch testbed up`)")
        rt = _paths.runtime_dir()
        mk = (_read_state() or {}).get("multikueue")
        cfg = mf.controller_configs(rt / "webhook-certs", json.loads(mk) if mk is not None else None)["kueue"]
        cfg.update(dict(changes or {}))
        path = rt / "config" / "kueue.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        state = _read_state()
        if state is not None and "multiKueue" in (changes or {}):  # a manager's new block is its own from now on
            state["multikueue"] = json.dumps(cfg["multiKueue"])
            _state_file().write_text(json.dumps(state))
        kubeconfig = str(_paths.kubeconfig_path())
        _stop("kueue")
        _start("kueue", [str(_bin_dir() / "kueue"), f"--config={path}", f"--kubeconfig={kubeconfig}"],
               {"KUBECONFIG": kubeconfig})
        _wait(["kueue"])
        _log("kueue restarted" + (f" with {', '.join(sorted(changes))}" if changes else ""))


def freezable_nodes() -> list[str]:
    """KWOK nodes that ``freeze``/``thaw`` accept (they also accept the real node, see ``real_node``)."""
    return list(FREEZABLE_NODES)


def real_node() -> str | None:
    """The real node's name (a real kubelet, containerd and runc) while it runs, else None."""
    name = (_read_state() or {}).get("real-node")
    return name if name and _alive("kubelet") is not None else None


def stop_real_node(*, delete_pods: bool = True) -> None:
    """Stop the real node and undo its changes to the host; the control plane and KWOK nodes stay.

    ``delete_pods=False`` is a node that loses power: its processes die and nothing is written to the API
    (the Node goes Ready=Unknown after KCM's grace, its pods stay as they were). ``start_real_node`` brings
    it back (its kubelet then finds the pods still bound to it, as a rebooted node does).
    """
    with _locked():
        state = _read_state()
        if state is None:
            raise RuntimeError("the testbed is not running (`dispatch testbed up`)")
        _real().stop(delete_pods=delete_pods)
        name = state.pop("real-node", None)
        for k in ("real-node-version", "real-node-ready-seconds"):
            state.pop(k, None)
        state["real-node-problem"] = f"{name or 'it'} was stopped (stop_real_node)"
        _state_file().write_text(json.dumps(state))


def start_real_node() -> str:
    """Start the real node again after ``stop_real_node`` (or start it where ``up`` did not); returns its name."""
    with _locked():
        state = _read_state()
        if state is None or _alive("kube-apiserver") is None:
            raise RuntimeError("the testbed is not running (`dispatch testbed up`)")
        if state.get("real-node") and _alive("kubelet") is not None:
            return state["real-node"]
        why = _real().unsupported(state.get("kubelet"), state.get("node-images"))
        if why is not None:
            raise RuntimeError(f"the real node cannot start: {why}")
        state.pop("real-node-problem", None)
        state.update(_real().start(state["kubelet"], state["node-images"]))
        _state_file().write_text(json.dumps(state))
        return state["real-node"]


def real_node_problem() -> str | None:
    """Why the running testbed has no real node (None when it has one, or when no testbed ran)."""
    state = _read_state()
    if state is None:
        return "the testbed is not running"
    if state.get("real-node"):
        return None if _alive("kubelet") is not None else "its kubelet is not running"
    why = state.get("real-node-problem") or "it was not started"
    # The problem was read when the testbed came up; a host fixed since (containerd installed, say) keeps
    # that answer until the testbed starts again, so say how to start it again when the host now allows it.
    if "stop_real_node" not in why and _real().unsupported(state.get("kubelet"), state.get("node-images")) is None:
        why += (" when the testbed started; this host can run it now: `dispatch testbed down`, then "
                "`dispatch testbed up`")
    return why


def regular_nodes() -> list[str]:
    """Nodes served by the shared kwok process."""
    return list(REGULAR_NODES)


def env() -> dict[str, str]:
    """Environment for subprocesses that should talk to the testbed (KUBECONFIG, PATH with kubectl)."""
    bin_dir = _bin_dir()
    return {
        **os.environ,
        "KUBECONFIG": str(_paths.kubeconfig_path()),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
