"""The campaign's pure parts, without a cluster: the schedule drawn from a seed, the oracles' judgement of
recorded process lines and fence logs, and the shrinker (``dispatch.testbed.campaign``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch import POD_FINALIZER
from dispatch._names import ANNOTATION_MARK_SEEN
from dispatch._views import NodeView, PodView, kubelet_fingerprint
from dispatch.testbed import campaign as c
from dispatch.testbed import oracle

# --------------------------------------------------------------------------------------------- the schedule


def test_one_seed_draws_one_schedule_and_another_seed_another() -> None:
    assert c.generate(7, 40) == c.generate(7, 40)
    assert c.generate(7, 40) != c.generate(8, 40)
    assert c.generate(7, 40).seed == 7


def test_the_schedule_is_written_and_read_back_as_json() -> None:
    s = c.generate(11, 30)
    again = c.Schedule.from_json(json.loads(json.dumps(s.to_json())))
    assert again == s


@pytest.mark.parametrize("bad, words", [
    ({"seed": 1}, "not a campaign's schedule (KeyError"),
    ({"seed": "x", "rounds": []}, "not a campaign's schedule (ValueError"),
    ({"seed": 1, "rounds": [{"pause": 1, "ops": [{"kind": "reboot-the-world"}]}]},
     "the schedule names unknown kinds: reboot-the-world"),
])
def test_a_file_that_is_not_a_schedule_is_refused_naming_what_is_wrong(bad: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError) as err:
        c.Schedule.from_json(bad)
    assert str(err.value).startswith(words)


@pytest.mark.parametrize("seed", range(20))
def test_every_fault_is_healed_later_and_no_two_node_faults_are_in_force_at_once(seed: int) -> None:
    s = c.generate(seed, 60)
    active: set[str] = set()
    for rnd in s.rounds:
        for op in rnd.ops:
            if op.kind == "heal":
                assert op.target in active, f"a heal of {op.target}, which is not in force"
                active.discard(op.target)
            elif op.kind in c.FAULTS and op.kind not in c.SELF_HEALING:
                assert op.kind not in active
                active.add(op.kind)
        assert len(active & c.NODE_FAULTS) <= 1, active
        healed = {op.target for op in rnd.ops if op.kind == "heal"}
        injected = {op.kind for op in rnd.ops if op.kind in c.FAULTS}
        for group in (c.NODE_FAULTS, c.CONTROLLER_FAULTS):
            assert not (healed & group and injected & group), f"a heal and a fault of one group at once: {rnd}"
        assert len(active & c.CONTROLLER_FAULTS) <= 1, active
        assert 1 <= rnd.pause <= 6
    assert not active, f"left in force at the end: {active}"


def test_the_kinds_drawn_are_those_allowed_and_all_of_them_over_a_long_schedule() -> None:
    s = c.generate(3, 400)
    kinds = {op.kind for op in s.ops}
    assert set(c.ACTIONS) | set(c.FAULTS) | {"heal"} == kinds
    only = c.generate(3, 200, faults=["freeze"])
    assert {op.kind for op in only.ops} - set(c.ACTIONS) == {"freeze", "heal"}
    assert not {op.kind for op in c.generate(3, 100, faults=[]).ops} - set(c.ACTIONS)
    for op in s.ops:
        if op.kind in c.ACTIONS:
            assert op.target in (("",) if op.kind == c.NAMESPACE_CYCLE else c.SUBMISSIONS) and op.who in (0, 1)
        if op.kind == "preempt":
            assert op.target == c.PREEMPTOR


@pytest.mark.parametrize("seed", range(20))
def test_a_namespace_cycle_is_drawn_alone_with_no_fault_in_force_and_ends_its_round(seed: int) -> None:
    """A fault in force keeps the namespace's pods (a frozen node, replicas down), so its deletion would wait
    for a heal its own round waits for."""
    s = c.generate(seed, 300)
    active: set[str] = set()
    cycles = 0
    for rnd in s.rounds:
        kinds = [op.kind for op in rnd.ops]
        if c.NAMESPACE_CYCLE in kinds:
            cycles += 1
            assert kinds[-1] == c.NAMESPACE_CYCLE and kinds.count(c.NAMESPACE_CYCLE) == 1, rnd
            assert not active and not {"heal", *c.FAULTS} & set(kinds), (active, rnd)
        for op in rnd.ops:
            if op.kind == "heal":
                active.discard(op.target)
            elif op.kind in c.FAULTS and op.kind not in c.SELF_HEALING:
                active.add(op.kind)
    assert cycles <= 10  # seldom: about once in 180 rounds with every fault kind


def test_the_generator_draws_a_namespace_cycle_and_its_schedule_round_trips() -> None:
    s = next(s for s in (c.generate(seed, 300) for seed in range(50))
             if any(op.kind == c.NAMESPACE_CYCLE for op in s.ops))
    assert c.Schedule.from_json(json.loads(json.dumps(s.to_json()))) == s
    [cycle, *_] = [op for op in s.ops if op.kind == c.NAMESPACE_CYCLE]
    assert str(cycle) == f"namespace_cycle(writer {cycle.who})"
    assert str(c.Op("open", "p0", "b", 1)) == "open(p0 b, writer 1)" and str(c.Op("heal", "freeze")) == "heal(freeze)"


def test_first_puts_an_action_alone_in_round_three_or_the_first_later_round_with_no_fault_in_force() -> None:
    s = c.generate(4, 30, faults=[])
    got = c.with_first(s, c.NAMESPACE_CYCLE)
    assert got.rounds[2] == c.Round((c.Op(c.NAMESPACE_CYCLE),), 5.0)
    assert got.rounds[:2] + got.rounds[3:] == s.rounds
    assert c.Schedule.from_json(json.loads(json.dumps(got.to_json()))) == got
    freeze = c.Round((c.Op("freeze", "node-real"),), 1.0)
    healed = c.Round((c.Op("heal", "freeze"), c.Op("release", "p0")), 1.0)
    busy = c.Schedule(1, (s.rounds[0], freeze, s.rounds[1], healed, s.rounds[2]))
    assert c.with_first(busy, "delete_pod").rounds[4] == c.Round((c.Op("delete_pod", "p0"),), 5.0)
    assert c.with_first(c.Schedule(1, s.rounds[:1]), "preempt").rounds[1].ops == (c.Op("preempt", "kh"),)
    with pytest.raises(ValueError, match="--first takes an action, not 'freeze'"):
        c.with_first(s, "freeze")


def test_the_command_refuses_first_with_a_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert c.main(["--replay", str(tmp_path / "s.json"), "--first", c.NAMESPACE_CYCLE]) == 2
    assert "a replay plays its file as it is" in capsys.readouterr().err
    assert c.main(["--steps", "3", "--first", "reboot"]) == 2
    assert "--first takes an action, not 'reboot'" in capsys.readouterr().err


def test_what_keeps_a_deleted_namespace_is_named_pods_with_their_phase_and_finalizers() -> None:
    ns = {"kind": "Namespace", "metadata": {"name": "ctl-1"}, "status": {"conditions": [
        {"type": "NamespaceContentRemaining", "status": "True", "message": "Some resources are remaining: pods. has 1"},
        {"type": "NamespaceDeletionDiscoveryFailure", "status": "False", "message": "All resources discovered"}]}}
    pod = {"kind": "Pod", "metadata": {"name": "p0-s1-node-0-0", "finalizers": [POD_FINALIZER],
                                        "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}
    jobs = [{"kind": "Job", "metadata": {"name": n}} for n in ("b", "a")]
    got = c.namespace_remains("ctl-1", [ns, pod, *jobs])
    assert got == ("namespace ctl-1: NamespaceContentRemaining: Some resources are remaining: pods. has 1; "
                   "Job a, b; "
                   f"Pod p0-s1-node-0-0 (Running, finalizers {POD_FINALIZER}, deleting)")
    assert c.namespace_remains("ctl-1", []) == "namespace ctl-1: nothing listed remains"


def test_an_unknown_fault_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds: power_cut"):
        c.generate(1, 5, faults=["freeze", "power_cut"])


def test_a_prefix_is_the_rounds_a_campaign_cut_short_played() -> None:
    s = c.generate(5, 20)
    assert s.prefix(4).rounds == s.rounds[:4]


# --------------------------------------------------------------------------------------------- process oracle


def rec(run: str, a: str, event: str, ms: int, *, job: str = "p0", pid: int = 100) -> oracle.Record:
    return oracle.Record(job_id=job, submission="s1", admission=a, pod=f"pod-{run}", pid=pid, pidns="-",
                         start_ticks="-", run=run, seq=ms, ms=ms, event=event)


def life(run: str, a: str, start: int, end: int | None, **kw: str) -> list[oracle.Record]:
    out = [rec(run, a, "START", start, **kw)]  # type: ignore[arg-type]
    out += [rec(run, a, "TICK", t, **kw) for t in range(start + 100, (end or start + 500), 100)]  # type: ignore[arg-type]
    if end is not None:
        out.append(rec(run, a, "EXIT", end, **kw))  # type: ignore[arg-type]
    return out


def judged(records: list[oracle.Record], alive: bool = False) -> c.Judgement:
    return c.judge_processes(records, oracle.processes(records, lambda _: alive))


def test_executions_one_after_another_with_rising_a_are_fine() -> None:
    j = judged(life("r1", "1", 1000, 2000) + life("r2", "2", 2100, 3000) + life("r3", "2", 3100, 4000))
    assert j.counts() == dict.fromkeys(c.Judgement.KINDS, 0)
    assert not j.failed


def test_two_processes_of_one_submission_alive_at_once_are_an_overlap_whatever_their_a() -> None:
    j = judged(life("r1", "1", 1000, 2000) + life("r2", "2", 1500, 3000))
    assert list(j.overlaps) == ["r1+r2"] and "A=1" in j.overlaps["r1+r2"] and "A=2" in j.overlaps["r1+r2"]
    same = judged(life("r1", "3", 1000, 2000) + life("r2", "3", 1900, 3000))
    assert not same.overlaps and list(same.same_a_overlaps) == ["r1+r2"]
    other_job = judged(life("r1", "1", 1000, 2000) + life("r2", "2", 1500, 3000, job="p1"))
    assert not other_job.failed


def test_a_process_without_exit_overlaps_while_it_may_still_run() -> None:
    records = life("r1", "1", 1000, None) + life("r2", "2", 5000, 6000)
    assert not judged(records, alive=False).failed      # gone: it ended at its last line
    j = judged(records, alive=True)
    assert "both may still run" not in j.overlaps["r1+r2"] and "until 6000" in j.overlaps["r1+r2"]


def test_a_lower_a_starting_after_a_higher_one_and_a_process_of_two_as_are_reused_a() -> None:
    j = judged(life("r1", "2", 1000, 2000) + life("r2", "1", 2100, 3000))
    assert list(j.reused_a) == ["back:r2"] and "A went back" in j.reused_a["back:r2"]
    mixed = [*life("r1", "1", 1000, 1500), rec("r1", "2", "TICK", 1600)]
    assert list(judged(mixed).reused_a) == ["many:r1"]
    unset = judged(life("r1", "-", 1000, 1500))
    assert list(unset.reused_a) == ["many:r1"]


# --------------------------------------------------------------------------------------------- fence oracle


def entries(*spec: tuple[str, int]) -> list[c.LogEntry]:
    return [c.LogEntry(seq, kind, a) for seq, (kind, a) in enumerate(spec, 1)]


LOG = entries(("claim", 1), ("commit", 1), ("claim", 2), ("commit", 1), ("commit", 2))


def test_counted_commits_follow_the_fences_rule() -> None:
    assert [e.seq for e in c.counted(LOG)] == [2, 5]


def ev(event: str, a: int, seq: int, *, resume_a: int | None = None, pid: int = 100, ms: int = 1500) -> c.FenceEvent:
    location = f"/checkpoints/p0/s1/data/a-{a:012d}/step-x" if event == "commit" else ""
    return c.FenceEvent(event=event, a=a, pid=pid, ms=ms, seq=seq, step=0, location=location, resume_a=resume_a)


def test_a_commit_told_it_counted_after_a_higher_claim_is_a_stale_commit() -> None:
    logs = {("p0", "s1"): LOG}
    assert not c.judge_fences([ev("commit", 1, 2), ev("commit", 2, 5)], logs, []).failed
    j = c.judge_fences([ev("commit", 1, 4)], logs, [])
    assert list(j.stale_commits) == ["p0/s1:4"] and "after A=2's claim 3" in j.stale_commits["p0/s1:4"]


def test_a_claim_that_resumes_from_a_lower_a_than_the_newest_counted_goes_back() -> None:
    procs = oracle.processes(life("r3", "3", 1000, 2000), lambda _: False)
    log = [*LOG, c.LogEntry(6, "claim", 3)]
    fine = c.judge_fences([ev("claim", 3, 6, resume_a=2)], {("p0", "s1"): log}, procs)
    assert not fine.failed
    back = c.judge_fences([ev("claim", 3, 6, resume_a=1)], {("p0", "s1"): log}, procs)
    assert list(back.resume_back) == ["p0/s1:claim6"]
    nothing = c.judge_fences([ev("claim", 3, 6, resume_a=None)], {("p0", "s1"): log}, procs)
    assert "resumed from nothing" in nothing.resume_back["p0/s1:claim6"]
    # a claim whose process the oracle does not know cannot be placed, and is not judged
    assert not c.judge_fences([ev("claim", 3, 6, resume_a=1, pid=999)], {("p0", "s1"): log}, procs).failed


def test_findings_merge_once_by_key() -> None:
    one = judged(life("r1", "1", 1000, 2000) + life("r2", "2", 1500, 3000))
    total = c.Judgement()
    assert len(total.merge(one)) == 1
    assert total.merge(one) == []
    assert total.counts()["overlaps"] == 1


def test_an_overlap_after_an_out_of_service_taint_on_a_running_process_is_set_apart() -> None:
    [p1, p2] = oracle.processes(life("r1", "1", 1000, 5000) + life("r2", "2", 4000, 6000), lambda _: False)
    assert c.excused_by_taint(p1, p2, [(2000, 3000)])
    assert c.excused_by_taint(p2, p1, [(2000, None)])
    assert not c.excused_by_taint(p1, p2, [(500, 900)])       # a taint before it started
    assert not c.excused_by_taint(p1, p2, [])


# --------------------------------------------------------------------------------------------- shrinking


def test_the_shrinker_finds_the_two_ops_that_fail_together() -> None:
    s = c.generate(21, 30)
    ops = s.ops
    x, y = ops[3], ops[len(ops) - 2]
    calls: list[int] = []

    def fails(candidate: c.Schedule) -> bool:
        calls.append(len(candidate.ops))
        got = candidate.ops
        return x in got and y in got
    small = c.shrink(s, fails, budget=500)
    assert small.ops == [x, y] or (len(small.ops) == 2 and set(map(str, small.ops)) == {str(x), str(y)})
    assert all(r.ops for r in small.rounds)
    assert len(calls) <= 500


def test_the_shrinker_stops_at_its_budget_and_keeps_what_fails() -> None:
    s = c.generate(2, 30)
    small = c.shrink(s, lambda cand: len(cand.ops) >= 5, budget=3)
    assert len(small.ops) >= 5 and len(small.ops) < len(s.ops)


def test_without_drops_ops_by_flat_index_and_empty_rounds() -> None:
    s = c.Schedule(1, (c.Round((c.Op("open", "p0"), c.Op("hold", "p0")), 1.0), c.Round((c.Op("close", "p0"),), 2.0)))
    assert c.without(s, [2]).rounds == (s.rounds[0],)
    assert [str(o) for o in c.without(s, [0]).ops] == [str(c.Op("hold", "p0")), str(c.Op("close", "p0"))]


# --------------------------------------------------------------------------------------------- the report


def test_the_report_counts_and_fails_on_any_finding_or_stall() -> None:
    r = c.Report(seed=5, rounds=2, ops=3)
    r.actions["open"] += 2
    r.faults["freeze"] += 1
    assert not r.failed and "passed" in r.text()
    assert r.to_json()["oracles"] == {**dict.fromkeys(c.Judgement.KINDS, 0), "stalls": 0,
                                      "guard_down_accepted": 0, "guard_down_other_refused": 0}
    r.stalls["p0"] = "Held: PodsRemain"
    assert r.failed and "stall: p0: Held" in r.text() and r.to_json()["failed"]
    g = c.Report(seed=5)
    g.guard_down["accepted"] += 1
    assert g.failed


def test_the_first_round_opens_the_work_with_both_writers() -> None:
    first = c.generate(9, 3).rounds[0]
    assert [(o.kind, o.target) for o in first.ops] == [("open", s) for s in (*c.PLAIN, *c.KUEUE)]
    assert {o.who for o in first.ops} == {0, 1}
    assert c.generate(9, 0).rounds == ()


# --------------------------------------------------------------------------------------------- credentials


def _jwt(claims: dict[str, object]) -> str:
    import base64

    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2lnbmF0dXJl"


def test_a_tokens_times_are_its_own_claims_what_the_api_server_granted() -> None:
    assert c.token_times(_jwt({"iat": 1000, "exp": 4600, "sub": "system:serviceaccount:ns:w"})) == (1000.0, 4600.0)
    for bad in ("not-a-jwt", _jwt({"iat": 1000}), _jwt({"iat": 5, "exp": 5}), "a.b@@.c"):
        assert c.token_times(bad) is None, bad
    # granted less than asked (an API server's max token expiration): the claims win over the ask
    granted = c.Credential.of("writer-0", "ns", "w", Path("t"), _jwt({"iat": 1000, "exp": 1600}), now=1000,
                              seconds=3600)
    assert (granted.issued, granted.expires) == (1000.0, 1600.0)
    assumed = c.Credential.of("editor", "ns", "e", Path("t"), "opaque", now=50.0, seconds=1200)
    assert (assumed.issued, assumed.expires) == (50.0, 1250.0)


def test_tokens_are_renewed_at_four_fifths_of_their_life_soonest_to_expire_first() -> None:
    """The rule the runner's renewer follows every 15 s: nothing early, each token once past 80 % of its
    life (an API server down then leaves a fifth of it to retry in), an expired one too, the soonest first."""
    def cred(name: str, issued: float, expires: float) -> c.Credential:
        return c.Credential(name, "ns", name, Path(name), issued, expires)

    writer, controller = cred("writer-0", 0, 1200), cred("controller", 100, 1100)
    assert c.renewals_due([writer, controller], now=899) == []
    assert c.renewals_due([writer, controller], now=900) == [controller]   # 100 + 0.8 * 1000
    assert c.renewals_due([writer, controller], now=960) == [controller, writer]   # writer: 0.8 * 1200
    assert c.renewals_due([writer, controller], now=5000) == [controller, writer]  # expired: still renewed
    renewed = c.Credential.of("controller", "ns", "controller", Path("controller"), "opaque", now=960)
    assert renewed.renew_at == 960 + 0.8 * c.TOKEN_SECONDS
    assert c.renewals_due([writer, renewed], now=961) == [writer]


def test_a_kubeconfig_holding_a_token_is_rewritten_to_read_it_from_a_file(tmp_path: Path) -> None:
    """What each replica, writer and the editor run with: dispatch's client reads the file again each minute,
    so a renewed token reaches a running client."""
    import yaml

    from dispatch import _kubeconfig
    from dispatch.testbed._campaign_runner import token_file_kubeconfig, write_token

    text = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "tb", "cluster": {"server": "https://127.0.0.1:16443"}}],
        "users": [{"name": "as-writer-1a2b", "user": {"token": "old"}}],
        "contexts": [{"name": "c", "context": {"cluster": "tb", "user": "as-writer-1a2b", "namespace": "ns"}}],
        "current-context": "c"})
    path = tmp_path / "writer.token"
    config, account = token_file_kubeconfig(text, path)
    assert account == "as-writer-1a2b"
    assert yaml.safe_load(config)["users"] == [{"name": "as-writer-1a2b", "user": {"tokenFile": str(path)}}]
    write_token(path, "fresh")
    assert path.read_text() == "fresh" and oct(path.stat().st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob("*.new"))
    (tmp_path / "kubeconfig").write_text(config)
    assert isinstance(_kubeconfig.load(tmp_path / "kubeconfig").auth, _kubeconfig.TokenFileAuth)


def _marked_pod(deleted: str) -> PodView:
    """k0-s1-node-0-0-bf9hq under OnFailure, marked Failed by PodGC over its container's exit 137, deleted at
    ``deleted``, dispatch's record of the mark taken at its current resourceVersion (no kubelet write since)."""
    status: dict[str, object] = {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
        "containerStatuses": [{"name": "node", "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}
    return PodView.from_obj({
        "metadata": {"name": "k0-s1-node-0-0-bf9hq", "uid": "u", "finalizers": [POD_FINALIZER],
                     "resourceVersion": "10", "deletionTimestamp": deleted, "deletionGracePeriodSeconds": 0,
                     "annotations": {ANNOTATION_MARK_SEEN: f"10/{kubelet_fingerprint(status)}"}},
        "spec": {"nodeName": "node-real", "restartPolicy": "OnFailure", "containers": [{"name": "node"}]},
        "status": status})


def test_the_liveness_pass_reads_the_word_a_running_objects_status_names() -> None:
    """Issue 34: the runner takes the word status names for the pod that keeps a rank from starting, read from
    the very sentence ``PodView.unproven_why`` writes; a status naming neither word gives none."""
    node = NodeView.from_obj({"metadata": {"name": "node-real", "creationTimestamp": "2026-12-04T01:03:56Z"},
                              "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    after = _marked_pod("2026-12-04T01:03:40Z").unproven_why(node)
    assert c.named_word(f"Running as A=2 but no live process (status: ...; pod x: {after})") == \
        c.Word("process-gone", "k0-s1-node-0-0-bf9hq")
    before = _marked_pod("2026-12-04T01:04:10Z").unproven_why(node)
    assert c.named_word(before) == c.Word("node-down", "k0-s1-node-0-0-bf9hq", "node-real")
    lost = _marked_pod("2026-12-04T01:03:40Z").unproven_why(NodeView("node-real", ready="Unknown"))
    assert c.named_word(lost) is None  # its kubelet not back: both words, each for a case the runner
    assert c.named_word("Running as A=2 but no live process of A=2 on the node yet") is None


def test_the_liveness_pass_reads_the_layers_a_closed_trainjob_left_as_status_names_them() -> None:
    """What ``_decision.kin_blockers`` says of a closed TrainJob's JobSet and Job the collector missed (a campaign's
    stall, seed 1109187137: its pod ran on under the closed name, the re-opened object held) is what the runner
    deletes, after checking their owners are gone."""
    from dispatch import _decision as d
    from dispatch._views import JobSetView, JobView
    from dispatch.testbed import campaign

    assert campaign._KIN_WORDS == d.KIN
    js = JobSetView.from_obj({"metadata": {"name": "p1-s1-b", "uid": "u1"}, "spec": {"suspend": False},
                              "status": {}})
    job = JobView.from_obj({"metadata": {"name": "p1-s1-b-node-0", "uid": "u2", "labels": {
        "jobset.sigs.k8s.io/jobset-name": "p1-s1-b"}}, "spec": {"suspend": False}, "status": {"active": 1}})
    said = "; ".join(d.kin_blockers("p1-s1", [js], [job]))
    assert campaign.kin_layers(f"Held: PodsRemain: remaining pods: x on node-real (Ready=True); {said}") == (
        ["p1-s1-b"], ["p1-s1-b-node-0"])
    assert campaign.kin_layers("Held: PodsRemain: remaining pods: x on node-real (Ready=True)") == ([], [])
