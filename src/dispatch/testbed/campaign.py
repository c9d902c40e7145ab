"""The campaign: random schedules of actions and faults on the real stack, judged by what real processes wrote.

The scripted stories on the testbed hold the promise where someone thought to look; the random walks on the
in-process fake hold it everywhere the fake is right. A campaign drives the testbed itself (real API server,
JobSet, Trainer, Kueue, Job controller and garbage collector, the real node's kubelet and containerd) with
dispatch's controller and guard as deployed, from a schedule drawn from one printed seed, and judges after
every round what the real processes on the real node wrote (the process oracle, :mod:`.oracle`) and what
their fences committed (:mod:`dispatch.fence`).

This module holds the parts that need no cluster, so they are tested alone: the schedule drawn from a seed
(:func:`generate`), its JSON form (what ``--replay`` reads), the oracles' judgement of recorded process lines
and fence logs (:func:`judge`), the shrinker (:func:`shrink`) and the report. The driver is
:mod:`._campaign_runner`; ``scripts/campaign`` and :func:`main` are the command.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import random
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dispatch.testbed import oracle

# --------------------------------------------------------------------------------------------- the schedule

PLAIN = ("p0", "p1")
"""Submissions in plain mode (their job ids; the submission is ``s1``)."""
KUEUE = ("k0", "k1")
"""Submissions in Kueue mode at the low priority."""
PREEMPTOR = "kh"
"""The Kueue-mode submission at the high priority: its release preempts a low one (the queue holds two)."""
SUBMISSIONS = (*PLAIN, *KUEUE, PREEMPTOR)

ACTIONS: dict[str, float] = {
    "open": 3.0, "release": 4.0, "hold": 3.0, "close": 1.2,
    "delete_pod": 1.2, "force_delete_pod": 0.8, "delete_job": 0.8, "delete_jobset": 0.8,
    "edit_runtime": 0.5, "preempt": 1.0, "sdk_delete": 0.5, "namespace_cycle": 0.2,
}
"""The writers' actions and their weights. ``open`` of a closed submission is its re-open (under either of
two names); the deletes are a user of Kubernetes' built-in ``edit`` role (``kubectl delete``, ``--force``);
``sdk_delete`` is a user of the Kubeflow SDK deleting the object's TrainJob (``TrainerClient().delete_job``, as
the writer: no dispatch in sight, no record of a close). ``namespace_cycle`` is a cluster admin deleting the
whole namespace while things run and creating it again under its name (every record goes, the cluster-scoped
floors of A stay). It is drawn only while no fault is in force and none is healed or injected in its round,
and ends its round (``NAMESPACE_CYCLE``); its weight makes it about once per 180 rounds with every fault kind
drawn (18 minutes at the usual ten rounds a minute), once per 50 with none, since each takes a minute or
more."""
NAMESPACE_CYCLE = "namespace_cycle"
"""The action that takes the namespace away: drawn alone with no fault in force (a frozen node or stopped
replicas would keep the namespace's pods, and so the namespace, until a heal its own round waits for)."""
FAULTS: dict[str, float] = {
    "freeze": 1.0, "kubelet_restart": 1.0, "containerd_restart": 0.8, "node_delete": 0.7, "oos_taint": 0.7,
    "power_off": 0.5,
    "apiserver_restart": 0.4, "leader_kill": 1.0, "replicas_down": 0.7,
}
"""The faults and their weights. Each but ``apiserver_restart`` (stopped and started within its op, while a
release is on its way) is injected by one op and healed by a ``heal`` op one to three rounds later."""
NODE_FAULTS = frozenset({"freeze", "kubelet_restart", "containerd_restart", "node_delete", "power_off"})
"""At most one of these at a time: each stops or removes the one real kubelet's view of its node."""
CONTROLLER_FAULTS = frozenset({"leader_kill", "replicas_down"})
"""At most one of these at a time: both stop controller replicas."""
SELF_HEALING = frozenset({"apiserver_restart"})


@dataclass(frozen=True)
class Op:
    """One action or fault. ``who`` is the writer (0 or 1) of an action; ``arg`` its variant (the name an
    ``open`` uses, ``a`` or ``b``; a fault's timing in seconds)."""

    kind: str
    target: str = ""
    arg: str = ""
    who: int = 0

    def __str__(self) -> str:
        inner = " ".join(x for x in (self.target, self.arg) if x)
        who = f"writer {self.who}" if self.kind in ACTIONS else ""
        return f"{self.kind}({', '.join(x for x in (inner, who) if x)})"


@dataclass(frozen=True)
class Round:
    """Ops started together (several writers at once), then a pause in seconds."""

    ops: tuple[Op, ...]
    pause: float


@dataclass(frozen=True)
class Schedule:
    seed: int
    rounds: tuple[Round, ...]
    faults: tuple[str, ...] = tuple(FAULTS)
    """The fault kinds it was drawn from (a campaign may leave some out)."""

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": list(self.faults),
                "rounds": [{"pause": r.pause, "ops": [asdict(o) for o in r.ops]} for r in self.rounds]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Schedule:
        """The schedule a campaign wrote; ``ValueError`` naming what is wrong with it otherwise."""
        try:
            rounds = tuple(Round(tuple(Op(kind=str(o["kind"]), target=str(o.get("target", "")),
                                          arg=str(o.get("arg", "")), who=int(o.get("who", 0)))
                                       for o in r["ops"]), float(r["pause"]))
                           for r in data["rounds"])
            schedule = Schedule(int(data["seed"]), rounds, tuple(data.get("faults", FAULTS)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a campaign's schedule ({type(e).__name__}: {e})") from None
        known = {*ACTIONS, *FAULTS, "heal"}
        bad = sorted({o.kind for r in schedule.rounds for o in r.ops} - known)
        if bad:
            raise ValueError(f"the schedule names unknown kinds: {', '.join(bad)} (known: {', '.join(sorted(known))})")
        return schedule

    @property
    def ops(self) -> list[Op]:
        return [o for r in self.rounds for o in r.ops]

    def prefix(self, rounds: int) -> Schedule:
        """The first ``rounds`` rounds (what a campaign cut short by its time ran)."""
        return Schedule(self.seed, self.rounds[:rounds], self.faults)


def _pick(rng: random.Random, weights: Mapping[str, float]) -> str:
    names = sorted(weights)
    return rng.choices(names, [weights[n] for n in names])[0]


def generate(seed: int, rounds: int, *, faults: Iterable[str] = tuple(FAULTS), fault_rate: float = 0.25) -> Schedule:
    """The schedule of ``rounds`` rounds drawn from ``seed`` (the same seed, the same schedule, on any machine).

    The first round opens every low submission (two writers at once). Each later round starts one to three
    ops at once and then pauses one to six seconds. An op is a fault with probability ``fault_rate`` (of the
    kinds in ``faults`` not already in force and compatible with those that are), else an action. A fault is
    healed one to three rounds later; a last round heals what is still in force, so no fault outlives the
    schedule."""
    allowed = tuple(f for f in FAULTS if f in set(faults))
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    if rounds < 0:
        raise ValueError(f"rounds must be at least 0, not {rounds}")
    rng = random.Random(seed)
    active: dict[str, int] = {}  # fault kind -> round its heal is due
    out: list[Round] = []
    if rounds:  # the work first: every low submission opened (released) by one writer or the other
        out.append(Round(tuple(Op("open", sub, "a", i % 2) for i, sub in enumerate((*PLAIN, *KUEUE))), 5.0))
    for i in range(1, rounds):
        ops = [Op("heal", kind) for kind, due in sorted(active.items()) if due == i]
        for op in ops:
            del active[op.target]
        busy = {op.target for op in ops}  # a heal runs beside this round's other ops: nothing of its group now
        for _ in range(rng.choices((1, 2, 3), (5, 3, 2))[0]):
            eligible = {f: FAULTS[f] for f in allowed if f not in active
                        and not (f in NODE_FAULTS and NODE_FAULTS & (set(active) | busy))
                        and not (f in CONTROLLER_FAULTS and CONTROLLER_FAULTS & (set(active) | busy))}
            if eligible and rng.random() < fault_rate:
                kind = _pick(rng, eligible)
                if kind == "apiserver_restart":
                    ops.append(Op(kind, rng.choice(SUBMISSIONS), f"{rng.uniform(0, 0.5):.2f}:{rng.uniform(3, 8):.1f}"))
                elif kind == "leader_kill":
                    ops.append(Op(kind, rng.choice((*KUEUE, PREEMPTOR)), f"{rng.uniform(0, 0.5):.2f}"))
                else:
                    ops.append(Op(kind, "node-real" if kind not in CONTROLLER_FAULTS else "replicas"))
                if kind not in SELF_HEALING:
                    active[kind] = i + rng.randint(1, 3)
                continue
            quiet = not active and not any(op.kind in FAULTS or op.kind == "heal" for op in ops)
            kind = _pick(rng, ACTIONS if quiet else {a: w for a, w in ACTIONS.items() if a != NAMESPACE_CYCLE})
            target = PREEMPTOR if kind == "preempt" else rng.choice(SUBMISSIONS)
            arg = rng.choice("ab") if kind == "open" else ""
            if kind == NAMESPACE_CYCLE:
                ops.append(Op(kind, "", "", rng.randint(0, 1)))
                break  # nothing drawn after it in its round: no fault beside it
            ops.append(Op(kind, target, arg, rng.randint(0, 1)))
        out.append(Round(tuple(ops), round(rng.uniform(1, 6), 1)))
    if active:
        out.append(Round(tuple(Op("heal", kind) for kind in sorted(active)), 1.0))
    return Schedule(seed, tuple(out), allowed)


def with_first(schedule: Schedule, kind: str, at: int = 3) -> Schedule:
    """``schedule`` with one ``kind`` action alone in a round of its own, inserted before round ``at``
    (1-based; the first opens have run by then), or the first later round with no fault in force: a short
    campaign exercises an action its weight seldom draws (``--first``). The later rounds move one on."""
    if kind not in ACTIONS:
        raise ValueError(f"--first takes an action, not {kind!r} (actions: {', '.join(sorted(ACTIONS))})")
    if at < 2:
        raise ValueError(f"the first round opens the submissions: --first goes at round 2 or later, not {at}")
    target = "" if kind == NAMESPACE_CYCLE else PREEMPTOR if kind == "preempt" else PLAIN[0]
    op = Op(kind, target, "a" if kind == "open" else "", 0)
    active: set[str] = set()
    rounds = list(schedule.rounds)
    where = len(rounds)
    for i, rnd in enumerate(rounds):
        if i >= at - 1 and not active:
            where = i
            break
        for o in rnd.ops:
            if o.kind == "heal":
                active.discard(o.target)
            elif o.kind in FAULTS and o.kind not in SELF_HEALING:
                active.add(o.kind)
    rounds.insert(where, Round((op,), 5.0))
    return Schedule(schedule.seed, tuple(rounds), schedule.faults)


def namespace_remains(ns: str, objects: Iterable[Mapping[str, Any]]) -> str:
    """What keeps a deleted namespace from going, in one line: the namespace's own conditions (what its
    controller says remains), then each object still in it by kind and name, a pod with its phase and
    finalizers (dispatch's keeps it until its end is proven)."""
    said: list[str] = []
    kinds: dict[str, list[str]] = defaultdict(list)
    for obj in objects:
        meta = obj.get("metadata") or {}
        if obj.get("kind") == "Namespace":
            said += [f"{c.get('type')}: {c.get('message')}" for c in (obj.get("status") or {}).get("conditions") or []
                     if c.get("status") == "True" and c.get("message")]
            continue
        name = str(meta.get("name", "?"))
        if obj.get("kind") == "Pod":
            fins = ",".join(meta.get("finalizers") or []) or "none"
            name += f" ({(obj.get('status') or {}).get('phase', '?')}, finalizers {fins}"
            name += ", deleting)" if meta.get("deletionTimestamp") else ")"
        kinds[str(obj.get("kind", "?"))].append(name)
    said += [f"{kind} {', '.join(sorted(names))}" for kind, names in sorted(kinds.items())]
    return f"namespace {ns}: " + ("; ".join(said) or "nothing listed remains")


# --------------------------------------------------------------------------------------------- the oracles


@dataclass(frozen=True)
class FenceEvent:
    """One line a fenced process wrote to its fence report (``claim``, ``commit``, ``fenced``, ``refused``)."""

    event: str
    a: int
    pid: int
    ms: int
    seq: int | None = None
    step: int | None = None
    location: str = ""
    resume_a: int | None = None
    resume_seq: int | None = None


def parse_fence_events(text: str) -> list[FenceEvent]:
    """The fence report's complete lines (a last line without its newline is still being written)."""
    out = []
    for line in text.split("\n")[:-1]:
        if not line.strip():
            continue
        raw = json.loads(line)
        resume = raw.get("resume") or {}
        out.append(FenceEvent(event=str(raw["event"]), a=int(raw["a"]), pid=int(raw["pid"]), ms=int(raw["ms"]),
                              seq=raw.get("seq"), step=raw.get("step"), location=str(raw.get("location", "")),
                              resume_a=resume.get("a"), resume_seq=resume.get("seq")))
    return out


@dataclass(frozen=True)
class LogEntry:
    """One entry of a fence's log as it is on disk."""

    seq: int
    kind: str
    admission: int
    step: int = -1


def counted(entries: Sequence[LogEntry]) -> list[LogEntry]:
    """The commits that count: no claim of a higher A before them (the fence's rule, read independently)."""
    highest, out = 0, []
    for e in sorted(entries, key=lambda e: e.seq):
        if e.kind == "claim":
            highest = max(highest, e.admission)
        elif e.kind == "commit" and e.admission >= highest:
            out.append(e)
    return out


@dataclass
class Judgement:
    """What the oracles found, each finding once (by a key), with a sentence saying what it was."""

    overlaps: dict[str, str] = field(default_factory=dict)
    """Two processes of one submission with different A alive at once: the promise broken."""
    same_a_overlaps: dict[str, str] = field(default_factory=dict)
    """Two processes of one submission with the same A alive at once (an execution has one process here)."""
    reused_a: dict[str, str] = field(default_factory=dict)
    """A process whose lines carry no A or more than one, or that started with a lower A than one that
    started before it in its submission."""
    stale_commits: dict[str, str] = field(default_factory=dict)
    """A commit its process was told counted, after a claim of a higher A in the log."""
    resume_back: dict[str, str] = field(default_factory=dict)
    """A claim that resumed from a lower A's checkpoint than the newest that counted before it, or a
    location whose newest counted checkpoint went back to a lower A."""

    KINDS = ("overlaps", "same_a_overlaps", "reused_a", "stale_commits", "resume_back")

    def merge(self, other: Judgement) -> list[str]:
        """Add ``other``'s findings; returns the sentences of those not known before."""
        new = []
        for kind in self.KINDS:
            mine, theirs = getattr(self, kind), getattr(other, kind)
            for key, text in theirs.items():
                if key not in mine:
                    mine[key] = text
                    new.append(f"{kind}: {text}")
        return new

    def counts(self) -> dict[str, int]:
        return {kind: len(getattr(self, kind)) for kind in self.KINDS}

    @property
    def failed(self) -> bool:
        return any(self.counts().values())


def judge_processes(records: Sequence[oracle.Record], procs: Sequence[oracle.Process]) -> Judgement:
    """The process oracle's judgement: overlaps (any two processes of one submission alive at once: an
    execution here has one node, so one process), and each process's A (exactly one; never lower than that
    of a process of its submission that started before it)."""
    out = Judgement()
    by_run: dict[str, set[str]] = defaultdict(set)
    for r in records:
        by_run[r.run].add(r.admission)
    by_sub: dict[tuple[str, str], list[oracle.Process]] = defaultdict(list)
    for p in procs:
        by_sub[(p.job_id, p.submission)].append(p)
        seen = by_run.get(p.run, {p.admission})
        if len(seen) != 1 or "-" in seen or not all(a.isdigit() for a in seen):
            out.reused_a[f"many:{p.run}"] = f"{p.job_id}/{p.submission}: process {p} wrote A {sorted(seen)}"
    for (job, sub), group in sorted(by_sub.items()):
        group = sorted(group, key=lambda p: (p.started_ms, p.run))
        highest: oracle.Process | None = None
        for p in group:
            if highest is not None and p.admission.isdigit() and highest.admission.isdigit() \
                    and int(p.admission) < int(highest.admission) and p.started_ms > highest.started_ms:
                out.reused_a[f"back:{p.run}"] = (f"{job}/{sub}: {p} started after {highest}: A went back")
            if p.admission.isdigit() and (highest is None or not highest.admission.isdigit()
                                          or int(p.admission) > int(highest.admission)):
                highest = p
        for i, a in enumerate(group):
            a_end = a.ended_ms if a.ended_ms is not None else float("inf")
            for b in group[i + 1:]:
                if b.started_ms > a_end:
                    continue
                b_end = b.ended_ms if b.ended_ms is not None else float("inf")
                since, until = max(a.started_ms, b.started_ms), min(a_end, b_end)
                text = (f"{job}/{sub}: {a} and {b} alive at once from {since} "
                        f"{'(both may still run)' if until == float('inf') else f'until {int(until)}'}")
                key = f"{a.run}+{b.run}"
                if a.admission != b.admission:
                    out.overlaps[key] = text
                else:
                    out.same_a_overlaps[key] = text
    return out


def excused_by_taint(first: oracle.Process, second: oracle.Process,
                     windows: Sequence[tuple[int, int | None]]) -> bool:
    """Whether an overlap follows an out-of-service taint put on a node while the earlier process still ran
    there: the operator's error (the taint says the node is shut down) that the non-graceful shutdown
    contract rules out. Such an overlap is reported apart; the fence must still refuse its stale commits."""
    earlier = first if (first.started_ms, first.run) <= (second.started_ms, second.run) else second
    return any(earlier.started_ms <= start and (earlier.ended_ms is None or earlier.ended_ms >= start)
               for start, _ in windows)


def _location_of(path: str) -> tuple[str, str] | None:
    """(job id, submission) of a checkpoint location the process reported (``/checkpoints/<job>/<sub>/...``)."""
    parts = path.strip("/").split("/")
    return (parts[1], parts[2]) if len(parts) >= 3 else None


def judge_fences(events: Sequence[FenceEvent], logs: Mapping[tuple[str, str], Sequence[LogEntry]],
                 procs: Sequence[oracle.Process]) -> Judgement:
    """The fence's judgement: no commit a process was told counted comes after a higher A's claim in its
    location's log; every claim resumed from the newest commit that counted before it (never a lower A's);
    the newest counted checkpoint of each location is of the highest A that committed. A claim is tied to
    its location by its process (pid and time, from the process oracle)."""
    out = Judgement()
    for (job, sub), entries in logs.items():
        good = counted(entries)
        for earlier, later in itertools.pairwise(good):
            if later.admission < earlier.admission:
                out.resume_back[f"log:{job}/{sub}:{later.seq}"] = (
                    f"{job}/{sub}: counted commit {later.seq} of A={later.admission} after counted commit "
                    f"{earlier.seq} of A={earlier.admission}")
    for e in events:
        where: tuple[str, str] | None = None
        if e.location:
            where = _location_of(e.location)
        else:
            owner = next((p for p in procs if p.pid == e.pid and p.started_ms <= e.ms
                          and (p.ended_ms is None or e.ms <= p.ended_ms) and p.admission == str(e.a)), None)
            where = (owner.job_id, owner.submission) if owner is not None else None
        if where is None or where not in logs or e.seq is None:
            continue
        entries = sorted(logs[where], key=lambda x: x.seq)
        before = [x for x in entries if x.seq < e.seq]
        if e.event == "commit":
            higher = [x for x in before if x.kind == "claim" and x.admission > e.a]
            if higher:
                out.stale_commits[f"{where[0]}/{where[1]}:{e.seq}"] = (
                    f"{where[0]}/{where[1]}: A={e.a} (pid {e.pid}) was told its commit {e.seq} (step {e.step}) "
                    f"counted, after A={higher[0].admission}'s claim {higher[0].seq}")
        elif e.event == "claim":
            newest = counted(before)
            want = newest[-1] if newest else None
            if want is not None and (e.resume_a is None or e.resume_a < want.admission):
                out.resume_back[f"{where[0]}/{where[1]}:claim{e.seq}"] = (
                    f"{where[0]}/{where[1]}: A={e.a}'s claim {e.seq} resumed from "
                    f"{'nothing' if e.resume_a is None else f'A={e.resume_a} commit {e.resume_seq}'}, though "
                    f"A={want.admission}'s commit {want.seq} counted before it")
    return out


def judge(records: Sequence[oracle.Record], procs: Sequence[oracle.Process], events: Sequence[FenceEvent],
          logs: Mapping[tuple[str, str], Sequence[LogEntry]]) -> Judgement:
    """Both oracles over what was recorded so far."""
    out = judge_processes(records, procs)
    out.merge(judge_fences(events, logs, procs))
    return out


def read_logs(checkpoints: Path) -> dict[tuple[str, str], list[LogEntry]]:
    """Every fence log under a checkpoint root (``<root>/<job>/<submission>/log/<seq>``) as it is on disk."""
    out: dict[tuple[str, str], list[LogEntry]] = {}
    for log in sorted(checkpoints.glob("*/*/log")):
        entries = []
        for f in sorted(log.iterdir()):
            if not f.name.isdigit():
                continue  # a temporary file of a create under way
            try:
                raw = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            entries.append(LogEntry(int(f.name), str(raw["kind"]), int(raw["admission"]), int(raw.get("step", -1))))
        out[(log.parent.parent.name, log.parent.name)] = entries
    return out


# --------------------------------------------------------------------------------------------- liveness


_PROCESS_GONE = re.compile(r"`dispatch admin release-pod ([a-z0-9.-]+) --process-gone` ends the wait")
_SHUT_DOWN = re.compile(r"then shut ([a-z0-9.-]+) down and run `dispatch admin release-pod ([a-z0-9.-]+) "
                        r"--node-confirmed-down`")


@dataclass(frozen=True)
class Word:
    """The operator's word a status names as the one that ends a pod's wait: ``process-gone`` (once the
    process is checked gone) or ``node-down`` (once ``node`` is shut down)."""

    kind: str
    pod: str
    node: str = ""


_KIN_WORDS = "of the same submission under trainjob"   # ``_decision.KIN``, held equal by a unit test


def kin_layers(cause: str) -> tuple[list[str], list[str]]:
    """The JobSets and Jobs of the submission under another TrainJob name that a status names as not yet
    suspended (``_decision.kin_blockers``): what a close left and the collector may have missed, for the liveness
    pass to delete as the named command does (the runner checks first that their owner is gone)."""
    jobsets = sorted(set(re.findall(rf"jobset (\S+) {re.escape(_KIN_WORDS)}", cause)))
    jobs = sorted(set(re.findall(rf"(?<![\w-])job (\S+) {re.escape(_KIN_WORDS)}", cause)))
    return jobsets, jobs


def named_word(cause: str) -> Word | None:
    """The word a running object's status names for the pod that keeps a rank of it from starting (a pod
    someone else marked terminal, its kubelet back: ``PodView.unproven_why``), which the liveness pass takes as
    the operator would; None when it names neither (the wait ends by itself, or needs something else)."""
    found = _PROCESS_GONE.search(cause)
    if found:
        return Word("process-gone", found.group(1))
    down = _SHUT_DOWN.search(cause)
    if down:
        return Word("node-down", down.group(2), down.group(1))
    return None


# --------------------------------------------------------------------------------------------- shrinking


def without(schedule: Schedule, drop: Iterable[int]) -> Schedule:
    """``schedule`` with the ops at the flat indices ``drop`` removed (a round left empty goes too)."""
    gone, i, rounds = set(drop), 0, []
    for r in schedule.rounds:
        kept = []
        for op in r.ops:
            if i not in gone:
                kept.append(op)
            i += 1
        if kept:
            rounds.append(Round(tuple(kept), r.pause))
    return Schedule(schedule.seed, tuple(rounds), schedule.faults)


def shrink(schedule: Schedule, fails: Callable[[Schedule], bool], *, budget: int = 50,
           log: Callable[[str], None] = lambda _: None) -> Schedule:
    """The smallest schedule found that still ``fails`` (delta debugging over ops: drop halves, then ever
    smaller chunks, down to single ops), trying at most ``budget`` candidates. ``fails(schedule)`` is
    assumed to hold for the schedule given."""
    current, tries, chunk = schedule, 0, max(1, len(schedule.ops) // 2)
    while chunk >= 1 and tries < budget:
        n = len(current.ops)
        shrunk = False
        start = 0
        while start < n and tries < budget:
            candidate = without(current, range(start, min(n, start + chunk)))
            tries += 1
            if candidate.ops and fails(candidate):
                log(f"shrink: {len(candidate.ops)} ops still fail (dropped {start}..{min(n, start + chunk) - 1})")
                current, n, shrunk = candidate, len(candidate.ops), True
            else:
                start += chunk
        if not shrunk:
            chunk //= 2
    return current


# --------------------------------------------------------------------------------------------- credentials

TOKEN_SECONDS = 1200
"""The lifetime asked of each ServiceAccount token the runner mints (the writers', the editor's, the
controller replicas'). Short on purpose: every campaign longer than ``RENEW_FRACTION`` of it renews them, so
the renewal is exercised by ordinary campaigns, not first by a two-hour one (a TokenRequest may ask 600 s at
least; an API server with ``--service-account-max-token-expiration`` shortens longer asks)."""
RENEW_FRACTION = 0.8
"""A token is renewed once this much of its life has passed, as the kubelet renews a pod's projected token:
a kube-apiserver down meanwhile (a fault of the campaign) still leaves a fifth of the life to renew in."""


def token_times(token: str) -> tuple[float, float] | None:
    """(issued, expires) in Unix seconds from a JWT bearer token's ``iat`` and ``exp`` claims (what the API
    server actually granted, which may be less than was asked); None when it is not a JWT carrying both."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        issued, expires = float(claims["iat"]), float(claims["exp"])
    except (ValueError, KeyError, TypeError):
        return None
    return (issued, expires) if expires > issued else None


@dataclass(frozen=True)
class Credential:
    """One identity's token as the runner holds it: in a file its kubeconfig names (``tokenFile``), which
    dispatch's client reads again each minute, so a renewed token reaches a running replica as a rotated
    projected token reaches a pod."""

    name: str
    namespace: str
    account: str
    path: Path
    issued: float
    expires: float

    @property
    def renew_at(self) -> float:
        return self.issued + RENEW_FRACTION * (self.expires - self.issued)

    @staticmethod
    def of(name: str, namespace: str, account: str, path: Path, token: str, now: float,
           seconds: int = TOKEN_SECONDS) -> Credential:
        """The credential of a token just minted: its own claims' times, else ``now`` and the asked lifetime."""
        issued, expires = token_times(token) or (now, now + seconds)
        return Credential(name, namespace, account, path, issued, expires)


def renewals_due(credentials: Iterable[Credential], now: float) -> list[Credential]:
    """The credentials to renew at ``now``: those past ``RENEW_FRACTION`` of their life (expired ones too:
    renewing is the only way back), soonest to expire first."""
    return sorted((c for c in credentials if now >= c.renew_at), key=lambda c: (c.expires, c.name))


# --------------------------------------------------------------------------------------------- the report


@dataclass
class Report:
    """What a campaign did and found; printed at the end and written as JSON."""

    seed: int
    stack: str = ""
    minutes: float = 0.0
    rounds: int = 0
    ops: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    """``kind: outcome`` (ok, refused with the reason, error with its type): what each op met."""
    judgement: Judgement = field(default_factory=Judgement)
    stalls: dict[str, str] = field(default_factory=dict)
    """Objects not admitted within the bound after healing, with the status they showed."""
    guard_down: Counter[str] = field(default_factory=Counter)
    """Starts tried while no replica answered: ``refused``, ``accepted`` (a violation); other writes: ``other
    passed``, ``other refused`` (a violation: nothing else may be affected)."""
    liveness_actions: Counter[str] = field(default_factory=Counter)
    renewals: Counter[str] = field(default_factory=Counter)
    """Tokens renewed (``renewed``) and renewals that failed and were tried again (``failed``)."""
    events: Counter[str] = field(default_factory=Counter)
    """The namespace's Events by reason at the end (what the controllers said they did: Kueue's preemptions,
    the Job controller's refused pod creates, dispatch's delayed admissions)."""
    processes: int = 0
    executions: int = 0
    commits: int = 0
    fenced: int = 0
    findings: list[str] = field(default_factory=list)
    """What reality did that is worth a note (not a violation by itself), with the round it was seen in."""
    schedule_file: str = ""

    @property
    def failed(self) -> bool:
        return self.judgement.failed or bool(self.stalls) or bool(self.guard_down.get("accepted")) \
            or bool(self.guard_down.get("other refused"))

    def counts(self) -> dict[str, int]:
        return {**self.judgement.counts(), "stalls": len(self.stalls),
                "guard_down_accepted": self.guard_down.get("accepted", 0),
                "guard_down_other_refused": self.guard_down.get("other refused", 0)}

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "stack": self.stack, "minutes": round(self.minutes, 2), "rounds": self.rounds,
                "ops": self.ops, "actions": dict(sorted(self.actions.items())),
                "faults": dict(sorted(self.faults.items())), "outcomes": dict(sorted(self.outcomes.items())),
                "oracles": self.counts(), "failed": self.failed,
                "findings": {kind: sorted(getattr(self.judgement, kind).values())
                             for kind in Judgement.KINDS},
                "stalls": self.stalls, "guard_down": dict(self.guard_down),
                "liveness_actions": dict(self.liveness_actions), "renewals": dict(self.renewals),
                "events": dict(sorted(self.events.items())),
                "processes": self.processes, "executions": self.executions, "commits": self.commits,
                "fenced": self.fenced, "notes": self.findings, "schedule": self.schedule_file}

    def text(self) -> str:
        def line(title: str, c: Mapping[str, int]) -> str:
            return f"{title}: " + (", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none")
        lines = [f"campaign seed {self.seed} on {self.stack or '?'}: {self.rounds} rounds, {self.ops} ops in "
                 f"{self.minutes:.1f} min; {self.processes} processes of {self.executions} executions, "
                 f"{self.commits} commits, {self.fenced} refused by the fence",
                 line("actions", self.actions), line("faults", self.faults), line("outcomes", self.outcomes),
                 line("guard down", self.guard_down), line("liveness actions", self.liveness_actions),
                 line("token renewals", self.renewals),
                 line("events", self.events),
                 line("oracles", self.counts())]
        for kind in Judgement.KINDS:
            lines += [f"  {kind}: {t}" for t in sorted(getattr(self.judgement, kind).values())]
        lines += [f"  stall: {k}: {v}" for k, v in sorted(self.stalls.items())]
        lines += [f"  note: {n}" for n in self.findings]
        lines.append(("FAILED" if self.failed else "passed") + (f"; schedule in {self.schedule_file}"
                                                               if self.schedule_file else ""))
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------- the command


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/campaign``: run a campaign on the running testbed; exit 1 if an oracle failed."""
    p = argparse.ArgumentParser(prog="campaign", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0, help="stop starting rounds after this long (default 3)")
    p.add_argument("--seed", type=int, default=None, help="the seed (default: drawn from the time, printed)")
    p.add_argument("--steps", type=int, default=None, help="exactly this many rounds (default: until --minutes)")
    p.add_argument("--replay", type=Path, default=None, help="run the schedule a campaign wrote (JSON)")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help=f"fault kinds to draw from, comma-separated (default all: {','.join(FAULTS)}); "
                        "'none' for actions only")
    p.add_argument("--first", default=None, metavar="ACTION",
                   help="also run this action alone in round 3 (or the first later round with no fault in "
                        "force), e.g. namespace_cycle, which the weights seldom draw; not with --replay")
    p.add_argument("--shrink", type=int, default=0, metavar="N",
                   help="when it fails, replay up to N smaller schedules to find the fewest ops that still fail")
    p.add_argument("--workdir", type=Path, default=None, help="where the oracle, checkpoints, logs and JSON go")
    p.add_argument("--liveness-seconds", type=float, default=240.0,
                   help="how long, once healed, each object has to run again (default 240)")
    args = p.parse_args(argv)
    from dispatch.testbed import _campaign_runner as runner

    if args.replay is not None:
        if args.first:
            print("campaign: --first changes a drawn schedule; a replay plays its file as it is", file=sys.stderr)
            return 2
        try:
            schedule = Schedule.from_json(json.loads(args.replay.read_text()))
        except (OSError, ValueError) as e:
            print(f"campaign: cannot replay {args.replay}: {e}", file=sys.stderr)
            return 2
        minutes = None
    else:
        faults = [] if args.faults.strip() == "none" else [f.strip() for f in args.faults.split(",") if f.strip()]
        seed = args.seed if args.seed is not None else int(time.time() * 1000) % 2**31
        try:
            schedule = generate(seed, args.steps if args.steps is not None else 100_000, faults=faults)
        except ValueError as e:
            print(f"campaign: {e}", file=sys.stderr)
            return 2
        minutes = None if args.steps is not None else args.minutes
        if args.first:
            try:
                schedule = with_first(schedule, args.first)
            except ValueError as e:
                print(f"campaign: {e}", file=sys.stderr)
                return 2
    print(f"campaign: seed {schedule.seed}", flush=True)
    report = runner.run(schedule, minutes=minutes, workdir=args.workdir, liveness_seconds=args.liveness_seconds,
                        shrink_budget=args.shrink)
    print(report.text(), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
