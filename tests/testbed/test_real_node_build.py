"""build.sh and the real node's parts, with a stand-in ``go``: the kubelet's wrapper never changes the control
plane's cache key (built stacks and CI's warm cache stay valid), and the kubelet and the image programs are
built into cache dirs of their own keys, only when missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok", "jobset",
                 "trainer", "kueue")
FAKE_GO = r"""#!/usr/bin/env bash
# Stand-in for the Go tool: `go env GOVERSION`, and `go build ... -o OUT PKG` writing a tiny executable.
case "$1" in
  env) echo go1.26.0 ;;
  build) out=""; pkg=""
         while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; shift; fi; pkg="$1"; shift; done
         printf '#!/bin/sh\n' > "$out"; chmod +x "$out"; echo "$pkg" >> "$FAKE_GO_LOG" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A testbed source tree with one stack (k8s and kubelet wrappers) and the image programs' module."""
    src = tmp_path / "testbed"
    stack = src / "stacks" / "s"
    for mod in ("k8s", "kwok", "jobset", "trainer", "kueue"):
        (stack / "gomod" / mod).mkdir(parents=True)
        (stack / "gomod" / mod / "go.mod").write_text(f"module example.invalid/{mod}\n")
        (stack / "gomod" / mod / "go.sum").write_text("")
    for f in ("build.sh", "stack.sh"):
        shutil.copy(REPO / "testbed" / f, src / f)
    shutil.copytree(REPO / "testbed" / "images", src / "images")
    (src / "stacks" / "default").write_text("s\n")
    (stack / "versions.env").write_text("K8S_VERSION=v1.35.4\n")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(0o755)
    return src


def run(src: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = src.parent
    full = {**os.environ, "PATH": f"{base / 'fakebin'}{os.pathsep}{os.environ['PATH']}",
            "DISPATCH_TESTBED_CACHE": str(base / "cache"), "FAKE_GO_LOG": str(base / "go.log"), **env}
    full.pop("DISPATCH_TESTBED_STACK", None)
    full.pop("DISPATCH_TESTBED_REAL_NODE", None)
    full.update(env)
    return subprocess.run(["bash", str(src / "build.sh"), *args], capture_output=True, text=True, env=full,
                          check=False)


def built(src: Path) -> list[str]:
    log = src.parent / "go.log"
    return log.read_text().split() if log.exists() else []


def test_the_kubelet_wrapper_leaves_the_control_planes_key_alone(tree: Path) -> None:
    before = run(tree, "--key").stdout.strip()
    kubelet = tree / "stacks" / "s" / "gomod" / "kubelet"
    kubelet.mkdir()
    (kubelet / "go.mod").write_text("module example.invalid/kubelet\n\nrequire k8s.io/kubernetes v1.35.4\n")
    (kubelet / "go.sum").write_text("k8s.io/kubernetes v1.35.4 h1:x=\n")
    assert run(tree, "--key").stdout.strip() == before
    (tree / "stacks" / "s" / "gomod" / "kwok" / "go.sum").write_text("changed\n")
    assert run(tree, "--key").stdout.strip() != before, "the other wrappers still make the key"


def test_the_real_nodes_parts_build_apart_and_only_when_missing(tree: Path) -> None:
    (tree / "stacks" / "s" / "gomod" / "kubelet").mkdir()
    (tree / "stacks" / "s" / "gomod" / "kubelet" / "go.mod").write_text("module example.invalid/kubelet\n")
    (tree / "stacks" / "s" / "gomod" / "kubelet" / "go.sum").write_text("")
    first = run(tree)
    assert first.returncode == 0, first.stderr
    *node, bin_dir = first.stdout.split()
    outputs = dict(line.split("=", 1) for line in node)
    assert set(outputs) == {"kubelet", "node-images"}
    assert Path(outputs["kubelet"]).parent.parent.name == "kubelet"  # <cache>/kubelet/<key>/kubelet
    assert all((Path(outputs["node-images"]) / p).is_file() for p in ("pause", "workload"))
    assert all((Path(bin_dir) / b).is_file() for b in CONTROL_PLANE)
    assert built(tree)[-3:] == ["k8s.io/kubernetes/cmd/kubelet", "./pause", "./workload"]
    assert "[testbed build] plan s kube-apiserver" in first.stderr

    # A new kubelet (another wrapper) alone is rebuilt; the control plane is up to date and stays.
    (tree.parent / "go.log").unlink()
    (tree / "stacks" / "s" / "gomod" / "kubelet" / "go.sum").write_text("k8s.io/kubernetes v1.35.5 h1:y=\n")
    assert run(tree, "--check").returncode == 1
    second = run(tree)
    assert second.returncode == 0, second.stderr
    assert built(tree) == ["k8s.io/kubernetes/cmd/kubelet"]
    assert "[testbed build] plan s kubelet\n" in second.stderr
    assert second.stdout.split()[-1] == bin_dir
    assert dict(line.split("=", 1) for line in second.stdout.split()[:-1])["kubelet"] != outputs["kubelet"]

    third = run(tree, "--check")
    assert third.returncode == 0 and "[testbed build] up-to-date s" in third.stderr
    # Without the real node nothing of it is wanted or printed: the bin dir alone, as before.
    off = run(tree, "--check", DISPATCH_TESTBED_REAL_NODE="0")
    assert (off.returncode, off.stdout.split()) == (0, [bin_dir])
