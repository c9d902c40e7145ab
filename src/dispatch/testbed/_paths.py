"""Where the testbed keeps things: sources in the repo, binaries in a user cache, state in /tmp.

Binaries live outside the repo (they are large and machine-specific); runtime state lives in a
throw-away directory so a crashed run never leaves anything in the work tree.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def source_dir() -> Path:
    """The repo's ``testbed/`` directory (wrapper Go modules, versions, build script)."""
    env = os.environ.get("DISPATCH_TESTBED_SRC")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "testbed"


def runtime_dir() -> Path:
    """Runtime state: PKI, kubeconfig, configs, logs, pid files."""
    return Path(os.environ.get("DISPATCH_TESTBED_DIR", "/tmp/dispatch-testbed"))


def etcd_data_dir() -> Path:
    """etcd data on tmpfs when available: fsync-free and fast on a 2-core machine."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / f"{runtime_dir().name}-etcd"
    return runtime_dir() / "etcd-data"


def kubeconfig_path() -> Path:
    """Admin kubeconfig of the running testbed (system:masters)."""
    return runtime_dir() / "kubeconfig"


def versions() -> dict[str, str]:
    """Component versions pinned in ``testbed/versions.env``."""
    out: dict[str, str] = {}
    for line in (source_dir() / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class Modules:
    """Module-cache directories of the upstream modules whose YAML the testbed reads."""

    kwok: Path
    jobset: Path
    trainer: Path
    kueue: Path


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go toolchain is needed to build and locate the testbed components")
    return go


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env.setdefault("GOFLAGS", "-modcacherw")
    return env


@functools.cache
def modules() -> Modules:
    """Locate (downloading only if absent) the module directories for the pinned versions."""
    v = versions()
    go = _go()
    cache = Path(
        subprocess.run(
            [go, "env", "GOMODCACHE"], check=True, capture_output=True, text=True, env=_go_env()
        ).stdout.strip()
    )
    wanted = {
        "kwok": f"sigs.k8s.io/kwok@{v['KWOK_VERSION']}",
        "jobset": f"sigs.k8s.io/jobset@{v['JOBSET_VERSION']}",
        "trainer": f"github.com/kubeflow/trainer/v2@{v['TRAINER_VERSION']}",
        "kueue": f"sigs.k8s.io/kueue@{v['KUEUE_VERSION']}",
    }
    dirs: dict[str, Path] = {}
    for key, mv in wanted.items():
        d = cache / mv  # none of these module paths has upper-case letters, so no escaping is needed
        if not d.is_dir():
            subprocess.run([go, "mod", "download", mv], check=True, env=_go_env(), cwd=source_dir())
        dirs[key] = d
    return Modules(**dirs)
