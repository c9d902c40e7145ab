"""The testbed's real node: the stack's own kubelet, a private containerd, runc and a CNI bridge.

KWOK nodes only say what a kubelet would write; this node runs real processes, so a test can watch what
a process did (the workload's oracle file) and not only what pod objects said. It joins the control plane
after ``up`` has started everything else, with a NoSchedule taint and a label of its own so only pods that
ask for it land there, and the KWOK nodes stay (KCM needs another Ready node, or a frozen real node puts it
in master disruption mode, where it evicts nothing).

A kubelet changes the host beyond the runtime dir: mounts, cgroups in every hierarchy, three sysctls, a
bridge and a few fixed paths. ``start`` records the host's state first (``node/host.json``) and ``stop``
undoes each change in the order that works (pods, kubelet, containerd, mounts, cgroups, sysctls, bridge,
paths), also for a start that failed half-way, and also from another process than the one that started it.
One real node per machine: the cgroup tree and the fixed paths are shared.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from dispatch.testbed import _cluster as cl
from dispatch.testbed import _manifests as mf
from dispatch.testbed import _oci, _paths

NODE = "node-real"
LABEL = "dispatch.test/real-node"
"""Label (value ``"true"``) and NoSchedule taint key of the real node: pods that want it select and tolerate it."""
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
PAUSE_IMAGE = "localhost/dispatch-testbed/pause:1"
WORKLOAD_IMAGE = "localhost/dispatch-testbed/workload:1"
WORKLOAD_PATH = "/workload"
WORKLOAD_ALIASES = ("/bin/sh", "/bin/bash", "/usr/bin/env", "/usr/bin/python3", "/usr/local/bin/python",
                    "/usr/local/bin/python3", "/usr/local/bin/torchrun")
"""Where the workload image also installs the program, so a runtime's own command (``torchrun ...``,
``python train.py``, ``sh -c ...``) still starts it."""
BRIDGE = "dispatchtb0"
SUBNET = "10.250.77.0/24"
MODE_ENV = "DISPATCH_TESTBED_REAL_NODE"
READY_TIMEOUT = 90.0
KUBELET_ARGV = "kubelet.argv.json"  # the command line power_off read, for power_on
# The kubelet sets these when protectKernelDefaults is off; their values before it started are restored.
SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Paths the kubelet, containerd and the CNI plugins use whatever their configured roots say.
FIXED_PATHS = ("/var/lib/kubelet/device-plugins", "/var/log/containers", "/var/log/pods", "/var/lib/cni/results",
               "/run/containerd/fifo", "/run/containerd/s", "/run/containerd/runc", "/run/netns")
NETNS_PREFIX = "/run/netns/cni-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


# --------------------------------------------------------------------------------------------- mode and host


def mode() -> str:
    """``auto`` (the default: start it where the host allows), ``off``, or ``required`` (``up`` fails
    without it), from ``$DISPATCH_TESTBED_REAL_NODE``."""
    v = os.environ.get(MODE_ENV, "auto").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    if v in ("1", "on", "true", "yes", "required"):
        return "required"
    return "auto"


def _which(name: str) -> str | None:
    return shutil.which(name, path=_SBIN_PATH)


def cni_dir() -> Path | None:
    """Where the CNI plugins are (Debian: /usr/lib/cni), or None."""
    for d in CNI_DIRS:
        if all((d / p).is_file() for p in ("bridge", "host-local", "loopback")):
            return d
    return None


def _cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def _hierarchies() -> list[Path]:
    """Every cgroup hierarchy the kubelet creates ``kubepods`` in (v1: each mounted one; v2: the root)."""
    if _cgroup_v2():
        return [CGROUP_ROOT]
    try:
        return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def kubepods_dirs() -> list[Path]:
    """The kubelet's cgroup tree roots present on the host."""
    return [h / "kubepods" for h in _hierarchies() if (h / "kubepods").is_dir()]


def unsupported(kubelet: str | None, images: str | None = None) -> str | None:
    """Why this host cannot run the real node, or None. ``kubelet`` is the built binary and ``images`` the
    dir of the built pause and workload programs (None: not built)."""
    if not sys.platform.startswith("linux"):
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (the kubelet and containerd manage cgroups, mounts and network namespaces)"
    missing = [b for b in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip") if _which(b) is None]
    if cni_dir() is None:
        missing.append("the CNI plugins (bridge, host-local, loopback in /usr/lib/cni or /opt/cni/bin)")
    if missing:
        return ("missing " + ", ".join(missing)
                + " (apt-get install containerd runc containernetworking-plugins iproute2)")
    if not kubelet or not Path(kubelet).is_file():
        return "the stack's kubelet is not built (`dispatch testbed build`)"
    if not images or not all((Path(images) / p).is_file() for p in ("pause", "workload")):
        return "the real node's pause and workload programs are not built (`dispatch testbed build`)"
    probe = CGROUP_ROOT if _cgroup_v2() else CGROUP_ROOT / "memory"
    if not probe.is_dir() or not os.access(probe, os.W_OK):
        return f"the cgroup filesystem ({probe}) is missing or read-only"
    busy = [f"{mf.PORTS[n]}" for n in mf.REAL_NODE_PORTS if not _port_free(mf.PORTS[n])]
    if busy:
        return f"port {', '.join(busy)} on 127.0.0.1 is in use (another kubelet?)"
    held = kubepods_dirs()
    if held and not (_node_dir() / "host.json").exists():
        return (f"{held[0]} exists: another kubelet runs on this machine, or one that crashed left its cgroups "
                "(one real node per machine; remove them with "
                "`find /sys/fs/cgroup -depth -type d -path '*/kubepods*' -exec rmdir {} \\;`)")
    return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------------- paths


def _node_dir() -> Path:
    return _paths.runtime_dir() / "node"


def socket_path() -> Path:
    """The private containerd's socket (for ``ctr -a``)."""
    return _node_dir() / "containerd.sock"


class _Under:
    """One of the node's directories (or files): its path under the node's base, named once."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, dirs: _Dirs, owner: type[_Dirs]) -> Path:
        return dirs.base.joinpath(*self.parts)


@dataclass(frozen=True)
class _Dirs:
    """Where the real node keeps its state: every path under ``base``."""

    base: Path

    containerd_root = _Under("containerd-root")
    containerd_state = _Under("containerd-state")
    cni_conf = _Under("cni", "net.d")
    cni_ipam = _Under("cni", "ipam")
    kubelet_root = _Under("kubelet")
    pod_logs = _Under("pod-logs")
    images = _Under("images")
    config = _Under("config")
    manifests = _Under("manifests")
    """The kubelet's ``staticPodPath``: empty unless a test writes a static pod's manifest there."""
    host = _Under("host.json")


def _dirs() -> _Dirs:
    return _Dirs(_node_dir())


# --------------------------------------------------------------------------------------------- host record


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _created_root(path: str) -> str | None:
    """The highest missing ancestor-or-self of ``path``: what removing undoes its creation (None: exists)."""
    p = Path(path)
    if p.exists():
        return None
    top = p
    while not top.parent.exists():
        top = top.parent
    return str(top)


def _record_host(d: _Dirs) -> None:
    """Write down what the node may change, before it changes anything (kept until ``stop`` undid it)."""
    roots = sorted({r for r in (_created_root(p) for p in FIXED_PATHS) if r})
    record = {
        "sysctls": {k: v for k in SYSCTLS if (v := _read_sysctl(k)) is not None},
        "created": roots,
        "bridge": BRIDGE,
        "bridge_existed": Path("/sys/class/net", BRIDGE).exists(),
    }
    d.host.write_text(json.dumps(record, indent=1))


# --------------------------------------------------------------------------------------------- configs


def _containerd_config(d: _Dirs, cni: Path) -> str:
    """A containerd 1.6 config (version 2) that touches nothing of a system containerd: its own root,
    state, socket and plugin dirs; the CRI plugin with our sandbox image and CNI config; runc via the v2
    shim with cgroupfs; no negative OOM scores (the kubelet's pods may not lower theirs)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d.containerd_root}"
state = "{d.containerd_state}"
oom_score = 0

[grpc]
  address = "{socket_path()}"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d.base / 'opt'}"
  [{cri}]
    sandbox_image = "{PAUSE_IMAGE}"
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    [{cri}.containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [{cri}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{cri}.containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "{d.containerd_state / 'runc'}"
    [{cri}.cni]
      bin_dir = "{cni}"
      conf_dir = "{d.cni_conf}"
      max_conf_num = 1
"""


def _cni_config(d: _Dirs) -> str:
    """A bridge nobody routes to: pods get addresses in their own namespaces, but no gateway, no
    masquerade and no iptables rules touch the host's network."""
    return json.dumps({
        "cniVersion": "0.4.0",
        "name": "dispatch-testbed",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": str(d.cni_ipam)}},
            {"type": "loopback"},
        ],
    }, indent=1)


def _kubelet_config(d: _Dirs) -> dict[str, object]:
    p = mf.PORTS
    resolv = "/etc/resolv.conf" if Path("/etc/resolv.conf").exists() else ""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # Debian's hosts here are cgroup v1; the kubelet refuses v1 by default
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{socket_path()}",
        "imageServiceEndpoint": f"unix://{socket_path()}",
        "address": "127.0.0.1",
        "port": p["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": p["kubelet-healthz"],
        # A loopback-only test node: the apiserver reaches logs/exec without kubelet client certificates.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "nodeStatusUpdateFrequency": "4s",
        # Renewed every 2 s: KCM's grace is 10 s, and the default 40 s lease (renewed every 10 s) would flap.
        "nodeLeaseDurationSeconds": 8,
        "oomScoreAdj": 0,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "clusterDomain": "cluster.local",
        "resolvConf": resolv,
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "maxPods": 20,
        "podLogsDir": str(d.pod_logs),
        # Static pods (issue 34): only files a test writes here, and it is empty otherwise; a directory the
        # kubelet watches changes nothing until a manifest appears.
        "staticPodPath": str(d.manifests),
        "volumePluginDir": str(d.base / "volume-plugins"),
        "registerWithTaints": [TAINT],
        # Nothing may evict or garbage-collect the imported images just because the build disk is full.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    }


# --------------------------------------------------------------------------------------------- images


def _arch() -> str:
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def _pack_images(d: _Dirs, images_dir: Path) -> list[Path]:
    d.images.mkdir(parents=True, exist_ok=True)
    pause = d.images / "pause.tar"
    workload = d.images / "workload.tar"
    _oci.archive(pause, PAUSE_IMAGE, ["/pause"], {"/pause": images_dir / "pause"}, arch=_arch())
    _oci.archive(workload, WORKLOAD_IMAGE, [WORKLOAD_PATH], {WORKLOAD_PATH: images_dir / "workload"},
                 links=dict.fromkeys(WORKLOAD_ALIASES, WORKLOAD_PATH), arch=_arch())
    return [pause, workload]


def ctr(*args: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ctr`` against the private containerd, in the CRI's namespace."""
    exe = _which("ctr") or "ctr"
    proc = subprocess.run([exe, "-a", str(socket_path()), "-n", "k8s.io", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


# --------------------------------------------------------------------------------------------- health


def _socket_answers(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(str(path))
        return True
    except OSError:
        return False


def containerd_healthy() -> bool:
    return _socket_answers(socket_path())


def kubelet_healthy() -> bool:
    try:
        url = f"http://127.0.0.1:{mf.PORTS['kubelet-healthz']}/healthz"
        with urllib.request.urlopen(url, timeout=2.0) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _node_obj() -> dict[str, object] | None:
    proc = cl.kubectl("get", "node", NODE, "-o", "json", check=False, timeout=15)
    if proc.returncode != 0:
        return None
    obj: dict[str, object] = json.loads(proc.stdout)
    return obj


def condition(node: dict[str, object]) -> str:
    """The node's Ready condition status (True, False, Unknown; "" if it has none yet)."""
    status = node.get("status")
    conds = status.get("conditions", []) if isinstance(status, dict) else []
    for c in conds or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return str(c.get("status", ""))
    return ""


def _schedulable(node: dict[str, object]) -> bool:
    spec = node.get("spec")
    taints = spec.get("taints", []) if isinstance(spec, dict) else []
    return not any(isinstance(t, dict) and str(t.get("key", "")).startswith("node.kubernetes.io/")
                   for t in taints or [])


# --------------------------------------------------------------------------------------------- start


def start(kubelet: str, images_dir: str) -> dict[str, str]:
    """Start containerd and the kubelet and wait until the node is Ready; returns what ``state.json``
    records about it. Stops what it started (and undoes its host changes) if it fails."""
    d = _dirs()
    if d.host.exists():  # a previous node was never stopped: undo it first, its record is the true "before"
        stop()
    t0 = time.monotonic()
    for sub in (d.base, d.containerd_root, d.containerd_state, d.cni_conf, d.cni_ipam, d.kubelet_root,
                d.pod_logs, d.config, d.manifests):
        sub.mkdir(parents=True, exist_ok=True)
    _record_host(d)
    try:
        return _start(d, Path(kubelet), Path(images_dir), t0)
    except BaseException:
        cl._log("real node: start-up failed; undoing what it changed")
        stop()
        raise


def _start(d: _Dirs, kubelet: Path, images_dir: Path, t0: float) -> dict[str, str]:
    cni = cni_dir()
    assert cni is not None
    (d.config / "containerd.toml").write_text(_containerd_config(d, cni))
    (d.cni_conf / "10-dispatch-testbed.conflist").write_text(_cni_config(d))
    containerd = _which("containerd") or "containerd"
    # The shim and runc are found through PATH, which may lack the sbin directories under sudo or CI.
    env = {"PATH": _SBIN_PATH}
    cl._start("containerd", [containerd, "--config", str(d.config / "containerd.toml")], env)
    _wait_for("containerd", containerd_healthy, 30)
    ctr("version")
    t_containerd = time.monotonic() - t0
    for tar in _pack_images(d, images_dir):
        ctr("images", "import", str(tar), timeout=60)  # unpacked into overlayfs, as the CRI wants it
    (d.config / "kubelet.yaml").write_text(yaml.safe_dump(_kubelet_config(d), sort_keys=False))
    t1 = time.monotonic()
    argv = [
        str(kubelet),
        f"--config={d.config / 'kubelet.yaml'}",
        f"--kubeconfig={_paths.kubeconfig_path()}",
        f"--root-dir={d.kubelet_root}",
        f"--cert-dir={d.kubelet_root / 'pki'}",
        f"--hostname-override={NODE}",
        "--node-ip=127.0.0.1",
        f"--node-labels={LABEL}=true",
        "--v=2",
    ]
    cl._start("kubelet", argv, env)
    _wait_for("kubelet", kubelet_healthy, 60)
    _wait_for("the real node's registration", lambda: _node_obj() is not None, 60)
    ensure_address()

    def ready() -> bool:
        node = _node_obj()
        return node is not None and condition(node) == "True" and _schedulable(node)

    _wait_for("the real node to be Ready", ready, READY_TIMEOUT)
    node = _node_obj() or {}
    status = node.get("status")
    info = status.get("nodeInfo", {}) if isinstance(status, dict) else {}
    version = str(info.get("kubeletVersion", "")) if isinstance(info, dict) else ""
    total = time.monotonic() - t0
    cl._log(f"real node {NODE} Ready in {total:.1f}s (kubelet {version}; containerd {t_containerd:.1f}s, "
            f"kubelet start to Ready {time.monotonic() - t1:.1f}s)")
    return {"real-node": NODE, "real-node-version": version, "real-node-ready-seconds": f"{total:.1f}"}


def power_off() -> None:
    """The machine loses power: its kubelet dies (frozen or not, with all it had in memory) and every container
    with it; the API is told nothing. containerd stays up only to answer the testbed: its tasks are dead.

    Killing the containers under a live (or frozen) kubelet is not a power-off: a real kubelet that resumes
    still holds the pod it ran and restarts the container it finds dead before it hears that the pod was
    force-deleted meanwhile. That is the split brain the out-of-service taint's contract (the node is really
    shut down) rules out, and the real node showed it."""
    pid = cl._alive("kubelet")
    if pid is not None:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        (_dirs().config / KUBELET_ARGV).write_text(json.dumps([a.decode() for a in argv]))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # a SIGSTOPped process dies of SIGKILL too
        child = cl._CHILDREN.pop(pid, None)
        if child is not None:
            child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and cl._proc_state(pid) not in (None, "Z", "X"):
            time.sleep(0.1)
    _kill_tasks()


def ensure_address(timeout: float = 60.0) -> None:
    """Give the real node's Node its address once it is registered, if it has none.

    The kubelet refuses a loopback node IP and then registers no address at all; logs and exec through the
    apiserver need one, and the kubelet's address setter fails before touching addresses, so a patched one
    stays. A Node registered again (deleted under a live kubelet, then the kubelet restarted; a machine
    powered on after its Node went) is a new object without it, so every start of the kubelet calls this."""
    _wait_for("the real node's registration", lambda: _node_obj() is not None, timeout)
    status = (_node_obj() or {}).get("status")
    if isinstance(status, dict) and status.get("addresses"):
        return
    cl.kubectl("patch", "node", NODE, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}))


def power_on() -> None:
    """The machine boots again: a fresh kubelet, knowing only what the API says, so a pod deleted while the
    machine was off is never started again. Waits until the node is Ready."""
    if cl._alive("kubelet") is not None:
        raise RuntimeError(f"{NODE}'s kubelet is running: the node is not powered off")
    d = _dirs()
    try:
        argv = json.loads((d.config / KUBELET_ARGV).read_text())
    except (OSError, ValueError) as e:
        raise RuntimeError(f"{NODE} was not powered off by this testbed (no kubelet command line: {e})") from e
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise RuntimeError(f"{NODE}'s recorded kubelet command line is not a list of strings")
    cl._start("kubelet", argv, {"PATH": _SBIN_PATH})
    _wait_for("kubelet", kubelet_healthy, 60)
    ensure_address(READY_TIMEOUT)

    def ready() -> bool:
        node = _node_obj()
        return node is not None and condition(node) == "True"

    _wait_for(f"{NODE} to be Ready again", ready, READY_TIMEOUT)


def restart_kubelet() -> None:
    """Its kubelet restarts (thawed if it was frozen) while the machine and its containers run on: what an
    operator does so that a kubelet whose Node was deleted registers it again. Waits until the node is Ready."""
    pid = cl._alive("kubelet")
    if pid is None:
        raise RuntimeError(f"{NODE}'s kubelet is not running: power it on instead")
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # the kubelet's own group: containers are containerd's children
    child = cl._CHILDREN.pop(pid, None)
    if child is not None:
        child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cl._proc_state(pid) not in (None, "Z", "X"):
        time.sleep(0.1)
    cl._start("kubelet", argv, {"PATH": _SBIN_PATH})
    _wait_for("kubelet", kubelet_healthy, 60)
    ensure_address(READY_TIMEOUT)

    def ready() -> bool:
        node = _node_obj()
        return node is not None and condition(node) == "True"

    _wait_for(f"{NODE} to be registered and Ready again", ready, READY_TIMEOUT)


def static_pod_dir() -> Path:
    """The directory the real node's kubelet reads static pod manifests from. A node started before the
    testbed set ``staticPodPath`` gets it now: its kubelet configuration is rewritten and the kubelet
    restarted (its containers run on), once."""
    d = _dirs()
    path = d.config / "kubelet.yaml"
    config = yaml.safe_load(path.read_text())
    d.manifests.mkdir(parents=True, exist_ok=True)
    if config.get("staticPodPath") != str(d.manifests):
        config["staticPodPath"] = str(d.manifests)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        restart_kubelet()
    return d.manifests


def _wait_for(what: str, cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for name in ("containerd", "kubelet"):
            pid_file = cl._pid_dir() / f"{name}.pid"
            if pid_file.exists() and cl._alive(name) is None:
                raise RuntimeError(f"{name} exited while waiting for {what}; see "
                                   f"{_paths.runtime_dir()}/logs/{name}.log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} "
                               f"(logs in {_paths.runtime_dir()}/logs)")
        time.sleep(0.25)


# --------------------------------------------------------------------------------------------- stop


def _tasks() -> list[tuple[str, str]]:
    """(task id, status) of every container task the private containerd still has."""
    if not containerd_healthy():
        return []
    proc = ctr("tasks", "ls", check=False, timeout=15)
    out = []
    for line in proc.stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3:
            out.append((parts[0], parts[2]))
    return out


def _sandboxes() -> set[str]:
    """Ids of the sandbox (pause) containers: the kubelet stops them after the pod's own containers."""
    proc = ctr("containers", "ls", check=False, timeout=15)
    return {parts[0] for line in proc.stdout.splitlines()[1:] if len(parts := line.split()) >= 2
            and parts[1] == PAUSE_IMAGE}


def _delete_pods() -> None:
    """Delete the node's pods and wait until the kubelet stopped their containers (a finalizer may keep a
    pod object; its processes still end), sandboxes aside: those are killed right after. Nothing here may
    block ``down`` for long."""
    if cl._alive("kube-apiserver") is None or cl._alive("kubelet") is None:
        return
    pid = cl._alive("kubelet")
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a frozen kubelet stops nothing
    cl.kubectl("delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={NODE}", "--grace-period=2",
               "--wait=false", "--ignore-not-found", check=False, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sandboxes = _sandboxes()
        if not any(status in ("RUNNING", "PAUSED", "PAUSING") and task not in sandboxes
                   for task, status in _tasks()):
            return
        time.sleep(0.25)
    cl._log("real node: containers still running 30s after their pods were deleted; killing them")


def _kill_tasks() -> None:
    for task, status in _tasks():
        if status in ("RUNNING", "PAUSED", "PAUSING"):
            ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(s == "RUNNING" for _, s in _tasks()):
        time.sleep(0.2)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for root in kubepods_dirs():
        for dirpath, _, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split())
    return pids


def _our_shims() -> list[int]:
    """Pids of containerd shims serving the private containerd (they outlive it by design)."""
    sock = str(socket_path())
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in argv:
            out.append(int(p.name))
    return out


def _kill_all(pids: set[int] | list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(cl._proc_state(pid) not in (None, "Z", "X") for pid in pids):
        time.sleep(0.1)


def _mounts() -> list[str]:
    """Mount points of the node (under its dir, the fixed paths it made, and the CNI's netns), deepest first."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    base = str(_node_dir())
    roots = [base, *FIXED_PATHS]
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        mp = fields[4].encode().decode("unicode_escape")  # \040 and friends
        if mp.startswith(NETNS_PREFIX) or any(mp == r or mp.startswith(r + "/") for r in roots):
            out.append(mp)
    return sorted(set(out), key=lambda m: (-m.count("/"), m))


def _unmount_all() -> list[str]:
    """Unmount everything of the node; returns what would not go."""
    umount = _which("umount") or "umount"
    for _ in range(5):
        left = _mounts()
        if not left:
            return []
        for mp in left:
            if subprocess.run([umount, mp], capture_output=True, check=False).returncode != 0:
                subprocess.run([umount, "-l", mp], capture_output=True, check=False)
    return _mounts()


def _remove_cgroups() -> list[str]:
    failed = []
    for root in kubepods_dirs():
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError as e:
                failed.append(f"{dirpath}: {e.strerror}")
    return failed


def _restore_sysctls(record: dict[str, object]) -> None:
    sysctls = record.get("sysctls")
    if not isinstance(sysctls, dict):
        return
    for name, value in sysctls.items():
        if _read_sysctl(str(name)) != value:
            try:
                Path("/proc/sys", str(name)).write_text(f"{value}\n")
            except OSError as e:
                cl._log(f"real node: could not restore {name.replace('/', '.')}={value}: {e}")


def _remove_tree(path: Path) -> bool:
    """Remove ``path`` unless something is still mounted under it (removing through a mount would delete
    what is mounted, such as a test's hostPath directory)."""
    if not path.exists():
        return True
    mounts = [m for m in _mounts() if m == str(path) or m.startswith(f"{path}/")]
    if mounts:
        cl._log(f"real node: left {path} in place: {mounts[0]} is still mounted")
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def stop(delete_pods: bool = True) -> None:
    """Stop the node and undo what it changed on the host (recipe order); safe to call when nothing runs.

    ``delete_pods`` first deletes the node's pods through the apiserver and waits until the kubelet stopped
    their containers (a clean stop). Without it the node dies as a machine that loses power: the kubelet
    and containerd are stopped and every container killed, and the API is told nothing.
    """
    d = _dirs()
    try:
        record: dict[str, object] = json.loads(d.host.read_text())
    except (OSError, ValueError):
        record = {}
    if not record:
        # No record: this runtime dir started no node (or one already undone). Stop only what its pid files
        # name: the machine's cgroups, mounts and bridge may belong to another testbed's real node.
        if cl._alive("kubelet") is not None or cl._alive("containerd") is not None:
            if delete_pods:
                _delete_pods()
            cl._stop("kubelet")
            cl._stop("containerd")
        return
    if delete_pods:
        _delete_pods()
    cl._stop("kubelet")
    _kill_tasks()
    cl._stop("containerd")
    # Whatever still runs in the kubelet's cgroups (a container whose shim lost its containerd) and the
    # shims themselves: only processes of this node, found by cgroup and by our socket.
    _kill_all(_cgroup_pids())
    _kill_all(_our_shims())
    stuck = _unmount_all()
    cgroups = _remove_cgroups()
    _restore_sysctls(record)
    bridge = str(record.get("bridge") or BRIDGE)
    if not record.get("bridge_existed") and Path("/sys/class/net", bridge).exists():
        subprocess.run([_which("ip") or "ip", "link", "del", bridge], capture_output=True, check=False)
    created = record.get("created")
    for path in created if isinstance(created, list) else []:
        _remove_tree(Path(str(path)))
    problems = [f"still mounted: {', '.join(stuck)}"] if stuck else []
    if cgroups:
        problems.append(f"cgroups not removed: {', '.join(cgroups)}")
    if problems:
        cl._log("real node: " + "; ".join(problems) + f" (host record kept in {d.host})")
        return
    for sub in (d.containerd_root, d.containerd_state, d.kubelet_root, d.base / "cni", d.base / "opt",
                d.base / "volume-plugins", d.pod_logs, d.images, d.manifests):
        _remove_tree(sub)
    for sock in (socket_path(), socket_path().with_name(socket_path().name + ".ttrpc")):
        sock.unlink(missing_ok=True)
    d.host.unlink(missing_ok=True)  # last: a stop that failed half-way can be retried from the record


# --------------------------------------------------------------------------------------------- inspect


def describe() -> Iterator[str]:
    """Lines for ``dispatch testbed status`` about the real node."""
    state = cl._read_state() or {}
    name = state.get("real-node")
    if not name:
        why = cl.real_node_problem() if state else None
        yield f"real node: none ({why})" if why else "real node: none"
        return
    node = _node_obj() if cl._alive("kube-apiserver") is not None else None
    ready = condition(node) if node else "?"
    yield (f"real node: {name} (kubelet {state.get('real-node-version', '?')}, Ready={ready or '?'}, "
           f"label {LABEL}=true, NoSchedule taint; images {WORKLOAD_IMAGE}, {PAUSE_IMAGE})")
