"""The controller's image run against the testbed the way a cluster runs it.

A pod of the Deployment gets its ServiceAccount's token (a TokenRequest), the cluster's CA and its
namespace at ``/var/run/secrets/kubernetes.io/serviceaccount``, and ``KUBERNETES_SERVICE_HOST/PORT``;
it runs as a non-root user with a read-only root filesystem and no capabilities. Here the container
gets exactly that (through podman, on the host's network, where the testbed's API server listens), so
it can do only what the shipped roles allow. The image is built by ``scripts/build-image``.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from dispatch.testbed import _manifests as mf
from dispatch.testbed import _paths

SA_NAMESPACE = "dispatch-system"
SA_NAME = "dispatch-controller"
IN_CLUSTER_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_HOST = "127.0.0.1"
"""The address the container reaches the API server at (host network): must be in its certificate."""
# runc: crun refuses this kind of machine's hybrid cgroup layout; limits below the hard limits, which the
# runtime cannot raise without CAP_SYS_RESOURCE.
PODMAN = ("podman", "--runtime", "runc")
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def repo_dir() -> Path:
    """The repository checkout the testbed's sources come from (deploy/, scripts/)."""
    return _paths.source_dir().parent


def default_image() -> str:
    """``localhost/dispatch-controller:<version>``, the tag ``scripts/build-image`` gives."""
    from dispatch import __version__

    return f"localhost/dispatch-controller:{__version__}"


def podman_missing() -> str | None:
    """Why the image cannot be built or run here, or None when it can."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y podman runc debootstrap)"
    return None


def image_exists(image: str) -> bool:
    return subprocess.run([*PODMAN, "image", "exists", image], check=False).returncode == 0


def build_image(image: str | None = None) -> str:
    """Build with ``scripts/build-image`` (the base is made once and cached); returns the reference."""
    argv = [str(repo_dir() / "scripts" / "build-image")]
    if image:
        argv += ["--tag", image]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def api_port() -> int:
    return mf.PORTS["apiserver"]


def certificate_covers(host: str = API_HOST, port: int | None = None, server_name: str | None = None) -> bool:
    """Whether the API server's certificate, reached at ``host``, verifies against the cluster CA for
    ``server_name`` (default ``host`` itself: an IP must be among its IP SANs, a name among its DNS SANs)."""
    ctx = ssl.create_default_context(cafile=str(_paths.runtime_dir() / "pki" / "ca.crt"))
    try:
        with socket.create_connection((host, port or api_port()), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=server_name or host):
            return True
    except ssl.SSLCertVerificationError:
        return False


def _kubectl(*args: str, input: str | None = None) -> str:
    from dispatch.testbed import kubectl

    return kubectl(*args, input=input, timeout=180).stdout


def token(namespace: str = SA_NAMESPACE, name: str = SA_NAME, seconds: int = 24 * 3600,
          bound_secret: str | None = None) -> str:
    """A ServiceAccount token from the TokenRequest API (what the kubelet projects into a pod).

    ``bound_secret`` binds it to a Secret of that name in ``namespace``: deleting the Secret revokes the
    token at once, as deleting a pod revokes its pod-bound token.
    """
    spec: dict[str, object] = {"expirationSeconds": seconds}
    if bound_secret is not None:
        uid = _kubectl("get", "secret", bound_secret, "-n", namespace, "-o", "jsonpath={.metadata.uid}").strip()
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Secret", "name": bound_secret, "uid": uid}
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    out = _kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                   "-f", "-", input=json.dumps(request))
    return str(json.loads(out)["status"]["token"])


def apply_deploy() -> str:
    """``kubectl apply --server-side -k deploy/``: the shipped namespace, ServiceAccount, roles, Deployment
    and AdmissionCheck, as a person installs them (the Deployment's pods only pretend to run on KWOK).

    kubectl's own field manager, as the install page's local install does: the admission policy's ``matchConstraints``
    is an atomic struct the API server fills with defaults, so an apply by a second manager after
    the page's would conflict on it."""
    out = _kubectl("apply", "--server-side", "-k", str(repo_dir() / "deploy"))
    # The guard's webhook points at the Deployment's Service, whose pods only pretend to run on KWOK: with
    # failurePolicy Fail it would deny every start of every dispatch TrainJob on the testbed. The guard is
    # installed by its own scenarios (tests/controller/test_guard_testbed.py), pointed at a real process.
    # Enrolment's mutating webhook likewise: it would refuse every TrainJob create in an enrolled namespace.
    _kubectl("delete", "validatingwebhookconfiguration", "dispatch-guard", "--ignore-not-found")
    _kubectl("delete", "mutatingwebhookconfiguration", "dispatch-guard", "--ignore-not-found")
    return out


def _deployment_pod() -> dict[str, Any]:
    docs = yaml.safe_load_all((repo_dir() / "deploy" / "base" / "deployment.yaml").read_text())
    for doc in docs:
        if doc and doc.get("kind") == "Deployment":
            return dict(doc["spec"]["template"]["spec"])
    raise RuntimeError("deploy/base/deployment.yaml has no Deployment")


def deployment_args() -> list[str]:
    """The controller's arguments in the shipped Deployment (so the container runs as the pod would)."""
    return [str(a) for a in _deployment_pod()["containers"][0].get("args") or []]


def empty_dir_mounts() -> list[str]:
    """Where the shipped Deployment mounts an emptyDir (the guard's certificates): a tmpfs in the container,
    writable by its user, is the same thing on a read-only root."""
    pod = _deployment_pod()
    empty = {v["name"] for v in pod.get("volumes") or [] if "emptyDir" in v}
    return [str(m["mountPath"]) for m in pod["containers"][0].get("volumeMounts") or [] if m["name"] in empty]


@dataclass
class Container:
    """One controller container; ``stop`` ends it (SIGTERM, as the kubelet does) and removes it."""

    name: str
    proc: subprocess.Popen[bytes]
    secrets: Path
    log: IO[bytes] | None = field(default=None, repr=False)

    def stop(self, timeout: float = 20.0) -> int | None:
        subprocess.run([*PODMAN, "stop", "--time", str(int(timeout)), self.name], check=False,
                       capture_output=True)
        try:
            code = self.proc.wait(timeout + 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        subprocess.run([*PODMAN, "rm", "--force", "--ignore", self.name], check=False, capture_output=True)
        _forget(self.name)
        if self.log is not None:
            self.log.close()
        return code

    def logs(self) -> str:
        got = subprocess.run([*PODMAN, "logs", self.name], check=False, capture_output=True, text=True)
        return got.stdout + got.stderr


def secrets_dir(name: str) -> Path:
    return _paths.runtime_dir() / "containers" / name


def podman_argv(args: list[str] | None, *, image: str | None, name: str, namespace: str = SA_NAMESPACE,
                service_account: str = SA_NAME, detach: bool = False) -> list[str]:
    """Write the in-cluster files for container ``name`` and return the ``podman run`` command line."""
    image = image or default_image()
    secrets = secrets_dir(name) / "serviceaccount"
    secrets.mkdir(parents=True, exist_ok=True)
    anchor = f"{name}-token"       # the token is bound to it; a leftover of an earlier run is replaced
    _kubectl("delete", "secret", anchor, "-n", namespace, "--ignore-not-found")
    _kubectl("create", "secret", "generic", anchor, "-n", namespace)
    (secrets / "token").write_text(token(namespace, service_account, bound_secret=anchor))
    shutil.copyfile(_paths.runtime_dir() / "pki" / "ca.crt", secrets / "ca.crt")
    (secrets / "namespace").write_text(namespace)
    for f in secrets.iterdir():      # what a projected volume gives: readable by the pod's user
        f.chmod(0o644)
    for d in (secrets, secrets.parent):
        d.chmod(0o755)
    return [
        *PODMAN, "run", "--rm", *(["--detach"] if detach else []), "--name", name, "--network", "host", *LIMITS,
        "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--user", "65532:65532",
        *[arg for path in empty_dir_mounts() for arg in ("--tmpfs", f"{path}:rw,mode=1777,size=16m")],
        "--volume", f"{secrets}:{IN_CLUSTER_DIR}:ro",
        "--env", f"KUBERNETES_SERVICE_HOST={API_HOST}", "--env", f"KUBERNETES_SERVICE_PORT={api_port()}",
        "--env", f"POD_NAME={name}", "--env", f"POD_NAMESPACE={namespace}",
        image, *(_host_network_args(deployment_args()) if args is None else args),
    ]


def _host_network_args(args: list[str]) -> list[str]:
    """The Deployment's arguments without the guard's: on the testbed the containers share the host network,
    so two replicas would both bind the guard's port. The guard is exercised by its own testbed scenarios
    (tests/controller/test_guard_testbed.py) and, served from the image, by tests/controller/test_container.py."""
    return [a for a in args if not a.startswith(("--guard-port", "--guard-cert-dir"))]


def run(args: list[str] | None = None, *, image: str | None = None, name: str | None = None,
        namespace: str = SA_NAMESPACE, service_account: str = SA_NAME, log: Path | None = None) -> Container:
    """Start the controller image as a pod of the Deployment would run: in-cluster credentials only.

    ``args`` default to the shipped Deployment's. The container's stderr (its JSON log) goes to ``log``
    when given, else stays readable with :meth:`Container.logs` while it runs.
    """
    name = name or f"dispatch-controller-{uuid.uuid4().hex[:6]}"
    argv = podman_argv(args, image=image, name=name, namespace=namespace, service_account=service_account)
    sink = open(log, "wb") if log is not None else None  # noqa: SIM115  (closed by Container.stop)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sink if sink is not None else subprocess.DEVNULL)
    return Container(name=name, proc=proc, secrets=secrets_dir(name), log=sink)


def wait_ready(port: int, timeout: float = 60.0, container: Container | None = None) -> str:
    """Poll ``/readyz`` on the host's ``port`` until it answers 200; returns its body."""
    import urllib.error
    import urllib.request

    end = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < end:
        if container is not None and container.proc.poll() is not None:
            raise RuntimeError(f"the controller container exited ({container.proc.returncode}): {last}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            last = f"{exc.code} {exc.read().decode(errors='replace').strip()}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise TimeoutError(f"/readyz on port {port} did not answer 200 within {timeout:.0f}s (last: {last})")


def _forget(name: str, namespace: str = SA_NAMESPACE) -> None:
    """Remove a container's in-cluster files and revoke its tokens (the Secrets they are bound to)."""
    shutil.rmtree(secrets_dir(name), ignore_errors=True)
    from dispatch.testbed import kubectl

    kubectl("delete", "secret", "-n", namespace, "--ignore-not-found", "-l", f"dispatch.test/container={name}",
            check=False)
    kubectl("delete", "secret", "-n", namespace, "--ignore-not-found", f"{name}-token", check=False)


def rotate_token(name: str, namespace: str = SA_NAMESPACE, service_account: str = SA_NAME) -> str:
    """Give container ``name`` a new token (swapped in atomically, as the kubelet does) and revoke the one
    it has: its next request with the old one gets 401, so it must re-read the file. Returns the old token."""
    path = secrets_dir(name) / "serviceaccount" / "token"
    old = path.read_text()
    anchor = f"{name}-token-{uuid.uuid4().hex[:6]}"
    _kubectl("create", "secret", "generic", anchor, "-n", namespace)
    _kubectl("label", "secret", anchor, "-n", namespace, f"dispatch.test/container={name}")
    tmp = path.with_name(".token.new")
    tmp.write_text(token(namespace, service_account, bound_secret=anchor))
    tmp.chmod(0o644)
    tmp.replace(path)
    previous = _kubectl("get", "secret", "-n", namespace, f"{name}-token", "--ignore-not-found", "-o", "name")
    if previous.strip():
        _kubectl("delete", "secret", "-n", namespace, f"{name}-token")
    return old


def stop(name: str, timeout: float = 20.0) -> None:
    """Stop a container started with ``--detach`` (SIGTERM first) and remove its in-cluster files."""
    subprocess.run([*PODMAN, "stop", "--time", str(int(timeout)), name], check=False, capture_output=True)
    subprocess.run([*PODMAN, "rm", "--force", "--ignore", name], check=False, capture_output=True)
    _forget(name)
