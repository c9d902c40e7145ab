"""The fleet's pure parts: the rule over a MultiKueue fleet (``_decision.across``), a MultiKueueCluster as
dispatch reads it (``_fleet.WorkerView``), the operator's confirmation, and a worker's inline kubeconfig
(``_kubeconfig.load_inline``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER
from dispatch import _decision as d
from dispatch._fleet import WORKER_DOWN, WorkerView, confirm_patch, kubeconfig_of
from dispatch._kubeconfig import INLINE_LIMIT, load_inline
from dispatch._records import RemainingPod
from dispatch.errors import Refused

LOST_AT = "2026-01-01T00:10:00Z"


def verdict(*pods: RemainingPod, blockers: tuple[str, ...] = ()) -> d.Verdict:
    return d.Verdict(tuple(pods), blockers)


def running(name: str, node: str = "node-0") -> RemainingPod:
    return RemainingPod(name, node, "Ready=True", "Running", False)


# ------------------------------------------------------------------ across / WorkerVerdict


def test_across_names_each_workers_pods_with_their_worker_and_keeps_the_local_ones() -> None:
    local = verdict(running("here"))
    out = d.across(local, [d.WorkerVerdict("worker-2", verdict(running("p2"))),
                           d.WorkerVerdict("worker-1", verdict(running("p1"), blockers=("jobset x not suspended",)))])
    assert [p.qualified for p in out.remaining] == ["here", "worker-1/p1", "worker-2/p2"]
    assert out.blockers == ("worker worker-1: jobset x not suspended",)
    assert not out.admissible
    assert "worker-1/p1 on node-0" in d.waiting_text(out)


def test_across_admits_when_nothing_remains_anywhere() -> None:
    out = d.across(verdict(), [d.WorkerVerdict("worker-1", verdict()), d.WorkerVerdict("worker-2", verdict())])
    assert out.admissible and out == verdict()


def test_an_unreadable_worker_blocks_and_names_the_action_that_ends_the_wait() -> None:
    out = d.across(verdict(), [d.WorkerVerdict("worker-1", None, "connection refused")])
    assert not out.admissible
    [blocker] = out.blockers
    assert blocker == d.unreadable_text("worker-1", "connection refused")
    assert "worker worker-1 cannot be read (connection refused)" in blocker
    assert "`dispatch admin worker-down worker-1`" in blocker
    assert "`dispatch admin worker-down worker-1`" in d.waiting_text(out)


def test_an_unreadable_worker_confirmed_down_does_not_block() -> None:
    out = d.across(verdict(), [d.WorkerVerdict("worker-1", None, "connection refused", confirmed_down=True)])
    assert out.admissible


def test_a_confirmed_down_flag_on_a_readable_worker_does_not_hide_its_pods() -> None:
    out = d.across(verdict(), [d.WorkerVerdict("worker-1", verdict(running("p")), confirmed_down=True)])
    assert [p.qualified for p in out.remaining] == ["worker-1/p"]


def _remaining(node: d.NodeView) -> RemainingPod:
    """A pod PodGC marked Failed and force-deleted (its containers still said running), which dispatch's
    finalizer keeps in the API."""
    obj = {"metadata": {"name": "p", "uid": "uid-p", "finalizers": [POD_FINALIZER],
                        "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 0,
                        "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}},
           "spec": {"nodeName": "n", "restartPolicy": "OnFailure",
                    "containers": [{"name": "node", "image": "example.invalid/train"}]},
           "status": {"phase": "Failed", "containerStatuses": [{"name": "node", "state": {"running": {}}}],
                      "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}]}}
    [r] = d.remaining([d.PodView.from_obj(obj)], {"n": node})
    return r


def test_a_worker_pod_whose_end_is_proven_does_not_block_though_dispatchs_finalizer_keeps_it() -> None:
    """Found by the fleet machine: PodGC force-deleted a pod of an out-of-service node in a worker; dispatch's
    finalizer keeps it there, and no dispatch controller runs in a worker to remove it, so it blocked for good
    (no action named). Its end is proven, so in a worker it counts no more; here it still waits for the
    controller's finalizer keeper, as before."""
    oos = d.NodeView("n", ready="Unknown", out_of_service=True)
    proven = _remaining(oos)
    assert proven.proven
    assert d.across(verdict(), [d.WorkerVerdict("worker-1", verdict(proven))]).admissible
    assert not d.across(verdict(proven), []).admissible, "a local proven pod waits for the finalizer keeper"


@pytest.mark.parametrize("node", [d.NodeView("n", ready="Unknown"), d.NodeView("n", ready="True", out_of_service=True),
                                  d.NodeView.unreadable("n")])
def test_a_worker_pod_whose_end_is_unproven_blocks(node: d.NodeView) -> None:
    unproven = _remaining(node)
    assert not unproven.proven
    out = d.across(verdict(), [d.WorkerVerdict("worker-1", verdict(unproven))])
    assert [p.qualified for p in out.remaining] == ["worker-1/p"]


# ------------------------------------------------------------------ WorkerView.from_obj


def cluster(source: dict[str, Any] | None = None, *, active: str | None = "True", at: str = LOST_AT,
            confirmed: str = "", nested: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if source is not None:
        spec = {"clusterSource": source} if nested else dict(source)
    meta: dict[str, Any] = {"name": "worker-1", "resourceVersion": "7"}
    if confirmed:
        meta["annotations"] = {WORKER_DOWN: confirmed}
    status: dict[str, Any] = {}
    if active is not None:
        status["conditions"] = [{"type": "Active", "status": active, "reason": "ClientConnectionFailed"
                                 if active == "False" else "Active", "message": "m", "lastTransitionTime": at}]
    return {"metadata": meta, "spec": spec, "status": status}


def test_a_secret_kubeconfig_is_read_and_the_location_type_defaults_to_secret() -> None:
    for source in ({"kubeConfig": {"location": "w1", "locationType": "Secret"}}, {"kubeConfig": {"location": "w1"}}):
        view = WorkerView.from_obj(cluster(source))
        assert (view.name, view.secret, view.unreadable) == ("worker-1", "w1", "")
        assert view.resource_version == "7"


def test_the_v1beta1_shape_without_cluster_source_is_read_too() -> None:
    view = WorkerView.from_obj(cluster({"kubeConfig": {"location": "w1"}}, nested=False))
    assert view.secret == "w1" and not view.unreadable


@pytest.mark.parametrize(("source", "words"), [
    ({"kubeConfig": {"location": "/etc/kueue/w1", "locationType": "Path"}},
     "the file '/etc/kueue/w1' inside Kueue's pod"),
    ({"clusterProfileRef": {"name": "w1"}}, "ClusterProfile"),
    ({}, "names no kubeconfig Secret"),
    ({"kubeConfig": {"locationType": "Secret"}}, "names no kubeconfig Secret"),
    ({"kubeConfig": {"location": "w1", "locationType": "Elsewhere"}}, "names no kubeconfig Secret"),
    (None, "names no kubeconfig Secret"),
])
def test_a_worker_dispatch_cannot_read_says_why_and_has_no_secret(source: dict[str, Any] | None, words: str) -> None:
    view = WorkerView.from_obj(cluster(source))
    assert view.secret == "" and words in view.unreadable


def test_garbage_in_the_object_is_not_trusted() -> None:
    view = WorkerView.from_obj({"metadata": "x", "spec": ["y"], "status": {"conditions": "z"}})
    assert (view.name, view.secret, view.active) == ("", "", "Unknown")
    long = WorkerView.from_obj(cluster({"kubeConfig": {"location": "s" * 400}}))
    assert len(long.secret) == 253


@pytest.mark.parametrize(("active", "lost"), [("True", ""), ("False", LOST_AT), ("Unknown", ""), (None, "")])
def test_the_active_condition_and_when_it_was_lost(active: str | None, lost: str) -> None:
    view = WorkerView.from_obj(cluster({"kubeConfig": {"location": "w1"}}, active=active))
    assert view.active == (active or "Unknown")
    assert view.lost_since == lost
    assert view.kueue_says().startswith(f"Active={active or 'Unknown'}")


def test_a_confirmation_holds_for_the_loss_it_names_and_lapses_otherwise() -> None:
    source = {"kubeConfig": {"location": "w1"}}
    assert WorkerView.from_obj(cluster(source, active="False", confirmed=LOST_AT)).down_confirmed
    # the worker came back (Active=True) or was lost again later: the old confirmation vouches for nothing
    assert not WorkerView.from_obj(cluster(source, active="True", confirmed=LOST_AT)).down_confirmed
    assert not WorkerView.from_obj(cluster(source, active="False", at="2026-01-01T00:20:00Z",
                                           confirmed=LOST_AT)).down_confirmed
    assert not WorkerView.from_obj(cluster(source, active="False")).down_confirmed


def test_only_a_lost_worker_can_be_confirmed_down_and_the_patch_names_the_loss() -> None:
    lost = WorkerView.from_obj(cluster({"kubeConfig": {"location": "w1"}}, active="False"))
    assert confirm_patch(lost) == {"metadata": {"resourceVersion": "7", "annotations": {WORKER_DOWN: LOST_AT}}}
    for active in ("True", "Unknown", None):
        with pytest.raises(Refused, match="only a worker Kueue has lost") as err:
            confirm_patch(WorkerView.from_obj(cluster({"kubeConfig": {"location": "w1"}}, active=active)))
        assert err.value.reason == "WorkerNotLost"


def test_a_workers_secret_must_hold_base64_text_under_kubeconfig() -> None:
    text = "apiVersion: v1\n"
    assert kubeconfig_of({"data": {"kubeconfig": base64.b64encode(text.encode()).decode()}}, "s") == text
    for data in ({}, {"kubeconfig": ""}, {"other": "eA=="}):
        with pytest.raises(Refused, match="has no key 'kubeconfig'"):
            kubeconfig_of({"data": data}, "secret kueue-system/w1")
    for bad in ("not base64!", base64.b64encode(b"\xff\xfe").decode()):
        with pytest.raises(Refused, match="is not base64 UTF-8 text"):
            kubeconfig_of({"data": {"kubeconfig": bad}}, "secret kueue-system/w1")


# ------------------------------------------------------------------ load_inline


def kubeconfig(cluster_extra: dict[str, Any] | None = None, user: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": "https://worker.example.invalid:6443",
                                               **(cluster_extra or {})}}],
        "users": [{"name": "w", "user": user if user is not None else {"token": "t0ken"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "w"}}]})


def test_an_inline_kubeconfig_with_a_token_connects() -> None:
    conn = load_inline(kubeconfig(), "secret kueue-system/w1 (key kubeconfig)")
    assert conn.server == "https://worker.example.invalid:6443"
    assert conn.auth is not None


@pytest.mark.parametrize(("cluster_extra", "user", "key"), [
    ({"certificate-authority": "/etc/ca.crt"}, None, "certificate-authority"),
    (None, {"client-certificate": "/c.crt", "client-key-data": "eA=="}, "client-certificate"),
    (None, {"client-certificate-data": "eA==", "client-key": "/c.key"}, "client-key"),
    (None, {"tokenFile": "/var/run/token"}, "tokenFile"),
    (None, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "sh"}}, "exec"),
    (None, {"auth-provider": {"name": "gcp"}}, "auth-provider"),
])
def test_an_inline_kubeconfig_naming_a_file_or_a_program_is_refused(
        cluster_extra: dict[str, Any] | None, user: dict[str, Any] | None, key: str) -> None:
    with pytest.raises(Refused) as err:
        load_inline(kubeconfig(cluster_extra, user), "secret kueue-system/w1 (key kubeconfig)")
    assert f"sets {key}, which names a file or a program" in err.value.message
    assert "secret kueue-system/w1" in err.value.message and err.value.reason == "BadKubeconfig"


def test_an_inline_kubeconfig_too_large_for_a_secret_is_refused_before_parsing() -> None:
    with pytest.raises(Refused, match="more than a Secret can"):
        load_inline("#" * (INLINE_LIMIT + 1), "secret kueue-system/w1")


@pytest.mark.parametrize(("text", "words"), [
    ("clusters: [unclosed", "is not valid YAML"),
    ("- a\n- b\n", "is a list, not a mapping"),
    ("", "is empty"),
    ("kind: Config\n", "is empty"),
])
def test_an_inline_kubeconfig_that_is_not_one_is_refused(text: str, words: str) -> None:
    with pytest.raises(Refused, match=words):
        load_inline(text, "secret kueue-system/w1")


def _wl(conds: list[tuple[str, str]], *, active: bool = True) -> Any:
    from dispatch._kueue import WorkloadView

    return WorkloadView.from_obj({"metadata": {"name": "trainjob-llama-s1-abc", "namespace": "ns", "uid": "w"},
                                  "spec": {"active": active},
                                  "status": {"conditions": [{"type": t, "status": v} for t, v in conds]}})


def _tj(managed_by: str | None) -> Any:
    from dispatch._trainer import TrainJobView

    spec: dict[str, Any] = {"suspend": True}
    if managed_by:
        spec["managedBy"] = managed_by
    return TrainJobView.from_obj({"metadata": {"name": "llama-s1", "namespace": "ns", "uid": "t", "labels": {
        "dispatch.phpboyscout.uk/job-id": "llama", "dispatch.phpboyscout.uk/submission": "s1"}}, "spec": spec})


def test_status_names_the_way_out_of_an_eviction_kueue_cannot_finish_under_multikueue() -> None:
    from dispatch import _decision as d

    stuck = _wl([("QuotaReserved", "True"), ("Evicted", "True")], active=False)
    note = d.workload_note(stuck, _tj("kueue.x-k8s.io/multikueue"))
    assert "Kueue is finishing the eviction of workload trainjob-llama-s1-abc" in note
    assert ("kubectl patch trainjob llama-s1 --subresource=status --type=merge -p "
            "'{\"status\":{\"jobsStatus\":[]}}'") in note
    cause = d.explain(_tj("kueue.x-k8s.io/multikueue"), None, None, note)
    assert (cause.reason, cause.detail) == ("EvictionUnfinished", note)
    # not under MultiKueue, or once the quota is released, the plain notes as before
    assert d.workload_note(stuck, _tj(None)) == "workload deactivated (held); release reactivates it"
    released = _wl([("QuotaReserved", "False"), ("Evicted", "True")], active=False)
    assert d.workload_note(released, _tj("kueue.x-k8s.io/multikueue")) == (
        "workload deactivated (held); release reactivates it")


def test_an_object_raised_for_a_start_kueue_is_about_to_make_is_armed() -> None:
    """Issue 35 item 5: ``admin worker-down`` of a removed worker raises A in each record that remembers it, but
    not under an object Kueue is about to start (its raise at most two spec writes back): the guard would refuse
    that start for good. A stalled object (its A ran: a start and a stop since the raise) is not armed."""
    from dispatch import _decision as d
    from dispatch._identity import RecordView, new_record
    from dispatch._trainer import TrainJobView

    def tj(generation: int, *, suspend: bool = True, a: int = 2) -> TrainJobView:
        return TrainJobView.from_obj({"metadata": {
            "name": "llama-s1", "uid": "u", "generation": generation,
            "labels": {"dispatch.phpboyscout.uk/job-id": "llama", "dispatch.phpboyscout.uk/submission": "s1"},
            "annotations": {"dispatch.phpboyscout.uk/admission": str(a),
                            "dispatch.phpboyscout.uk/admission-token": "wl-uid/5"}}, "spec": {"suspend": suspend}})
    record = RecordView.from_obj(new_record("llama", "s1", "llama-s1", admission=2))
    assert d.armed_for_start(tj(6), record) and d.armed_for_start(tj(7), record)
    assert not d.armed_for_start(tj(9), record)                   # ran since the raise: waiting, not armed
    assert not d.armed_for_start(tj(6, suspend=False), record)    # running
    assert not d.armed_for_start(tj(6, a=1), record)              # the record is ahead already
