"""``admin release-pod``'s decision, every branch: which proof releases a pod, and each refusal's words."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER
from dispatch import _decision as d
from dispatch._views import NodeView, PodView


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


def marked(*, mark_at: str | None, finished_at: str | None, sandbox_at: str | None = None) -> PodView:
    """train-0 under OnFailure, its container's last report an exit 1, marked Failed by Kueue's failure
    recovery at ``mark_at``; ``finished_at`` and ``sandbox_at`` are its kubelet's later reports."""
    terminated: dict[str, Any] = {"exitCode": 1, **({"finishedAt": finished_at} if finished_at else {})}
    conds: list[dict[str, Any]] = [{"type": "KueueFailureRecovery", "status": "True",
                                    "reason": "KueueForcefullyDeleted",
                                    **({"lastTransitionTime": mark_at} if mark_at else {})}]
    if sandbox_at:
        conds.append({"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": sandbox_at})
    return PodView.from_obj({
        "metadata": {"name": "train-0", "uid": "u", "finalizers": [POD_FINALIZER]},
        "spec": {"nodeName": "n", "restartPolicy": "OnFailure", "containers": [{"name": "node", "image": "x"}]},
        "status": {"phase": "Failed", "conditions": conds,
                   "containerStatuses": [{"name": "node", "state": {"terminated": terminated}}]},
    })


BACK = NodeView.from_obj({"metadata": {"name": "n"}, "status": {"conditions": [
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T08:10:30Z"}]}})


@pytest.mark.parametrize(("pod", "node", "reason"), [
    # its last report predates the mark: the kubelet has not learned the Failed and may restart the container
    (marked(mark_at="2026-12-02T08:10:20Z", finished_at="2026-12-02T08:10:05Z"), BACK, "KubeletNotReported"),
    # it stopped the container (or tore the sandbox down) after the mark: it has learned the phase
    (marked(mark_at="2026-12-02T08:10:20Z", finished_at="2026-12-02T08:10:31Z"), BACK, None),
    (marked(mark_at="2026-12-02T08:10:20Z", finished_at="2026-12-02T08:10:05Z",
            sandbox_at="2026-12-02T08:10:32Z"), BACK, None),
    # a mark without a time: the node's return is the line instead
    (marked(mark_at=None, finished_at="2026-12-02T08:10:25Z"), BACK, "KubeletNotReported"),
    (marked(mark_at=None, finished_at="2026-12-02T08:10:30Z"), BACK, None),
    # no time known at all: nothing proves the kubelet learned it
    (marked(mark_at=None, finished_at=None), UP, "KubeletNotReported"),
    (marked(mark_at="2026-12-02T08:10:20Z", finished_at=None), BACK, "KubeletNotReported"),
    # a malformed time is no time
    (marked(mark_at="yesterday", finished_at="2026-12-02T08:10:31"), BACK, "KubeletNotReported"),
])
def test_the_operators_word_that_the_process_is_gone_waits_for_the_kubelets_report_after_the_mark(
        pod: PodView, node: NodeView, reason: str | None) -> None:
    proof, refusal = d.release_pod_proof(pod, node, node_confirmed_down=False, process_gone=True)
    assert (refusal[1] if refusal else None) == reason, refusal
    assert proof == ("" if reason else d.OPERATOR_CONFIRMED)
    if refusal:
        assert "has not reported pod train-0 since it was marked Failed" in refusal[0]
        assert "--node-confirmed-down" in refusal[0]
