"""Where the testbed keeps things: sources in the repo, binaries in a user cache, state in /tmp.

Binaries live outside the repo (they are large and machine-specific); runtime state lives in a
throw-away directory so a crashed run never leaves anything in the work tree.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

STACK_ENV = "DISPATCH_TESTBED_STACK"
_STACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def source_dir() -> Path:
    """The repo's ``testbed/`` directory (stacks, build scripts)."""
    env = os.environ.get("DISPATCH_TESTBED_SRC")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "testbed"


def stacks() -> list[str]:
    """Names of the stacks in ``testbed/stacks/`` (each a versions.env plus its wrapper Go modules)."""
    base = source_dir() / "stacks"
    return sorted(p.parent.name for p in base.glob("*/versions.env"))


def default_stack() -> str:
    """The stack used when none is named (``testbed/stacks/default``)."""
    return (source_dir() / "stacks" / "default").read_text().strip()


def stack() -> str:
    """The selected stack: ``$DISPATCH_TESTBED_STACK``, else the default; refused if unknown.

    The selection lives in the environment (not in a module global) so that the build script, pytest
    workers and subprocesses all see the same stack.
    """
    name = os.environ.get(STACK_ENV, "").strip() or default_stack()
    check_stack(name)
    return name


def check_stack(name: str) -> None:
    """Raise ``ValueError`` naming the known stacks unless ``name`` is one of them."""
    known = stacks()
    if not _STACK_NAME.fullmatch(name) or name not in known:
        raise ValueError(f"unknown testbed stack {name!r} (known: {', '.join(known) or 'none'})")


def select_stack(name: str) -> None:
    """Select ``name`` for this process and its children (sets ``$DISPATCH_TESTBED_STACK``)."""
    check_stack(name)
    os.environ[STACK_ENV] = name


def stack_dir(name: str | None = None) -> Path:
    """Directory of ``name`` (default: the selected stack)."""
    return source_dir() / "stacks" / (name or stack())


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


def versions(name: str | None = None) -> dict[str, str]:
    """Component versions pinned in the stack's ``versions.env`` (default: the selected stack)."""
    out: dict[str, str] = {}
    for line in (stack_dir(name) / "versions.env").read_text().splitlines():
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


def modules() -> Modules:
    """Locate (downloading only if absent) the module directories for the selected stack's versions."""
    return _modules(stack())


@functools.cache
def _modules(name: str) -> Modules:
    v = versions(name)
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
