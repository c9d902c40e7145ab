"""``admin release-pod``'s decision, every branch: which proof releases a pod, and each refusal's words."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER
from dispatch import _decision as d
from dispatch._names import ANNOTATION_MARK_SEEN
from dispatch._views import NodeView, PodView, kubelet_fingerprint


def view(*, ours: bool = True, phase: str = "Running", node: str | None = "n") -> PodView:
    """Pod train-0 of llama/s1 as its kubelet reports it (containers terminated once it ended)."""
    state: dict[str, Any] = {"terminated": {"exitCode": 1}} if phase in ("Succeeded", "Failed") else {"running": {}}
    return PodView.from_obj({
        "metadata": {"name": "train-0", "uid": "uid-train-0", "finalizers": [POD_FINALIZER] if ours else [],
                     "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}},
        "spec": {**({"nodeName": node} if node else {}), "containers": [{"name": "node", "image": "x.invalid/t"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "node", "state": state}]},
    })


UP = NodeView("n", ready="True")
SILENT = NodeView("n", ready="Unknown")
OOS = NodeView("n", ready="Unknown", out_of_service=True)


@pytest.mark.parametrize(("pod", "node", "confirmed", "proof", "reason"), [
    (view(ours=False), UP, False, "", "NotHeld"),
    (view(ours=False), SILENT, True, "", "NotHeld"),                        # the word never covers a foreign pod
    (view(phase="Failed"), UP, False, "kubelet-confirmed", None),          # the kubelet confirmed its end
    (view(phase="Failed"), UP, True, "kubelet-confirmed", None),
    (view(), NodeView("n", exists=False, ready="Unknown"), False, "node-deleted", None),  # deleted, last silent
    (view(), NodeView.gone("n"), False, "", "Unproven"),              # issue 40: a deletion alone proves nothing
    (view(), NodeView("n", exists=False, ready="True"), False, "", "Unproven"),
    (view(), NodeView.gone("n"), True, d.OPERATOR_CONFIRMED, None),         # the operator's word ends it
    (view(), OOS, False, "out-of-service", None),
    (view(), SILENT, False, "", "Unproven"),
    (view(), None, False, "", "Unproven"),                                  # its Node cannot be read
    (view(), SILENT, True, d.OPERATOR_CONFIRMED, None),                     # the operator's word
    (view(), None, True, d.OPERATOR_CONFIRMED, None),
    (view(), UP, True, "", "NodeReady"),                                    # a Ready kubelet will confirm it
    (view(), UP, False, "", "Unproven"),
    (view(node=None), None, False, "", "Unproven"),
])
def test_each_pod_and_node_state(pod: PodView, node: NodeView | None, confirmed: bool, proof: str,
                                 reason: str | None) -> None:
    got, refusal = d.release_pod_proof(pod, node, node_confirmed_down=confirmed)
    assert got == proof
    assert (refusal[1] if refusal else None) == reason


def test_the_refusals_say_why_and_what_to_do() -> None:
    assert d.release_pod_proof(view(ours=False), UP, node_confirmed_down=False)[1] == (
        f"pod train-0 does not carry dispatch's finalizer {POD_FINALIZER}; nothing to release", "NotHeld")
    message, _ = d.release_pod_proof(view(), SILENT, node_confirmed_down=False)[1] or ("", "")
    assert message == ("pod train-0's end is unproven: its kubelet has not confirmed it and node n is Ready=Unknown; "
                       "once n is confirmed shut down, pass --node-confirmed-down (or taint the node "
                       "node.kubernetes.io/out-of-service)")
    message, _ = d.release_pod_proof(view(node=None), None, node_confirmed_down=False)[1] or ("", "")
    assert "it has no node and is not being deleted; once its node is confirmed shut down" in message
    assert d.release_pod_proof(view(), UP, node_confirmed_down=True)[1] == (
        "node n is Ready=True: its kubelet is answering and will confirm pod train-0's end itself; it is not down",
        "NodeReady")


def marked(**kw: Any) -> PodView:
    return PodView.from_obj(marked_obj(**kw))


def marked_obj(*, finished_at: str = "2026-12-02T08:10:05Z", sandbox: str | None = None, ready: str = "False",
           rv: str = "12", seen: str | None = None, seen_from: dict[str, Any] | None = None,
           mark_at: str = "2026-12-02T08:10:20Z", sidecar: str | None = None,
           debug: str | None = None) -> dict[str, Any]:
    """train-0 under OnFailure, its container's last report an exit 1 (``finished_at``, the node's clock),
    marked Failed by Kueue's failure recovery at ``mark_at`` (the control plane's clock), read at resourceVersion
    ``rv``. ``seen`` is dispatch's record as written; ``seen_from`` writes a record at resourceVersion 10 of the
    pod as it then was (those keyword arguments), so a change of the kubelet's fields since shows."""
    terminated: dict[str, Any] = {"exitCode": 1, "finishedAt": finished_at}
    conds: list[dict[str, Any]] = [{"type": "KueueFailureRecovery", "status": "True",
                                    "reason": "KueueForcefullyDeleted", "lastTransitionTime": mark_at},
                                   {"type": "Ready", "status": ready, "lastTransitionTime": "2026-12-02T08:10:21Z"}]
    if sandbox:
        conds.append({"type": "PodReadyToStartContainers", "status": sandbox,
                      "lastTransitionTime": "2026-12-02T08:00:00Z"})
    if seen_from is not None:
        seen = f"10/{kubelet_fingerprint(marked_obj(**seen_from)['status'])}"
    spec: dict[str, Any] = {"nodeName": "n", "restartPolicy": "OnFailure",
                            "containers": [{"name": "node", "image": "x"}]}
    status: dict[str, Any] = {"phase": "Failed", "conditions": conds,
                              "containerStatuses": [{"name": "node", "state": {"terminated": terminated}}]}
    if sidecar:
        spec["initContainers"] = [{"name": "proxy", "image": "x", "restartPolicy": "Always"}]
        status["initContainerStatuses"] = [{"name": "proxy", "state": {sidecar: {}}}]
    if debug:
        spec["ephemeralContainers"] = [{"name": "debugger", "image": "x"}]
        status["ephemeralContainerStatuses"] = [{"name": "debugger", "state": {debug: {}}}]
    obj = {"metadata": {"name": "train-0", "uid": "u", "finalizers": [POD_FINALIZER], "resourceVersion": rv,
                        "annotations": {ANNOTATION_MARK_SEEN: seen} if seen else {}},
           "spec": spec, "status": status}
    return obj


BACK = NodeView.from_obj({"metadata": {"name": "n"}, "status": {"conditions": [
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T08:10:30Z"}]}})
EARLY, LATE = "2026-12-02T08:10:05Z", "2026-12-02T08:10:31Z"
"""Container end times before and after the mark's 08:10:20 as wall clocks read them; they no longer decide."""


@pytest.mark.parametrize(("pod", "node", "reason"), [
    # no record of when dispatch saw the mark: nothing orders the kubelet's writes after it
    (marked(), BACK, "KubeletNotReported"),
    (marked(finished_at=LATE), BACK, "KubeletNotReported"),  # a node clock ahead made this count before
    # the record, and nothing the kubelet owns changed since: not reported, whatever its clock says
    (marked(seen_from={}), BACK, "KubeletNotReported"),
    (marked(finished_at=LATE, seen_from={"finished_at": LATE}), BACK, "KubeletNotReported"),
    # Ready is not the kubelet's alone (the node lifecycle controller's MarkPodsNotReady writes it)
    (marked(ready="True", seen_from={"ready": "False"}), BACK, "KubeletNotReported"),
    # the kubelet wrote after the record: its container's end, or its sandbox going; a node clock behind
    # (an end time before the mark's) refused this for good before
    (marked(finished_at=EARLY, seen_from={"finished_at": "2026-12-02T08:09:00Z"}), BACK, None),
    (marked(sandbox="False", seen_from={"sandbox": "True"}), BACK, None),
    # a record that names a later resourceVersion than the pod's, or a malformed one, is no record
    (marked(rv="9", seen_from={"sandbox": "True"}, sandbox="False"), BACK, "KubeletNotReported"),
    (marked(seen="10/not-a-digest", sandbox="False"), BACK, "KubeletNotReported"),
    (marked(rv="opaque", seen_from={"sandbox": "True"}, sandbox="False"), BACK, "KubeletNotReported"),
    # a running sidecar or `kubectl debug` container: the pod has not ended
    (marked(sidecar="running", seen_from={"sidecar": "terminated"}), BACK, "Unproven"),
    (marked(debug="running", seen_from={"debug": "waiting"}), BACK, "Unproven"),
    (marked(debug="terminated", seen_from={"debug": "running"}), BACK, None),
    # the node not back: refused whatever was written
    (marked(sandbox="False", seen_from={"sandbox": "True"}), NodeView("n", ready="Unknown"), "NodeNotReady"),
])
def test_the_operators_word_that_the_process_is_gone_waits_for_a_kubelet_write_after_the_mark(
        pod: PodView, node: NodeView, reason: str | None) -> None:
    proof, refusal = d.release_pod_proof(pod, node, node_confirmed_down=False, process_gone=True)
    assert (refusal[1] if refusal else None) == reason, refusal
    assert proof == ("" if reason else d.OPERATOR_CONFIRMED)
    if reason == "KubeletNotReported" and refusal:
        assert "its kubelet has not written pod train-0's status since" in refusal[0]
        assert "run this again once its kubelet has written the pod's status" in refusal[0]
        assert "--node-confirmed-down" in refusal[0]
    if reason == "Unproven" and refusal:
        assert "reported running" in refusal[0]


def test_a_record_is_due_on_first_sight_of_the_mark_and_again_for_one_that_names_a_later_version() -> None:
    assert marked().needs_mark_record
    assert not marked(seen_from={}).needs_mark_record
    assert marked(rv="9", seen_from={}).needs_mark_record
    assert marked(seen="garbage").needs_mark_record
    refusal = d.release_pod_proof(marked(seen_from={}), BACK, node_confirmed_down=False, process_gone=True)[1]
    assert refusal is not None and "since dispatch first saw it marked Failed (resourceVersion 10)" in refusal[0]


def test_process_gone_is_for_a_pod_someone_else_marked() -> None:
    """On a pod no other writer marked the word does not apply: the ordinary refusal says what ends the wait."""
    got, refusal = d.release_pod_proof(view(), UP, node_confirmed_down=False, process_gone=True)
    assert got == "" and refusal is not None and refusal[1] == "Unproven"


def deleted_at(obj: dict[str, Any], when: str, grace: int = 0) -> PodView:
    """``obj`` being deleted, its deletionTimestamp ``when`` (the API server's clock)."""
    obj["metadata"].update(deletionTimestamp=when, deletionGracePeriodSeconds=grace)
    return PodView.from_obj(obj)


def registered(at: str, ready: str = "True") -> NodeView:
    """Node n as a kubelet registered it at ``at`` (its creationTimestamp, the API server's clock)."""
    return NodeView.from_obj({"metadata": {"name": "n", "uid": f"node-{at}", "creationTimestamp": at},
                              "status": {"conditions": [{"type": "Ready", "status": ready}]}})


@pytest.mark.parametrize(("pod", "node", "reason"), [
    # issue 34's campaign stall: the Node deleted under its live kubelet, PodGC's mark, the kubelet's end written
    # before dispatch saw the mark (its controller down), then the kubelet restarted: it registered its Node again
    # after the pod was deleted, so its first view of the pod had the deletion: it never starts a container of it
    (deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z"), registered("2026-12-02T08:11:00Z"), None),
    (deleted_at(marked_obj(), "2026-12-02T08:10:20Z"), registered("2026-12-02T08:11:00Z"), None),  # no record yet
    # registered before the deletion (or at the same second): that kubelet may have viewed the pod running
    (deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z"), registered("2026-12-02T08:10:00Z"),
     "KubeletNotReported"),
    (deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z"), registered("2026-12-02T08:10:20Z"),
     "KubeletNotReported"),
    # a graceful delete's deletionTimestamp is its deadline: a Node registered before it proves nothing
    (deleted_at(marked_obj(seen_from={}), "2026-12-02T08:11:20Z", 60), registered("2026-12-02T08:11:00Z"),
     "KubeletNotReported"),
    # not being deleted: a kubelet's first view of it may be before the mark
    (marked(seen_from={}), registered("2026-12-02T08:11:00Z"), "KubeletNotReported"),
    # the registered Node not answering, or a container of the pod reported running: refused as before
    (deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z"), registered("2026-12-02T08:11:00Z", "Unknown"),
     "NodeNotReady"),
    (deleted_at(marked_obj(seen_from={}, debug="running"), "2026-12-02T08:10:20Z"),
     registered("2026-12-02T08:11:00Z"), "Unproven"),
])
def test_the_word_that_the_process_is_gone_counts_once_its_node_was_registered_after_the_pod_was_deleted(
        pod: PodView, node: NodeView, reason: str | None) -> None:
    proof, refusal = d.release_pod_proof(pod, node, node_confirmed_down=False, process_gone=True)
    assert (refusal[1] if refusal else None) == reason, refusal
    assert proof == ("" if reason else d.OPERATOR_CONFIRMED)
    started = reason != "KubeletNotReported"  # the other refusals are of a Node registered after the deletion
    assert pod.kubelet_started_after_deletion(node) == started


def test_status_names_the_one_word_release_pod_takes_for_a_pod_someone_else_marked() -> None:
    """Issue 34: a rank kept from starting by a pod whose end is not proven says why and the one command that ends
    the wait now, not a list of words some of which are refused."""
    after = deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z")
    assert after.unproven_why(registered("2026-12-02T08:11:00Z")) == (
        "marked Failed by Kueue's failure recovery, not its kubelet, and under restartPolicy OnFailure its kubelet "
        "may still start container node; node n was registered again after the pod was deleted: if it is the machine "
        "that ran the pod, its kubelet started since and never starts a container of it: once the process is gone "
        "there, `dispatch admin release-pod train-0 --process-gone` ends the wait")
    wrote = marked(sandbox="False", seen_from={"sandbox": "True"})
    assert wrote.unproven_why(BACK).endswith(
        "its kubelet has written the pod's status since dispatch first saw the mark: once the process is gone there, "
        "`dispatch admin release-pod train-0 --process-gone` ends the wait")
    silent = deleted_at(marked_obj(seen_from={}), "2026-12-02T08:10:20Z")
    why = silent.unproven_why(registered("2026-12-02T08:10:00Z"))
    assert why.endswith(
        "its kubelet is back but has not written the pod's status since dispatch first saw the mark (resourceVersion "
        "10), so --process-gone is refused until it does (and --node-confirmed-down while the node reports "
        "Ready=True); a kubelet that wrote it before writes nothing more: then shut n down and run "
        "`dispatch admin release-pod train-0 --node-confirmed-down`"), why
    assert "`dispatch admin release-pod train-0 --process-gone`" not in why
    # its kubelet not back: both words, each for its own case, as before
    lost = marked(seen_from={}).unproven_why(NodeView("n", ready="Unknown"))
    assert "once n is confirmed down, taint it node.kubernetes.io/out-of-service or run `dispatch admin release-pod " \
        "train-0 --node-confirmed-down`; once its kubelet is back and the process is gone, run `dispatch admin " \
        "release-pod train-0 --process-gone`" in lost, lost
