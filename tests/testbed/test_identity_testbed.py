"""Execution identity on the real control plane: many `dispatch release` processes at once in one namespace,
two `dispatch open` processes of one submission, and the identity record's rules enforced by the real API
server (the CRD's validation rules), not by dispatch's clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch import Adapter, JobSpec
from dispatch import testbed as tb
from dispatch._identity import record_name
from dispatch.testbed.harness import role_kubeconfig_file

pytestmark = pytest.mark.testbed
Obj = dict[str, Any]


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    name = f"ident-{uuid.uuid4().hex[:6]}"
    tb.kubectl("create", "namespace", name)
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def writer(ns: str, tmp_path: Path) -> Iterator[str]:
    """A kubeconfig of a user bound to the shipped dispatch-writer role in ``ns`` (and the node reader)."""
    with role_kubeconfig_file(ns, tmp_path) as path:
        yield str(path)


def cli(kubeconfig: str, ns: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    return subprocess.Popen([sys.executable, "-c", "from dispatch.cli import main; main()",
                             "-n", ns, "-o", "json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow  # over 35 s: CI runs it on the newest stack only
def test_twenty_concurrent_release_processes_in_one_namespace_all_admit_with_a_1(ns: str, writer: str) -> None:
    with Adapter.connect(ns, kubeconfig=writer) as a:
        for i in range(20):
            a.open(JobSpec(job_id="many", submission=f"s{i}", num_nodes=1))
    procs = [cli(writer, ns, "release", f"many-s{i}") for i in range(20)]
    results = [(p.wait(timeout=300), p.stdout.read() if p.stdout else "", p.stderr.read() if p.stderr else "")
               for p in procs]
    assert [code for code, _, _ in results] == [0] * 20, [err for _, _, err in results if err]
    admissions = [json.loads(out)["identity"]["admission"] for _, out, _ in results]
    assert admissions == [1] * 20
    records = json.loads(tb.kubectl("get", "submissionrecords", "-n", ns, "-o", "json").stdout)["items"]
    assert sorted(r["spec"]["admission"] for r in records) == [1] * 20


def test_two_concurrent_open_processes_of_one_submission_exactly_one_wins(ns: str, writer: str) -> None:
    procs = [cli(writer, ns, "open", "--job-id", "twice", "--submission", "s1", "--name", name)
             for name in ("twice-a", "twice-b")]
    codes = [p.wait(timeout=120) for p in procs]
    errors = [p.stderr.read() if p.stderr else "" for p in procs]
    assert sorted(codes) == [0, 4], errors           # one created it, the other was refused (exit 4)
    assert any("already exists" in e for e in errors), errors
    names = [t["metadata"]["name"] for t in
             json.loads(tb.kubectl("get", "trainjobs", "-n", ns, "-o", "json").stdout)["items"]]
    assert len(names) == 1


def test_the_real_api_server_refuses_to_lower_a_record_or_change_its_submission(ns: str, writer: str) -> None:
    with Adapter.connect(ns, kubeconfig=writer) as a:
        a.open(JobSpec(job_id="lower", submission="s1", num_nodes=1), hold=False)
    name = record_name("lower", "s1")
    lowered = tb.kubectl("patch", "submissionrecord", name, "-n", ns, "--type", "merge",
                         "-p", '{"spec":{"admission":0}}', check=False)
    assert lowered.returncode != 0 and "A never decreases" in lowered.stderr
    moved = tb.kubectl("patch", "submissionrecord", name, "-n", ns, "--type", "merge",
                       "-p", '{"spec":{"submission":"s2"}}', check=False)
    assert moved.returncode != 0 and "never changes" in moved.stderr
    # the MultiKueue workers a record remembers are kept (not pruned) and forgotten only with a raise of A
    kept = tb.kubectl("patch", "submissionrecord", name, "-n", ns, "--type", "merge",
                      "-p", '{"spec":{"clusters":["worker-1","worker-2"]}}', check=False)
    assert kept.returncode == 0, kept.stderr
    hidden = tb.kubectl("patch", "submissionrecord", name, "-n", ns, "--type", "merge",
                        "-p", '{"spec":{"clusters":["worker-2"]}}', check=False)
    assert hidden.returncode != 0 and "forgets a MultiKueue worker only together with a raise" in hidden.stderr
    record: Obj = json.loads(tb.kubectl("get", "submissionrecord", name, "-n", ns, "-o", "json").stdout)
    assert record["spec"]["admission"] == 1
    assert record["spec"]["clusters"] == ["worker-1", "worker-2"]
