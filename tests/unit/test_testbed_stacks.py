"""Testbed stacks and build progress, with a stand-in build script instead of the 25-minute Go build."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch import testbed
from dispatch.testbed import _cluster, _paths
from dispatch.testbed._pki import _pair_matches, install_kueue_metrics_cert
from dispatch.testbed._progress import BuildProgress, fmt_duration, read_build_times

REPO_TESTBED = Path(__file__).resolve().parents[2] / "testbed"

STAND_IN = r"""#!/usr/bin/env bash
# Stand-in for testbed/build.sh: the same stderr events, no compiling. FAIL_AT names a component that fails.
set -euo pipefail
stack=""
while [ $# -gt 0 ]; do case "$1" in --stack) stack="$2"; shift 2 ;; *) shift ;; esac; done
log="$STANDIN_DIR/build.log"
echo "[testbed build] log $log" >&2
echo "[testbed build] plan $stack kube-apiserver etcd kueue" >&2
for c in kube-apiserver etcd kueue; do
  echo "[testbed build] start $c" >&2
  for i in $(seq 1 40); do echo "go: downloading example.invalid/$c/m$i v1.0.$i"; done >> "$log"
  if [ "${FAIL_AT:-}" = "$c" ]; then
    echo "$c/main.go:3:2: undefined: broken" >> "$log"
    echo "[testbed build] failed $c 7 exit=1" >&2
    exit 1
  fi
  echo "[testbed build] done $c 125" >&2
done
echo "$STANDIN_DIR/bin"
"""


@pytest.fixture
def fake_src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A testbed source tree with two stacks and a stand-in build script."""
    src = tmp_path / "testbed"
    for name, k8s in (("old", "v1.35.4"), ("new", "v1.37.2")):
        d = src / "stacks" / name
        d.mkdir(parents=True)
        (d / "versions.env").write_text(
            f"# comment\nK8S_VERSION={k8s}\nETCD_VERSION=v3.6.5\nKWOK_VERSION=v0.8.0\n"
            "JOBSET_VERSION=v0.11.1\nTRAINER_VERSION=v2.2.0\nKUEUE_VERSION=v0.17.0\n"
        )
        (d / "build-times").write_text("# seconds on 2 cores, cold\nkube-apiserver 600\netcd 60\nkueue 240\n")
    (src / "stacks" / "default").write_text("old\n")
    script = tmp_path / "stand-in-build.sh"
    script.write_text(STAND_IN)
    monkeypatch.setenv("DISPATCH_TESTBED_SRC", str(src))
    monkeypatch.setenv("DISPATCH_TESTBED_BUILD_SCRIPT", str(script))
    monkeypatch.setenv("STANDIN_DIR", str(tmp_path))
    monkeypatch.setenv(_paths.STACK_ENV, "unset-by-fixture")  # records the original state for undo
    monkeypatch.delenv(_paths.STACK_ENV)
    return src


def test_stack_selection_default_env_and_refusal(fake_src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert testbed.stacks() == ["new", "old"]
    assert testbed.stack() == "old"
    assert testbed.versions()["K8S_VERSION"] == "v1.35.4"
    monkeypatch.setenv(_paths.STACK_ENV, "new")
    assert testbed.stack() == "new"
    assert testbed.versions()["K8S_VERSION"] == "v1.37.2"
    assert testbed.versions("old")["K8S_VERSION"] == "v1.35.4"
    for bad in ("nope", "../old", ""):
        if bad:
            with pytest.raises(ValueError, match=r"unknown testbed stack .* \(known: new, old\)"):
                testbed.select_stack(bad)
    assert os.environ[_paths.STACK_ENV] == "new"  # a refused name changes nothing


def test_build_progress_lines_from_a_stand_in_build(fake_src: Path, tmp_path: Path) -> None:
    out = io.StringIO()
    bin_dir = testbed.build(out=out)
    assert bin_dir == tmp_path / "bin"
    lines = out.getvalue().splitlines()
    log = tmp_path / "build.log"
    assert lines[0] == (
        "testbed: first build of stack old (Kubernetes v1.35.4, etcd v3.6.5, KWOK v0.8.0, JobSet v0.11.1, "
        "Trainer v2.2.0, Kueue v0.17.0) from Go modules"
    )
    assert lines[1] == (
        "testbed: 3 components, about 15 min on 2 cores; later runs reuse the binaries and start in seconds"
    )
    assert lines[2] == f"testbed: the Go tool's output goes to {log}"
    assert lines[3] == "  [1/3] kube-apiserver           building  0s (usually ~10m00s)"
    assert re.fullmatch(
        r"  \[1/3\] kube-apiserver           built     2m05s \(usually ~10m00s\); \d+s so far, about 1 min left",
        lines[4],
    ), lines[4]
    assert lines[5] == "  [2/3] etcd                     building  0s (usually ~1m00s)"
    assert re.fullmatch(r"  \[2/3\] etcd +built +2m05s \(usually ~1m00s\); \d+s so far, about 2 min left", lines[6])
    assert lines[7] == "  [3/3] kueue                    building  0s (usually ~4m00s)"
    assert re.fullmatch(r"  \[3/3\] kueue +built +2m05s \(usually ~4m00s\); \d+s so far", lines[8]), lines[8]
    assert re.fullmatch(r"testbed: stack old built in \d+s; later runs reuse it and start in seconds", lines[9])
    assert len(lines) == 10
    assert "go: downloading" not in out.getvalue()  # the Go tool's output stays in the log
    assert "go: downloading example.invalid/kueue/m40 v1.0.40" in log.read_text()


def test_build_failure_names_the_log_and_shows_its_tail(
    fake_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL_AT", "etcd")
    monkeypatch.setenv(_paths.STACK_ENV, "new")
    out = io.StringIO()
    with pytest.raises(RuntimeError) as err:
        testbed.build(out=out)
    log = tmp_path / "build.log"
    assert str(err.value) == f"testbed build of stack new failed (exit 1); the Go tool's output is in {log}"
    text = out.getvalue().splitlines()
    assert "  [2/3] etcd                     FAILED after 7s (exit 1)" in text
    i = text.index(f"testbed: last 25 lines of {log}:")
    assert re.fullmatch(r"testbed: build of stack new failed \(etcd\) after \d+s", text[i - 1])
    tail = text[i + 1:]
    assert len(tail) == 25
    assert tail[-1] == "    etcd/main.go:3:2: undefined: broken"
    assert tail[-2] == "    go: downloading example.invalid/etcd/m40 v1.0.40"


def test_quiet_build_prints_nothing(fake_src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    testbed.build(quiet=True)
    assert capsys.readouterr().err == ""


def test_live_line_on_a_terminal_ticks_in_place() -> None:
    now = [100.0]
    out = io.StringIO()
    p = BuildProgress(out, "s", {"K8S_VERSION": "v1"}, {"kubectl": 90.0}, tty=True, clock=lambda: now[0])
    p.feed("[testbed build] plan s kubectl")
    p.feed("[testbed build] start kubectl")
    now[0] += 65
    p.tick()
    now[0] += 10
    p.feed("[testbed build] done kubectl 75")
    p.finish(True)
    text = out.getvalue()
    assert "\r\033[K  [1/1] kubectl                  building  0s (usually ~1m30s)" in text
    assert "\r\033[K  [1/1] kubectl                  building  1m05s (usually ~1m30s)" in text
    assert "\r\033[K  [1/1] kubectl                  built     1m15s (usually ~1m30s); 1m15s so far\n" in text
    assert text.endswith("\r\033[Ktestbed: stack s built in 1m15s; later runs reuse it and start in seconds\n")


def test_up_to_date_build_says_nothing_more() -> None:
    out = io.StringIO()
    p = BuildProgress(out, "s", {}, {})
    p.feed("[testbed build] up-to-date s /cache/bin/abc")
    p.finish(True)
    assert out.getvalue() == ""
    assert p.up_to_date


def test_helpers() -> None:
    assert [fmt_duration(s) for s in (0, 59.4, 60, 3599, 3720)] == ["0s", "59s", "1m00s", "59m59s", "1h02m"]


def test_committed_stacks_are_complete() -> None:
    """Each stack in the repo has its versions, its five wrapper modules and its measured build times."""
    stacks = sorted(p.parent.name for p in (REPO_TESTBED / "stacks").glob("*/versions.env"))
    assert {"k8s-1.35", "k8s-1.37"} <= set(stacks)
    assert (REPO_TESTBED / "stacks" / "default").read_text().strip() in stacks
    for name in stacks:
        d = REPO_TESTBED / "stacks" / name
        for comp in ("k8s", "kwok", "jobset", "trainer", "kueue", "kubelet"):
            assert (d / "gomod" / comp / "go.mod").is_file(), (name, comp)
            assert (d / "gomod" / comp / "go.sum").is_file(), (name, comp)
        times = read_build_times(d / "build-times")
        assert set(times) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd",
                              "kwok", "jobset", "trainer", "kueue", "kubelet", "pause", "workload"}, name
        k8s = [ln for ln in (d / "versions.env").read_text().splitlines() if ln.startswith("K8S_VERSION=")]
        assert k8s and f"k8s.io/kubernetes {k8s[0].split('=')[1]}" in (d / "gomod/k8s/go.mod").read_text()


def test_build_script_refuses_an_unknown_stack_and_keys_stacks_apart() -> None:
    bad = subprocess.run(["bash", str(REPO_TESTBED / "build.sh"), "--stack", "nope", "--key"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "unknown testbed stack 'nope' (known: " in bad.stderr
    keys = {
        s: subprocess.run(["bash", str(REPO_TESTBED / "build.sh"), "--stack", s, "--key"],
                          capture_output=True, text=True, check=True).stdout.strip()
        for s in ("k8s-1.35", "k8s-1.37")
    }
    assert all(re.fullmatch(r"[0-9a-f]{16}", k) for k in keys.values())
    assert keys["k8s-1.35"] != keys["k8s-1.37"]


def test_up_refuses_a_testbed_running_another_stack(fake_src: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rt = tmp_path / "rt"
    rt.mkdir()
    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(rt))
    (rt / "state.json").write_text(json.dumps({"bin": str(tmp_path), "stack": "old"}))
    monkeypatch.setattr(_cluster, "is_up", lambda: True)
    monkeypatch.setenv(_paths.STACK_ENV, "new")
    with pytest.raises(RuntimeError, match=r"runs stack old, not new: take it down first"):
        testbed.up()
    monkeypatch.setenv(_paths.STACK_ENV, "old")
    assert testbed.up() == rt / "kubeconfig"


def test_kueue_metrics_cert_is_written_once_and_kept(tmp_path: Path) -> None:
    d = tmp_path / "etc" / "kueue" / "metrics" / "certs"
    install_kueue_metrics_cert(d)
    first = (d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes()
    assert _pair_matches(d / "tls.crt", d / "tls.key")
    install_kueue_metrics_cert(d)  # a second testbed keeps the pair a running Kueue may re-read
    assert ((d / "tls.crt").read_bytes(), (d / "tls.key").read_bytes()) == first
    (d / "tls.key").write_text("half a key")  # broken: replaced whole
    install_kueue_metrics_cert(d)
    assert _pair_matches(d / "tls.crt", d / "tls.key")
    assert (d / "tls.crt").read_bytes() != first[0]
    assert sorted(p.name for p in d.iterdir()) == ["tls.crt", "tls.key"]


def test_cli_module_refuses_unknown_stack(fake_src: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "dispatch.testbed", "--stack", "nope", "stacks"],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown testbed stack 'nope' (known: new, old)"
    ok = subprocess.run([sys.executable, "-m", "dispatch.testbed", "--stack", "new", "stacks"],
                        capture_output=True, text=True, check=True,
                        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert ok.stdout.splitlines()[0].startswith("* new        k8s=v1.37.2 etcd=v3.6.5")


@pytest.mark.skipif(shutil.which("go") is None, reason="the build script asks the Go toolchain for its version")
def test_build_script_reuses_an_aliased_bin_dir_only_while_inputs_match(tmp_path: Path) -> None:
    """A bin dir built under an earlier key of the same inputs is reused, not rebuilt; a changed input
    (and so a new key) is not covered by the alias."""
    src = tmp_path / "testbed"
    (src / "stacks" / "s" / "gomod" / "k8s").mkdir(parents=True)
    for f in ("build.sh", "stack.sh"):
        shutil.copy(REPO_TESTBED / f, src / f)
    (src / "stacks" / "default").write_text("s\n")
    stack = src / "stacks" / "s"
    (stack / "versions.env").write_text("K8S_VERSION=v1.35.4\n")
    (stack / "gomod" / "k8s" / "go.mod").write_text("module example.invalid/k8s\n")
    (stack / "gomod" / "k8s" / "go.sum").write_text("")
    env = {**os.environ, "DISPATCH_TESTBED_CACHE": str(tmp_path / "cache")}
    env.pop(_paths.STACK_ENV, None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(src / "build.sh"), *args], capture_output=True, text=True, env=env,
                              check=False)

    key = run("--key").stdout.strip()
    old = tmp_path / "cache" / "bin" / "0123456789abcdef"
    old.mkdir(parents=True)
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok", "jobset",
              "trainer", "kueue"):
        (old / b).write_text("#!/bin/sh\n")
        (old / b).chmod(0o755)
    (old / ".stamp").write_text("built=earlier\n")
    assert run("--check").returncode == 1  # no alias: not built
    (stack / "cache-aliases").write_text(f"# earlier key scheme\n{key} {old.name}\n")
    checked = run("--check")
    assert (checked.returncode, checked.stdout.strip()) == (0, str(old))
    assert f"[testbed build] up-to-date s {old}" in checked.stderr
    (stack / "versions.env").write_text("K8S_VERSION=v1.35.5\n")  # another input: another key, alias void
    assert run("--key").stdout.strip() != key
    assert run("--check").returncode == 1


def test_a_real_node_problem_fixed_since_up_says_to_start_the_testbed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The problem is read once, at ``up``: after containerd is installed the testbed keeps its old answer, so
    the answer names the way to start the real node (down, then up) once the host allows it."""
    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path))
    (tmp_path / "state.json").write_text(json.dumps({
        "real-node-problem": "missing containerd (apt-get install containerd runc containernetworking-plugins)",
        "kubelet": "k", "node-images": "i"}))
    from dispatch.testbed import _node

    monkeypatch.setattr(_node, "unsupported", lambda kubelet, images=None: "missing containerd")
    still = _cluster.real_node_problem() or ""
    assert still.startswith("missing containerd") and "testbed down" not in still
    monkeypatch.setattr(_node, "unsupported", lambda kubelet, images=None: None)
    fixed = _cluster.real_node_problem() or ""
    assert fixed.startswith("missing containerd")
    assert "`dispatch testbed down`, then `dispatch testbed up`" in fixed
    assert any("testbed down" in line for line in _node.describe())


def test_up_waits_for_a_partly_running_testbed_and_never_restarts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A campaign stops the API server, kubelet or containerd, or powers its node off, for seconds or minutes; a
    test calling ``up`` meanwhile took the whole testbed down and up (twice, each time ending the campaign). Now
    ``up`` waits for a partly running testbed to answer again, and otherwise leaves it as it is and says why."""
    from dispatch.testbed import _cluster

    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path))
    answers = iter([False, False, True])   # the API server back on the third look
    api = _cluster.ComponentStatus("kube-apiserver", 1, True, False, False)
    kubelet = _cluster.ComponentStatus("kubelet", None, False, False, False)
    monkeypatch.setattr(_cluster, "is_up", lambda: next(answers))
    monkeypatch.setattr(_cluster, "status", lambda verbose=False: [api, kubelet])
    monkeypatch.setattr("dispatch.testbed._cluster.time.sleep", lambda _s: None)
    touched: list[str] = []
    monkeypatch.setattr(_cluster, "_down", lambda: touched.append("down"))
    def started() -> Path:
        touched.append("up")
        return tmp_path / "kubeconfig"
    monkeypatch.setattr(_cluster, "_up", started)
    assert _cluster.up() == _paths.kubeconfig_path()
    assert touched == [] and _cluster.is_present()

    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr("dispatch.testbed._cluster.time.monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(_cluster, "is_up", lambda: False)     # it stays partial: left alone, and said why
    with pytest.raises(RuntimeError) as err:
        _cluster.up()
    assert touched == []
    said = str(err.value)
    assert "runs in part" in said and "not running: kubelet" in said and "not answering: kube-apiserver" in said
    assert "start-component NAME" in said and "down" in said


def test_a_fleet_with_a_worker_down_is_present_though_not_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's test fixture takes the fleet down at the end only if none of it ran before: a fleet campaign
    powers a worker off, and a test run beside it must not read that fleet as not its own to keep."""
    from dispatch.testbed import fleet

    monkeypatch.setenv("DISPATCH_TESTBED_DIR", str(tmp_path / "tb"))
    assert not fleet.is_present()          # nothing of it on disk: nothing asked
    clusters = fleet.fleet().clusters
    for c in clusters:
        (c.runtime_dir / "pids").mkdir(parents=True)
    down: dict[str, object] = {"name": "kube-apiserver", "pid": None, "running": False, "healthy": False,
                               "frozen": False}
    rows = {c.name: [down] for c in clusters}
    monkeypatch.setattr(fleet, "status_of", lambda name: rows[name])
    assert not fleet.is_present()
    rows[clusters[-1].name] = [{"name": "kube-apiserver", "pid": 7, "running": True, "healthy": False,
                                "frozen": False}]
    assert fleet.is_present() and not fleet.is_up()
