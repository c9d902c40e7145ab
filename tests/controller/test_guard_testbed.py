"""The guard on the real control plane: the API server itself refuses an unsafe start.

Each test works in a namespace of its own (the controller harness's: a ClusterQueue and AdmissionCheck of
its own) and installs the guard scoped to that namespace only: the ValidatingWebhookConfiguration and the
CEL policy of ``deploy/base/guard.yaml``, their selectors narrowed to the test's namespace and the webhook
pointed at a ``python -m dispatch.controller --guard-port`` process on this host (which also decides the
namespace's Kueue checks, and publishes its own CA into the configuration's caBundle). Both are removed
afterwards, so other tests on the same testbed never meet them.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, LABEL_JOB_ID, AsyncAdapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch import testbed as tb
from dispatch.controller import _guard as guard_paths
from dispatch.controller import _tls as g_
from dispatch.errors import PodsRemain, Refused
from dispatch.testbed.harness import (
    A,
    as_role,
    check_of,
    controller_env,
    free_port,
    hold_pods,
    is_running,
    pods_of,
    probe_denied,
    release_pods,
    running_pods,
    running_testbed_kubeconfig,
    scoped,
    scoped_mutating,
    subprocess_controller,
    until,
    workload_of,
)

from .test_guard_callers import creates_of, message, post, review

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]
POLICIES = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 namespaced=False, status=False)
BINDINGS = k.Res("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", namespaced=False, status=False)
DENIED = 'admission webhook "guard.dispatch.phpboyscout.uk" denied the request: '


def kubectl(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return tb.kubectl("-n", ns, *args, check=False)


def unsuspend(ns: str, name: str) -> subprocess.CompletedProcess[str]:
    """What anyone with patch on TrainJobs can type."""
    return kubectl(ns, "patch", "trainjob", name, "--type", "merge", "-p", '{"spec":{"suspend":false}}')


@dataclass
class Guarded:
    kube: k.Kube
    ns: str
    port: int
    webhook: str
    proc: subprocess.Popen[bytes]
    adapter: AsyncAdapter
    """The library as a ``dispatch-writer`` of ``ns`` uses it; ``kube`` is the operator's (the admin's)."""
    metrics_port: int = 0
    """The controller's plain /metrics."""


@pytest.fixture
async def g(testbed_kubeconfig: str, tmp_path: Path) -> AsyncIterator[Guarded]:
    """The guard installed for a fresh namespace of its own, removed afterwards."""
    async with guard_on(tmp_path) as got:
        yield got


@asynccontextmanager
async def guard_on(tmp: Path) -> AsyncIterator[Guarded]:
    path = running_testbed_kubeconfig()
    if path is None:
        pytest.skip("the testbed is not up (python -m dispatch.testbed up)")
    async with controller_env(path) as (kube, ns, _), installed(kube, ns, tmp) as got:
        yield got


@asynccontextmanager
async def installed(kube: k.Kube, ns: str, tmp: Path, *, kubeconfig_path: Path | None = None,
                    publish: bool = True, enrolment: bool = False) -> AsyncIterator[Guarded]:
    """The guard for ``ns``: its configuration and policy, and a controller serving it. ``publish=False``:
    the test puts the CA into the caBundle itself (the controller is not allowed to). ``enrolment``: also
    enrolment's mutating webhook (same name; the controller publishes its CA there too), which acts once
    the test labels ``ns`` with the opt-in label."""
    port, name = free_port(), f"dispatch-guard-{ns}"
    hook, policy, binding = scoped(ns, port, name)
    mutating = scoped_mutating(ns, port, name)
    if not publish:
        ca = g_.generate_certs(tmp / "certs", ["localhost", "127.0.0.1"]).ca_pem
        assert ca is not None
        for w in [*hook["webhooks"], *mutating["webhooks"]]:
            w["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    if enrolment:
        await kube.create(api.MUTATING_WEBHOOKS, mutating)
    await kube.create(api.VALIDATING_WEBHOOKS, hook)
    await kube.create(POLICIES, policy)
    await kube.create(BINDINGS, binding)
    try:
        async with subprocess_controller(ns, "--guard-port", str(port), "--guard-cert-dir", str(tmp / "certs"),
                                         "--guard-webhook", name if publish else "", log=tmp / "controller.log",
                                         kubeconfig_path=kubeconfig_path) as proc, as_role(kube, ns) as writer:
            async def published() -> bool:
                got = await kube.get(api.VALIDATING_WEBHOOKS, name)
                mutating = [await kube.get(api.MUTATING_WEBHOOKS, name)] if enrolment else []
                return all(w["clientConfig"].get("caBundle") for c in (got, *mutating) for w in c["webhooks"])
            await until(published, what="the guard's CA in the caBundle")
            await until(lambda: probe_denied(kube, ns), what="the guard answering")
            yield Guarded(kube, ns, port, name, proc.proc, AsyncAdapter(writer), proc.port)
    finally:
        await kube.delete(BINDINGS, name)
        await kube.delete(POLICIES, name)
        await kube.delete(api.VALIDATING_WEBHOOKS, name)
        if enrolment:
            await kube.delete(api.MUTATING_WEBHOOKS, name)


async def release(g: Guarded, name: str) -> int:
    """``dispatch release``, again while the Job controller has not yet confirmed the fresh Jobs' suspension
    (release refuses then, naming the Job)."""
    for _ in range(100):
        try:
            return (await g.adapter.release(name)).admission
        except PodsRemain as exc:
            if exc.remaining:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError(f"{name}: its Jobs never confirmed their suspension")


async def held_with_terminating_pod(g: Guarded, job_id: str) -> tuple[str, list[str]]:
    """A plain-mode object that ran as A=1, held, its pod kept Terminating."""
    name = f"{job_id}-s1"
    await g.adapter.open(JobSpec(job_id=job_id, submission="s1"))
    await release(g, name)
    await until(lambda: is_running(g.kube, name), what=f"{name} running")
    pods = await hold_pods(g.kube, name)
    await g.adapter.hold(name)

    async def terminating() -> bool:
        got = await pods_of(g.kube, name)
        return bool(got) and all(p["metadata"].get("deletionTimestamp") for p in got)
    await until(terminating, what="the old pod Terminating")
    return name, pods


async def gone(g: Guarded, pods: list[str]) -> None:
    await release_pods(g.kube, pods)

    async def no_pods() -> bool:
        names = {p["metadata"]["name"] for p in (await g.kube.list(k.PODS)).items}
        return not names & set(pods)
    await until(no_pods, what="the old pods gone")


# ---------------------------------------------------------------- plain mode


async def test_a_bare_unsuspend_is_refused_while_the_pod_terminates_and_after_without_a_new_a(g: Guarded) -> None:
    name, pods = await held_with_terminating_pod(g, "bare")
    node = (await g.kube.get(k.PODS, pods[0]))["spec"]["nodeName"]
    denied = unsuspend(g.ns, name)
    assert denied.returncode != 0
    print("DENIED (pod terminating):", denied.stderr.strip())
    assert (f"{DENIED}trainjob {name} cannot start: remaining pods: {pods[0]} on {node} (Ready=True)"
            in denied.stderr)
    tj = await g.kube.get(k.TRAINJOBS, name)
    assert tj["spec"]["suspend"] is True

    await gone(g, pods)
    again = unsuspend(g.ns, name)
    print("DENIED (pod gone, A not armed):", again.stderr.strip())
    assert again.returncode != 0
    assert (f"{DENIED}trainjob {name} cannot start: A=1 has already started (annotation "
            "dispatch.phpboyscout.uk/started=1); `dispatch release` issues a new A") in again.stderr
    # a hand-made start mark does not help: A=1 was not issued again
    marked = kubectl(g.ns, "patch", "trainjob", name, "--type", "merge", "-p", json.dumps(
        {"metadata": {"annotations": {"dispatch.phpboyscout.uk/started": "1"}}, "spec": {"suspend": False}}))
    assert marked.returncode != 0 and "A=1 has already started" in marked.stderr

    assert await release(g, name) == 2
    await until(lambda: is_running(g.kube, name), what="running as A=2")
    assert [p["metadata"]["labels"][A] for p in running_pods(await pods_of(g.kube, name))] == ["2"]


async def test_a_review_made_up_by_another_caller_learns_no_pod_or_node_and_the_api_servers_names_them(
        g: Guarded, tmp_path: Path) -> None:
    """Reviews POSTed to the guard's port by a caller that is not the API server (issue 35 item 8), over the
    real reads: an update whose old object is not the stored TrainJob and a pod create no Job of the submission
    controls are refused naming no pod or Node; the API server's own review of ``kubectl patch`` names them, and
    so does a pod create owned by the submission's real Job (its identity labels as JobSet gives them)."""
    name, pods = await held_with_terminating_pod(g, "echo")
    pod = await g.kube.get(k.PODS, pods[0])
    node = str(pod["spec"]["nodeName"])
    stored = await g.kube.get(k.TRAINJOBS, name)
    made_up_old = copy.deepcopy(stored)
    made_up_old["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    made_up_start = copy.deepcopy(made_up_old)
    made_up_start["spec"]["suspend"] = False
    by_job, no_owner, other_owner = creates_of(pod)

    ca = tmp_path / "certs" / "ca.crt"  # the guard process's own CA (its --guard-cert-dir)
    [(_, made_up)] = await post(g.port, ca, [review("UPDATE", made_up_start, made_up_old, namespace=g.ns)])
    answers = await post(g.port, ca, [review("CREATE", o, namespace=g.ns) for o in (no_owner, other_owner, by_job)],
                         path=guard_paths.POD_PATH)
    (_, ownerless), (_, foreign), (_, owned) = answers
    for answer in (made_up, ownerless, foreign):
        said = message(answer)
        print("MADE UP:", said)
        assert pods[0] not in said and f" on {node}" not in said and "Ready=" not in said, said
        assert "the guard names what stands in the way only in a review of a stored object's write" in said
    print("OWNED BY THE JOB:", message(owned))
    assert f"may still run: remaining pods: {pods[0]} on {node}" in message(owned)
    denied = unsuspend(g.ns, name)
    assert denied.returncode != 0
    assert f"{DENIED}trainjob {name} cannot start: remaining pods: {pods[0]} on {node}" in denied.stderr
    await gone(g, pods)


async def test_identity_cannot_be_lowered_removed_or_forged(g: Guarded) -> None:
    await g.adapter.open(JobSpec(job_id="ident", submission="s1"))
    await release(g, "ident-s1")
    await until(lambda: is_running(g.kube, "ident-s1"), what="running")
    lowered = kubectl(g.ns, "annotate", "--overwrite", "trainjob", "ident-s1", f"{ANNOTATION_ADMISSION}=0")
    print("DENIED (lower A):", lowered.stderr.strip())
    assert lowered.returncode != 0
    assert "annotation dispatch.phpboyscout.uk/admission only rises; it is never lowered or removed" \
        in lowered.stderr
    removed = kubectl(g.ns, "label", "trainjob", "ident-s1", "dispatch.phpboyscout.uk/job-id-")
    assert removed.returncode != 0 and "identity labels" in removed.stderr
    forged = kubectl(g.ns, "annotate", "--overwrite", "trainjob", "ident-s1",
                     "dispatch.phpboyscout.uk/admission-token=forged")
    print("DENIED (forge token):", forged.stderr.strip())
    assert forged.returncode != 0
    assert (f"{DENIED}trainjob ident-s1: annotation dispatch.phpboyscout.uk/admission-token changes only "
            "with a raise of dispatch.phpboyscout.uk/admission (A stays 1)") in forged.stderr
    dropped = kubectl(g.ns, "patch", "trainjob", "ident-s1", "--type", "json", "-p",
                      '[{"op":"remove","path":"/spec/runtimePatches/0/trainingRuntimeSpec"}]')
    assert dropped.returncode != 0
    tj = await g.kube.get(k.TRAINJOBS, "ident-s1")
    assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "1"
    assert LABEL_JOB_ID in tj["metadata"]["labels"]
    # writes that start nothing and keep the identity pass
    noted = kubectl(g.ns, "annotate", "trainjob", "ident-s1", "team=vision")
    assert noted.returncode == 0, noted.stderr


async def test_a_trainjob_without_dispatch_labels_is_untouched(g: Guarded) -> None:
    body = {"apiVersion": api.TRAINJOBS.api_version, "kind": "TrainJob",
            "metadata": {"name": "plain", "namespace": g.ns},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}}
    await g.kube.create(api.TRAINJOBS, body)
    started = unsuspend(g.ns, "plain")
    assert started.returncode == 0, started.stderr
    assert (await g.kube.get(k.TRAINJOBS, "plain"))["spec"]["suspend"] is False


async def test_with_the_guard_down_nothing_starts_and_other_writes_pass(g: Guarded) -> None:
    name, pods = await held_with_terminating_pod(g, "down")
    await gone(g, pods)
    await g.adapter.open(JobSpec(job_id="run", submission="s1"))
    await release(g, "run-s1")
    g.proc.terminate()
    g.proc.wait(10)
    denied = unsuspend(g.ns, name)
    print("DENIED (guard down):", denied.stderr.strip())
    assert denied.returncode != 0 and 'failed calling webhook "guard.dispatch.phpboyscout.uk"' in denied.stderr
    refused = await _refused(g.adapter.release(name))
    assert 'failed calling webhook "guard.dispatch.phpboyscout.uk"' in refused
    assert (await g.kube.get(k.TRAINJOBS, name))["spec"]["suspend"] is True
    noted = kubectl(g.ns, "annotate", "trainjob", name, "team=vision")
    assert noted.returncode == 0, noted.stderr
    await g.adapter.hold("run-s1")  # a hold starts nothing: it passes with the guard down
    assert (await g.kube.get(k.TRAINJOBS, "run-s1"))["spec"]["suspend"] is True


async def _refused(call: Any) -> str:
    try:
        await call
    except Exception as exc:
        return str(exc)
    raise AssertionError("the write was not refused")


# ---------------------------------------------------------------- Kueue mode


async def test_kueue_preemption_readmits_through_the_guard_and_a_bare_unsuspend_is_refused(g: Guarded) -> None:
    kube, adapter = g.kube, g.adapter
    await adapter.open(JobSpec(job_id="low", submission="s1", queue="lq", priority_class="ctl-low",
                               resources_per_node={"cpu": "3"}))
    await until(lambda: is_running(kube, "low-s1"), what="low running (Kueue's unsuspend passed the guard)")
    old = await hold_pods(kube, "low-s1")
    await adapter.open(JobSpec(job_id="high", submission="s1", queue="lq", priority_class="ctl-high",
                               resources_per_node={"cpu": "3"}))
    await until(lambda: is_running(kube, "high-s1"), what="high running")
    await adapter.close("high-s1")

    async def waiting() -> bool:
        return bool(check_of(await workload_of(kube, "low-s1")).get("message", "").startswith(
            f"waiting for pods of the previous execution to go: {old[0]} on "))
    await until(waiting, what="the check waiting for the old pod")
    denied = unsuspend(g.ns, "low-s1")
    print("DENIED (Kueue mode, pod terminating):", denied.stderr.strip())
    assert denied.returncode != 0
    assert f"{DENIED}trainjob low-s1 cannot start: remaining pods: {old[0]} on " in denied.stderr
    await release_pods(kube, old)
    await until(lambda: is_running(kube, "low-s1"), what="low running again")
    pods = running_pods(await pods_of(kube, "low-s1"))
    assert [p["metadata"]["labels"][A] for p in pods] == ["2"]
    assert (await kube.get(k.TRAINJOBS, "low-s1"))["metadata"]["annotations"][ANNOTATION_ADMISSION] == "2"


async def test_a_writer_cannot_make_a_kueue_object_a_multikueue_copy_and_kueue_does_not_restart_its_a(
        g: Guarded, tmp_path: Path) -> None:
    """Issue 35 item 3 on the real API server, CEL policy, guard and Kueue: a ``dispatch-writer``'s MultiKueue
    marks on a running Kueue-mode object are refused (the guard here is no MultiKueue worker anyway); the
    writer's own suspend goes through, the real Kueue then unsuspends the object whose Workload is still
    admitted, and the guard refuses that restart of the same A."""
    name = "mkc-s1"
    await g.adapter.open(JobSpec(job_id="mkc", submission="s1", queue="lq"))
    await until(lambda: is_running(g.kube, name), what="running as A=1")
    wl = await workload_of(g.kube, name)
    assert wl is not None
    writer = g.adapter.core.kube
    marks = {"kueue.x-k8s.io/multikueue-origin": "multikueue",
             "kueue.x-k8s.io/prebuilt-workload-name": wl["metadata"]["name"]}
    with pytest.raises(Refused) as refused:
        await writer.merge_patch(k.TRAINJOBS, name, {"metadata": {"labels": marks}})
    print("REFUSED (the marks):", refused.value)
    assert "MultiKueue marks kueue.x-k8s.io/multikueue-origin and kueue.x-k8s.io/prebuilt-workload-name" in str(
        refused.value)
    pods = await hold_pods(g.kube, name)
    await writer.merge_patch(k.TRAINJOBS, name, {"spec": {"suspend": True}})
    await gone(g, pods)
    log = tmp_path / "controller.log"
    await until(lambda: "was not raised for this admission" in log.read_text(errors="replace"), timeout=120,
                what="the real Kueue's restart of the same A refused by the guard")
    print("DENIED (Kueue's restart):", next(line for line in log.read_text(errors="replace").splitlines()
                                             if "was not raised for this admission" in line))
    tj = await g.kube.get(k.TRAINJOBS, name)
    assert tj["spec"]["suspend"] is True
    assert running_pods(await pods_of(g.kube, name)) == []


async def test_only_a_holder_of_the_copy_permission_creates_a_dispatch_trainjob_with_multikueues_origin(
        g: Guarded) -> None:
    """Issue 35 item 3: the real API server's ``dispatch-identity`` policy asks its authorizer whether the requester
    may ``create`` ``multikueuecopies``: the shipped writer may not; the cluster's admin (every verb on every
    resource, as MultiKueue's identity holds this one through deploy/worker) may."""
    from dispatch._records import JobSpec as Spec
    from dispatch._trainer import trainjob_body

    body = trainjob_body(Spec(job_id="mkcopy", submission="s1"), "mkcopy-s1", g.ns, ["node"])
    body["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] = "multikueue"
    with pytest.raises(Refused) as refused:
        await g.adapter.core.kube.create(k.TRAINJOBS, body)
    print("REFUSED (a writer's copy):", refused.value)
    assert "only the identity MultiKueue writes this worker with creates one" in str(refused.value)
    made = await g.kube.create(k.TRAINJOBS, body)
    assert made["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "multikueue"


async def test_a_nonindexed_job_with_two_pods_is_refused_at_open_and_at_its_start(g: Guarded) -> None:
    """Issue 35 item 6 on the real Trainer, JobSet, Job controller and guard: a runtime whose node Job is
    NonIndexed, with numNodes 2. ``open`` refuses it naming the replicatedJob and fields; a TrainJob made on it
    anyway (by the cluster's admin, as ``open`` would have made it) gets Jobs Trainer sized to numNodes and JobSet
    left NonIndexed, and both ``release`` and a bare unsuspend are refused naming them."""
    from dispatch import InvalidInput
    from dispatch._records import JobSpec as Spec
    from dispatch._trainer import runtime_jobs, trainjob_body

    kube, ns = g.kube, g.ns
    base = await kube.get(k.CLUSTER_RUNTIMES, "torch-distributed")
    name = f"bag-{ns}"[:63]
    runtime = {"apiVersion": base["apiVersion"], "kind": base["kind"], "metadata": {"name": name},
               "spec": base["spec"]}
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if rj["name"] == "node":
            rj["template"].setdefault("spec", {})["completionMode"] = "NonIndexed"
    await kube.create(k.CLUSTER_RUNTIMES, runtime)
    try:
        spec = Spec(job_id="bag", submission="s1", num_nodes=2, runtime=name)
        with pytest.raises(InvalidInput) as refused:
            await g.adapter.open(spec)
        print("REFUSED (open):", refused.value)
        fields = "replicatedJob node (completionMode: NonIndexed, parallelism 2)"
        assert f"ClusterTrainingRuntime {name}: {fields}" in str(refused.value)
        await kube.create(k.TRAINJOBS, trainjob_body(spec, "bag-s1", ns, runtime_jobs(runtime)))

        async def built() -> bool:
            return bool((await kube.list(k.JOBS, labels="jobset.sigs.k8s.io/jobset-name=bag-s1")).items)
        await until(built, what="Trainer's JobSet and its Job")
        [job] = (await kube.list(k.JOBS, labels="jobset.sigs.k8s.io/jobset-name=bag-s1")).items
        print("JOB SPEC:", {key: job["spec"].get(key) for key in ("completionMode", "parallelism", "completions")})
        assert (job["spec"]["completionMode"], job["spec"]["parallelism"]) == ("NonIndexed", 2), job["spec"]
        with pytest.raises(Refused) as start:
            await g.adapter.release("bag-s1")
        print("REFUSED (release):", start.value)
        assert f"trainjob bag-s1 cannot start: {fields}" in str(start.value)
        denied = unsuspend(ns, "bag-s1")
        print("DENIED (bare unsuspend):", denied.stderr.strip())
        assert denied.returncode != 0 and f"{DENIED}trainjob bag-s1 cannot start: {fields}" in denied.stderr
    finally:
        await kube.delete(k.CLUSTER_RUNTIMES, name)


async def test_kueue_held_object_cannot_be_started_by_hand(g: Guarded) -> None:
    await g.adapter.open(JobSpec(job_id="kh", submission="s1", queue="lq"))
    await until(lambda: is_running(g.kube, "kh-s1"), what="running")
    pods = await hold_pods(g.kube, "kh-s1")
    await g.adapter.hold("kh-s1")
    await gone(g, pods)
    denied = unsuspend(g.ns, "kh-s1")
    print("DENIED (Kueue mode, held, pod gone):", denied.stderr.strip())
    assert denied.returncode != 0
    wl = await workload_of(g.kube, "kh-s1")
    assert wl is not None
    assert (f"{DENIED}trainjob kh-s1 cannot start: Kueue manages it and has not admitted workload "
            f"{wl['metadata']['name']}") in denied.stderr
    await g.adapter.release("kh-s1")
    await until(lambda: is_running(g.kube, "kh-s1"), what="running again as A=2")
    assert [p["metadata"]["labels"][A] for p in running_pods(await pods_of(g.kube, "kh-s1"))] == ["2"]



async def test_two_replicas_each_keep_their_ca_in_the_bundle_and_either_one_answers(
        testbed_kubeconfig: str, tmp_path: Path) -> None:
    """The Deployment runs two replicas, each with a CA of its own in an emptyDir: both CAs must stay in
    the caBundle, so the API server trusts whichever replica the Service picks, and with one replica
    gone the other still answers (on the testbed the webhook's URL stands in for the Service)."""
    path = running_testbed_kubeconfig()
    if path is None:
        pytest.skip("the testbed is not up (python -m dispatch.testbed up)")
    async with controller_env(path) as (kube, ns, _):
        ports = (free_port(), free_port())
        name = f"dispatch-guard-{ns}"
        hook, _, _ = scoped(ns, ports[0], name)
        await kube.create(api.VALIDATING_WEBHOOKS, hook)

        async def point_at(port: int) -> None:
            got = await kube.get(api.VALIDATING_WEBHOOKS, name)
            for w in got["webhooks"]:
                w["clientConfig"]["url"] = f"https://127.0.0.1:{port}/validate-trainjob"
            await kube.replace(api.VALIDATING_WEBHOOKS, name, got)

        def replica(i: int) -> Any:
            return subprocess_controller(ns, "--guard-port", str(ports[i]), "--guard-cert-dir",
                                         str(tmp_path / f"certs-{i}"), "--guard-webhook", name,
                                         log=tmp_path / f"replica-{i}.log")
        try:
            async with replica(0) as first, replica(1) as second:
                cas = [tmp_path / f"certs-{i}" / "ca.crt" for i in (0, 1)]

                def logs() -> str:
                    out = []
                    for i, r in enumerate((first, second)):
                        state = "running" if r.proc.poll() is None else f"ended {r.proc.returncode}"
                        tail = (tmp_path / f"replica-{i}.log").read_text(errors="replace")[-3000:]
                        out.append(f"replica {i} ({state}), its log's end:\n{tail}")
                    return "\n".join(out)

                def made() -> bool:
                    if any(r.proc.poll() is not None for r in (first, second)):  # it will never make its CA
                        raise AssertionError(f"a replica ended before its CA was made:\n{logs()}")
                    return all(p.is_file() for p in cas)
                try:
                    await until(made, timeout=120, what="both replicas' CAs")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{logs()}") from None

                async def both_trusted() -> bool:
                    got = await kube.get(api.VALIDATING_WEBHOOKS, name)
                    return all(all(p.read_bytes().strip() in base64.b64decode(
                        w["clientConfig"].get("caBundle") or "") for p in cas) for w in got["webhooks"])
                await until(both_trusted, timeout=60, what="both CAs in the caBundle")
                await until(lambda: probe_denied(kube, ns), what="replica 0 answering")
                await point_at(ports[1])
                await until(lambda: probe_denied(kube, ns), what="replica 1 answering, trusted")
                first.proc.terminate()
                first.proc.wait(10)
                assert await probe_denied(kube, ns)          # the other replica alone still guards
                assert await both_trusted()                    # and a stopped replica's CA is not pruned
        finally:
            await kube.delete(api.VALIDATING_WEBHOOKS, name)


async def test_the_real_controller_exports_controller_runtimes_series_after_a_reconcile_and_real_reviews(
        g: Guarded) -> None:
    """Issue 38 item 10, as an operator's Prometheus meets it: the controller as the Deployment runs it, its
    Workload decided through the real Kueue and its guard called by the real API server; one scrape of its
    /metrics carries the series stock controller-runtime dashboards read, with their labels."""
    import httpx2
    from prometheus_client.parser import text_string_to_metric_families

    await g.adapter.open(JobSpec(job_id="scrape", submission="s1", queue="lq"))

    async def admitted() -> bool:
        return bool(running_pods(await pods_of(g.kube, "scrape-s1")))
    await until(admitted, timeout=120, what="the object admitted through the check and running")
    async with httpx2.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{g.metrics_port}/metrics")).raise_for_status().text
    got: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            got.setdefault(sample.name, []).append((dict(sample.labels), sample.value))

    def value(series: str, **labels: str) -> float:
        return sum(v for have, v in got.get(series, []) if labels.items() <= have.items())
    assert value("controller_runtime_reconcile_total", controller="workloads", result="success") >= 1
    assert value("controller_runtime_reconcile_time_seconds_count", controller="workloads") >= 1
    assert {s["controller"] for s, _ in got["controller_runtime_active_workers"]} == {"workloads", "pod-finalizers"}
    # the API server called the guard for the release's start (and the probes): answered 200 each time
    assert value("controller_runtime_webhook_requests_total", code="200") >= 1
    assert value("controller_runtime_webhook_latency_seconds_count") >= 1
    for series in ("workqueue_unfinished_work_seconds", "workqueue_longest_running_processor_seconds"):
        assert {s["name"] for s, _ in got[series]} >= {"workloads", "pod-finalizers"}, series
    assert {tuple(sorted(s)) for s, _ in got["rest_client_requests_total"]} == {("code", "host", "method")}
    assert value("rest_client_requests_total", code="200", method="PATCH") >= 1
