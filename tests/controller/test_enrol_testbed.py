"""Enrolment on the real control plane: TrainJobs dispatch did not create get the rule and an execution identity.

The namespace is opted in with the shipped label, and the guard (validating webhook, CEL policy and
enrolment's mutating webhook of ``deploy/base/guard.yaml``, narrowed to the test's namespace) is served by a
real ``python -m dispatch.controller --guard-port`` process on this host. TrainJobs are created the way
users create them: the Kubeflow SDK's ``TrainerClient().train(...)`` (plain mode, and under Kueue with the
SDK's ``Labels`` option naming the queue) and ``kubectl apply`` of a plain TrainJob manifest. Nobody's code
knows about dispatch; the API server's own admission chain brings each object under it.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import CustomTrainerContainer, TrainerClient
from kubeflow.trainer.options.kubernetes import Labels

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, PATCH_MANAGER, POD_FINALIZER, JobSpec, State
from dispatch import _enrol as e
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.errors import PodsRemain
from dispatch.testbed.harness import (
    A,
    check_of,
    controller_env,
    hold_pods,
    is_running,
    pods_of,
    release_pods,
    running_pods,
    running_testbed_kubeconfig,
    until,
    workload_of,
)

from .test_guard_testbed import DENIED, Guarded, installed, release, unsuspend

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
MUTATING = 'admission webhook "enrol.dispatch.phpboyscout.uk" denied the request: '


@pytest.fixture
async def g(testbed_kubeconfig: str, tmp_path: Path) -> AsyncIterator[Guarded]:
    """The guard with enrolment for a fresh namespace, which is then opted in."""
    path = running_testbed_kubeconfig()
    if path is None:
        pytest.skip("the testbed is not up (python -m dispatch.testbed up)")
    async with controller_env(path) as (kube, ns, _), installed(kube, ns, tmp_path, enrolment=True) as got:
        await enrol(got, True)
        yield got


async def enrol(g: Guarded, on: bool) -> None:
    """The operator's opt-in (``kubectl label namespace NS dispatch.phpboyscout.uk/enrol=true``), or its undoing."""
    await g.kube.merge_patch(k.NAMESPACES, g.ns, {"metadata": {"labels": {e.ENROL_LABEL: e.ENROL_VALUE if on
                                                                          else None}}})


def sdk(g: Guarded) -> TrainerClient:
    path = running_testbed_kubeconfig()
    assert path is not None
    return TrainerClient(KubernetesBackendConfig(namespace=g.ns, config_file=str(path)))


async def train(g: Guarded, options: list[Any] | None = None) -> str:
    """``TrainerClient().train(...)``, exactly as an SDK user writes it (no dispatch in sight)."""
    trainer = CustomTrainerContainer(image="example.invalid/train:1", num_nodes=1,
                                     resources_per_node={"cpu": "1"})
    return await asyncio.to_thread(sdk(g).train, runtime="torch-distributed", trainer=trainer, options=options)


async def terminating(g: Guarded, name: str) -> bool:
    got = await pods_of(g.kube, name)
    return bool(got) and all(p["metadata"].get("deletionTimestamp") for p in got)


async def gone(g: Guarded, pods: list[str]) -> None:
    await release_pods(g.kube, pods)

    async def none_left() -> bool:
        return not {p["metadata"]["name"] for p in (await g.kube.list(k.PODS)).items} & set(pods)
    await until(none_left, what="the old pods gone")


def assert_enrolled(tj: Obj, name: str) -> None:
    labels = tj["metadata"]["labels"]
    assert labels[LABEL_JOB_ID] == name and labels[LABEL_SUBMISSION]
    assert tj["spec"]["suspend"] is True
    [entry] = [p for p in tj["spec"]["runtimePatches"] if p.get("manager") == PATCH_MANAGER]
    pod_meta = entry["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["metadata"]
    assert pod_meta["finalizers"] == [POD_FINALIZER] and pod_meta["labels"][A] == "0"


def assert_execution(pods: list[Obj], admission: int) -> None:
    """Every running pod is of execution ``admission``, with dispatch's finalizer and identity variables."""
    assert pods and [p["metadata"]["labels"][A] for p in pods] == [str(admission)] * len(pods)
    for pod in pods:
        assert POD_FINALIZER in pod["metadata"]["finalizers"]
        env = {v["name"]: v for c in pod["spec"]["containers"] for v in c.get("env") or []}
        assert env["DISPATCH_ADMISSION"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{A}']"


# ---------------------------------------------------------------- plain mode


async def test_an_sdk_trainjob_is_held_released_refused_while_its_pod_terminates_then_admitted_as_a2(
        g: Guarded) -> None:
    name = await train(g)
    tj = await g.kube.get(k.TRAINJOBS, name)
    assert_enrolled(tj, name)
    status = await g.adapter.inspect(name)
    assert status.state is State.HELD and status.identity is not None and status.identity.admission == 0
    submission = tj["metadata"]["labels"][LABEL_SUBMISSION]
    print("ENROLLED:", name, "as", status.identity)

    assert await release(g, name) == 1
    await until(lambda: is_running(g.kube, name), what=f"{name} running as A=1")
    assert_execution(running_pods(await pods_of(g.kube, name)), 1)

    pods = await hold_pods(g.kube, name)
    await g.adapter.hold(name)
    await until(lambda: terminating(g, name), what="the old pod Terminating")
    with pytest.raises(PodsRemain) as refused:
        await g.adapter.release(name)
    print("REFUSED:", refused.value)
    assert [r.name for r in refused.value.remaining] == pods
    denied = unsuspend(g.ns, name)  # and the API server refuses it to anyone else
    assert denied.returncode != 0 and f"{DENIED}trainjob {name} cannot start: remaining pods: {pods[0]}" \
        in denied.stderr

    await gone(g, pods)
    assert await release(g, name) == 2
    await until(lambda: is_running(g.kube, name), what=f"{name} running as A=2")
    assert_execution(running_pods(await pods_of(g.kube, name)), 2)
    ident = (await g.adapter.inspect(name)).identity
    assert ident is not None and (ident.submission, ident.admission) == (submission, 2)


# ---------------------------------------------------------------- Kueue mode


async def test_an_sdk_trainjob_on_a_kueue_queue_runs_through_dispatchs_check_and_readmits_as_a2(
        g: Guarded) -> None:
    name = await train(g, [Labels({"kueue.x-k8s.io/queue-name": "lq"})])
    assert_enrolled(await g.kube.get(k.TRAINJOBS, name), name)
    await until(lambda: is_running(g.kube, name), what=f"{name} admitted by Kueue through dispatch's check")
    assert_execution(running_pods(await pods_of(g.kube, name)), 1)

    pods = await hold_pods(g.kube, name)
    await g.adapter.hold(name)
    await until(lambda: terminating(g, name), what="the old pod Terminating")
    await g.adapter.release(name)  # Kueue mode: the Workload is active again; dispatch's check decides

    async def waiting() -> bool:
        return bool(check_of(await workload_of(g.kube, name)).get("message", "").startswith(
            f"waiting for pods of the previous execution to go: {pods[0]} on "))
    await until(waiting, what="the check waiting for the old pod")
    tj = await g.kube.get(k.TRAINJOBS, name)
    assert tj["spec"]["suspend"] is True and not running_pods(await pods_of(g.kube, name))
    denied = unsuspend(g.ns, name)
    assert denied.returncode != 0 and f"{DENIED}trainjob {name} cannot start: remaining pods: {pods[0]}" \
        in denied.stderr

    await release_pods(g.kube, pods)
    await until(lambda: is_running(g.kube, name), what=f"{name} running again as A=2")
    assert_execution(running_pods(await pods_of(g.kube, name)), 2)


# ---------------------------------------------------------------- kubectl apply, and what enrolment leaves alone


MANIFEST = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
{labels}spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    image: example.invalid/train:1
    numNodes: 1
"""


def kubectl_apply(g: Guarded, tmp: Path, name: str, labels: str = "") -> subprocess.CompletedProcess[str]:
    path = tmp / f"{name}.yaml"
    path.write_text(MANIFEST.format(name=name, labels=labels))
    return tb.kubectl("-n", g.ns, "apply", "-f", str(path), check=False)


async def test_a_kubectl_applied_trainjob_is_enrolled_and_one_from_before_enrolment_is_not(
        g: Guarded, tmp_path: Path) -> None:
    await enrol(g, False)
    before = kubectl_apply(g, tmp_path, "before")
    assert before.returncode == 0, before.stderr
    await enrol(g, True)

    applied = kubectl_apply(g, tmp_path, "plain")
    assert applied.returncode == 0, applied.stderr
    print("APPLIED:", applied.stdout.strip(), applied.stderr.strip())
    assert applied.stderr.startswith("Warning: dispatch enrolled this TrainJob as plain/")
    assert "`dispatch release plain` starts it" in applied.stderr
    assert_enrolled(await g.kube.get(k.TRAINJOBS, "plain"), "plain")
    assert await release(g, "plain") == 1
    await until(lambda: is_running(g.kube, "plain"), what="plain running as A=1")
    assert_execution(running_pods(await pods_of(g.kube, "plain")), 1)

    # a second apply of the same manifest is an update: nothing is enrolled again, nothing changes
    again = kubectl_apply(g, tmp_path, "plain")
    assert again.returncode == 0, again.stderr
    assert (await g.kube.get(k.TRAINJOBS, "plain"))["metadata"]["annotations"][A] == "1"

    # the TrainJob from before the opt-in is left as it was: not dispatch's, and said so
    old = await g.kube.get(k.TRAINJOBS, "before")
    assert LABEL_JOB_ID not in (old["metadata"].get("labels") or {})
    cause = (await g.adapter.inspect("before")).cause
    assert cause is not None and cause.reason == "NotManaged"

    # what `dispatch open` creates there is dispatch's already: left exactly as it is
    await g.adapter.open(JobSpec(job_id="opened", submission="s1"))
    opened = await g.kube.get(k.TRAINJOBS, "opened-s1")
    assert (opened["metadata"]["labels"][LABEL_JOB_ID], opened["metadata"]["labels"][LABEL_SUBMISSION]) == (
        "opened", "s1")
    ours = [p for p in opened["spec"]["runtimePatches"] if p["manager"] == PATCH_MANAGER]
    assert len(ours) == 1
    pod_labels = ours[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["metadata"]["labels"]
    assert (pod_labels[LABEL_JOB_ID], pod_labels[LABEL_SUBMISSION]) == ("opened", "s1")
    assert await release(g, "opened-s1") == 1

    # a bad identity label is refused naming it; nothing is created
    bad = kubectl_apply(g, tmp_path, "badlabel", f"  labels:\n    {LABEL_JOB_ID}: Not_Valid-\n")
    assert bad.returncode != 0
    print("REFUSED:", bad.stderr.strip())
    assert (f"{MUTATING}trainjob badlabel cannot be enrolled in dispatch: metadata.labels[{LABEL_JOB_ID}] "
            "'Not_Valid-' must be empty or consist of alphanumerics") in bad.stderr
    assert await g.kube.get_or_none(k.TRAINJOBS, "badlabel") is None
