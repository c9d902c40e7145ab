"""Plain mode's Events on the real control plane, written with only the writer's shipped role.

A writer (``dispatch-writer`` bound in the test's namespace, ``dispatch-node-reader`` cluster-wide, as
deploy/base/rbac.yaml ships them) opens, releases, holds and closes a TrainJob; ``kubectl describe
trainjob`` then tells that story from the Events on the object, as it does in Kueue mode.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dispatch import AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.testbed.harness import is_running, until

from . import test_testbed as tt
from .test_testbed import _kubectl as kubectl_path
from .test_testbed import kubeconfig

pytestmark = pytest.mark.testbed

env, rbac = tt.env, tt.rbac   # the fixtures: a fresh namespace with the shipped roles bound to ServiceAccounts


def as_sa(ns: str, sa: str, path: Path) -> Path:
    token = subprocess.run([kubectl_path(), "--kubeconfig", str(kubeconfig()), "-n", ns, "create", "token", sa],
                           check=True, capture_output=True, text=True).stdout.strip()
    cluster = yaml.safe_load(kubeconfig().read_text())["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
        "current-context": sa}))
    return path


async def test_describe_tells_open_release_hold_and_close(rbac: tuple[k.Kube, str], tmp_path: Path) -> None:
    kube, ns = rbac
    name = "story-s1"
    writer = AsyncAdapter.connect(ns, kubeconfig=as_sa(ns, "writer", tmp_path / "writer"))
    try:
        await writer.open(JobSpec(job_id="story", submission="s1"))
        uid = (await kube.get(k.TRAINJOBS, name))["metadata"]["uid"]
        assert (await writer.release(name)).admission == 1
        await until(lambda: is_running(kube, name), what="running as A=1")
        await writer.hold(name)
        described = tb.kubectl("-n", ns, "describe", "trainjob", name).stdout
        events = " ".join(described[described.index("Events:"):].split())
        print(events)
        for said in ("Normal Opened", "opened as story/s1, held", "Normal AdmissionProceeds",
                     "admitted as story/s1#1 (A=1)", "Normal Held"):
            assert said in events, said
        await writer.close(name)
    finally:
        await writer.aclose()
    mine = [e for e in (await kube.list(k.EVENTS)).items if e["involvedObject"].get("uid") == uid]
    assert [e["reason"] for e in sorted(mine, key=lambda e: int(e["metadata"]["resourceVersion"]))] == [
        "Opened", "AdmissionProceeds", "Held", "Closed"]
    assert all(e["source"]["component"] == "dispatch" for e in mine)
