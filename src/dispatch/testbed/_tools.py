"""Tools beside the control plane that the deploy checks use: helm, built from its Go module."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

from dispatch.testbed import _paths


def _cache() -> Path:
    return Path(os.environ.get("DISPATCH_TESTBED_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dispatch-testbed")


def helm() -> Path:
    """The helm binary (``testbed/build-helm.sh``, cached by helm's and Go's versions; minutes when cold)."""
    cache = _cache()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".helm-build.lock").open("a") as lock:  # two test runs never build it twice at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(["bash", str(_paths.source_dir() / "build-helm.sh")], stdout=subprocess.PIPE,
                              text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm build failed (exit {proc.returncode}); run testbed/build-helm.sh to see why")
    return Path(proc.stdout.strip().splitlines()[-1])


def kubectl() -> Path:
    """The testbed's kubectl (built with the control plane), which also renders kustomizations."""
    from dispatch.testbed._cluster import _bin_dir

    return _bin_dir() / "kubectl"
