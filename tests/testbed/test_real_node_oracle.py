"""The process oracle and the real node's images, without a cluster: the overlap check on synthetic records,
the workload program's lines as it really writes them, and the OCI archive containerd imports."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from dispatch.testbed import _oci, oracle, realnode

REPO = Path(__file__).resolve().parents[2]


def rec(run: str, a: str, event: str, ms: int, *, sub: str = "s1", seq: int = 0, pid: int = 100,
        code: int | None = None) -> oracle.Record:
    return oracle.Record(job_id="j", submission=sub, admission=a, pod=f"p-{run}", pid=pid, pidns="-",
                         start_ticks="-", run=run, seq=seq or ms, ms=ms, event=event, code=code)


def life(run: str, a: str, start: int, end: int | None, **kw: object) -> list[oracle.Record]:
    """START at ``start``, a TICK every 100 ms, EXIT at ``end`` (None: no EXIT line)."""
    last = end if end is not None else start + 500
    out = [rec(run, a, "START", start, **kw)]  # type: ignore[arg-type]
    out += [rec(run, a, "TICK", t, **kw) for t in range(start + 100, last, 100)]  # type: ignore[arg-type]
    if end is not None:
        out.append(rec(run, a, "EXIT", end, code=0, **kw))  # type: ignore[arg-type]
    return out


def dead(_: oracle.Record) -> bool:
    return False


def alive(_: oracle.Record) -> bool:
    return True


def test_two_admissions_alive_at_once_are_an_overlap() -> None:
    records = life("r1", "1", 1000, 3000) + life("r2", "2", 2500, 4000)
    [found] = oracle.overlaps(records, alive=dead)
    assert (found.first.admission, found.second.admission) == ("1", "2")
    assert (found.since_ms, found.until_ms) == (2500, 3000)
    assert (found.first.pid, found.second.pid) == (100, 100)
    assert "A=1" in str(found) and "A=2" in str(found)
    with pytest.raises(AssertionError, match="two executions at once"):
        oracle.assert_no_overlap(records, alive=dead)


def test_sequential_admissions_and_one_executions_nodes_are_not() -> None:
    records = life("r1", "1", 1000, 2000) + life("r2", "2", 2100, 3000) + life("r3", "2", 2100, 3000)
    assert oracle.overlaps(records, alive=dead) == []  # r2 and r3: two nodes of one execution (same A)
    oracle.assert_no_overlap(records, alive=dead)
    other = life("r4", "7", 1500, 1800, sub="s2")  # another submission may run at any time
    assert oracle.overlaps(records + other, alive=dead) == []


def test_a_process_without_exit_is_alive_while_its_pid_is() -> None:
    killed = life("r1", "1", 1000, None)  # SIGKILLed, or still running: last line at 1400
    later = life("r2", "2", 5000, 6000)
    assert oracle.overlaps(killed + later, alive=dead) == []  # gone: ended at its last line
    [found] = oracle.overlaps(killed + later, alive=alive)  # its pid still runs: alive until now
    assert found.first.alive and found.first.ended_ms is None
    assert (found.since_ms, found.until_ms) == (5000, 6000)
    [p, _] = oracle.processes(killed + later, alive=dead)
    assert (p.ended_ms, p.exit_code, p.lines) == (1400, None, 5)


def test_lines_parse_escape_and_refuse_torn_ones(tmp_path: Path) -> None:
    line = ("dispatch-oracle/1 job=my%20job submission=s%3D1 a=3 pod=w pid=42 pidns=9 start=77 run=ab seq=5 "
            "ms=1700000000000 event=EXIT code=3")
    r = oracle.parse_line(line, "f:1")
    assert r is not None
    assert (r.job_id, r.submission, r.admission, r.pid, r.event, r.code, r.where) == (
        "my job", "s=1", "3", 42, "EXIT", 3, "f:1")
    assert oracle.parse_line("some other output") is None
    with pytest.raises(ValueError, match="malformed oracle line at f:2"):
        oracle.parse_line("dispatch-oracle/1 job=j submiss", "f:2")
    f = tmp_path / "oracle.log"
    f.write_text(line + "\n" + line.replace("seq=5", "seq=6")[:40])  # the last line is still being written
    assert [x.seq for x in oracle.read(f)] == [5]
    assert [x.seq for x in oracle.read(tmp_path)] == [5]  # a directory: every *.log in it


def test_pid_alive_knows_this_process_and_not_a_reused_pid() -> None:
    ticks = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    assert oracle.pid_alive(os.getpid())
    assert oracle.pid_alive(os.getpid(), ticks)
    assert not oracle.pid_alive(os.getpid(), str(int(ticks) + 1))
    assert not oracle.pid_alive(2**22 + 12345)


def test_the_oci_archive_is_a_consistent_image_layout(tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_bytes(b"\x7fELF not really")
    prog.chmod(0o755)
    out = tmp_path / "img.tar"
    digest = _oci.archive(out, "localhost/x/prog:1", ["/prog"], {"/prog": prog}, links={"/bin/sh": "/prog"})
    assert digest == _oci.archive(tmp_path / "again.tar", "localhost/x/prog:1", ["/prog"], {"/prog": prog},
                                  links={"/bin/sh": "/prog"}), "same files, same digests"
    with tarfile.open(out) as t:
        blobs = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(blobs["index.json"])
    [m] = index["manifests"]
    assert m["digest"] == digest
    assert m["annotations"]["io.containerd.image.name"] == "localhost/x/prog:1"
    manifest = json.loads(blobs["blobs/sha256/" + digest.removeprefix("sha256:")])
    config = json.loads(blobs["blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:")])
    assert config["config"]["Entrypoint"] == ["/prog"]
    layer = gzip.decompress(blobs["blobs/sha256/" + manifest["layers"][0]["digest"].removeprefix("sha256:")])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer)) as t:
        members = {m.name: m for m in t.getmembers()}
    assert members["prog"].mode == 0o755 and members["bin/sh"].islnk() and members["bin/sh"].linkname == "prog"
    assert members["bin/sh"].mode == 0o755, "an unpacker applies a hard link's mode to the file it links"


def test_on_real_node_asks_for_the_node_and_keeps_dispatchs_variables(tmp_path: Path) -> None:
    template: dict[str, Any] = {"metadata": {"labels": {"x": "y"}}, "spec": {
        "nodeSelector": {"zone": "a"},
        "containers": [
            {"name": "node", "image": "pytorch/pytorch", "command": ["torchrun"], "args": ["train.py"],
             "env": [{"name": "DISPATCH_ADMISSION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}}]},
            {"name": "sidecar", "image": "busybox"},
        ]}}
    out = realnode.on_real_node(template, tmp_path, containers=["node"], grace="2s", linger=True)
    spec = out["spec"]
    assert template["spec"]["nodeSelector"] == {"zone": "a"}, "the input is not changed"
    assert spec["nodeSelector"] == {"zone": "a", realnode.LABEL: "true"}
    assert spec["tolerations"] == [{"key": realnode.LABEL, "operator": "Equal", "value": "true",
                                    "effect": "NoSchedule"}]
    assert spec["hostPID"] is True
    assert spec["volumes"] == [{"name": "dispatch-oracle",
                                "hostPath": {"path": str(tmp_path.resolve()), "type": "DirectoryOrCreate"}}]
    node, sidecar = spec["containers"]
    assert (node["image"], node["imagePullPolicy"], node["command"]) == (realnode.WORKLOAD_IMAGE, "Never",
                                                                         ["/workload"])
    assert "args" not in node and sidecar == {"name": "sidecar", "image": "busybox"}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in node["env"]}
    assert env["DISPATCH_ADMISSION"] == {"fieldRef": {"fieldPath": "metadata.labels"}}
    assert (env["GRACE"], env["LINGER"], env["ORACLE_FILE"]) == ("2s", "1", "/oracle/oracle.log")
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    rt = realnode.training_runtime("rt", tmp_path, namespace="ns1", grace_period_seconds=5)
    assert rt["kind"] == "TrainingRuntime" and rt["metadata"]["namespace"] == "ns1"
    pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 5 and pod["containers"][0]["name"] == "node"
    assert realnode.oracle_file(tmp_path) == tmp_path / "oracle.log"


# ------------------------------------------------------------------------------- the workload, really run


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workload program, built from testbed/images (seconds; the Go build cache makes it faster)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("the Go toolchain builds the workload program")
    out = tmp_path_factory.mktemp("bin") / "workload"
    subprocess.run([go, "build", "-trimpath", "-o", str(out), "./workload"], cwd=REPO / "testbed" / "images",
                   check=True, env={**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"})
    return out


def run(workload: Path, file: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(workload), "--any", "args", "at all"], stdout=subprocess.DEVNULL,
                            env={"ORACLE_FILE": str(file), "TICK": "20ms", "DISPATCH_JOB_ID": "j",
                                 "DISPATCH_SUBMISSION": "s1", **env})


def wait_lines(file: Path, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(oracle.read(file)) < n:
        assert time.monotonic() < deadline, "the workload wrote too little"
        time.sleep(0.02)


def test_the_workload_writes_term_then_exit_after_its_grace(workload: Path, tmp_path: Path) -> None:
    f = tmp_path / "o" / "oracle.log"  # its directory is created
    p = run(workload, f, DISPATCH_ADMISSION="3", GRACE="0.3", EXIT_CODE="4")
    wait_lines(f, 3)
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 4
    recs = oracle.read(f)
    events = [r.event for r in recs]
    assert events[0] == "START" and events[-1] == "EXIT" and "TERM" in events
    term = events.index("TERM")
    assert set(events[1:term]) == {"TICK"} and set(events[term + 1:-1]) == {"TICK"}
    assert recs[-1].ms - recs[term].ms >= 280
    assert {(r.admission, r.pid, r.run) for r in recs} == {("3", p.pid, recs[0].run)}
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    [proc] = oracle.processes(recs)
    assert (proc.alive, proc.exit_code) == (False, 4)


def test_a_lingering_workload_ignores_sigterm_and_shares_a_file(workload: Path, tmp_path: Path) -> None:
    f = tmp_path / "oracle.log"
    a = run(workload, f, DISPATCH_ADMISSION="1", LINGER="1")
    b = run(workload, f, DISPATCH_ADMISSION="2", LIFETIME="0.5")
    try:
        wait_lines(f, 10)
        a.send_signal(signal.SIGTERM)
        assert b.wait(10) == 0
        time.sleep(0.2)
        assert a.poll() is None, "LINGER=1: SIGTERM does not end it"
        [found] = oracle.overlaps(oracle.read(f))  # A=2 ran while A=1 (still alive, pid on this host) did
        assert {found.first.admission, found.second.admission} == {"1", "2"}
        assert found.until_ms is not None  # A=2 exited
    finally:
        a.kill()
        a.wait(10)
    procs = {p.admission: p for p in oracle.processes(oracle.read(f))}
    assert procs["1"].termed_ms is not None and procs["1"].exit_code is None
    assert not procs["1"].alive, "killed: its pid is gone, so it ended at its last line"
