"""Fencing at the storage: a stale execution can never commit a checkpoint.

dispatch never starts two executions of one object at once, and numbers them: every trainer container of
an execution gets ``DISPATCH_NAMESPACE``, ``DISPATCH_JOB_ID``, ``DISPATCH_SUBMISSION`` and
``DISPATCH_ADMISSION`` (``A``, strictly increasing per submission of a namespace). A fence makes an overlap
that happens anyway (a node tainted while its process still runs, a copy started by hand in another cluster)
harmless for checkpoints: ``A`` is a fencing token and the checkpoint store checks it.

One location (``<root>/<namespace>/<job-id>/<submission>/``, bound to its cluster too) holds an append-only
**log** of small entries, numbered ``1, 2, 3, ...`` with no gap, each created by a write that succeeds only
if its number is still free (``link(2)`` on POSIX, ``If-None-Match: *`` on S3), so the log's order is the
order the entries were made.
An execution appends a *claim* when it starts and a *commit* for every checkpoint, after the checkpoint's
data is durable under a key no other write uses. The rule that readers apply:

    a commit of ``A`` counts if and only if no claim of a higher ``A`` comes before it in the log.

So there is no window between "check" and "commit": a stale writer that checked, found nothing, and
committed just after the newer execution claimed, made a commit that does not count; it learns so at
once (it reads the entries before its own) and raises :class:`Fenced`, naming both numbers. Its data went
to its own keys, so the newer execution's checkpoints are never touched. Resuming reads the newest commit
that counts, which is always the newest checkpoint of the highest ``A`` that committed (commits that count
never go down in ``A`` along the log).

Importing this module pulls in no Kubernetes or HTTP client; the S3 store needs ``boto3``
(``pip install 'trainjob-dispatch[s3]'``), imported only when an S3 store is made.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .errors import InvalidInput, Refused

__all__ = [
    "ENV_ADMISSION",
    "ENV_CLUSTER",
    "ENV_JOB_ID",
    "ENV_NAMESPACE",
    "ENV_SUBMISSION",
    "Checkpoint",
    "Fence",
    "FenceIdentity",
    "FenceStore",
    "Fenced",
    "PosixStore",
    "S3Store",
]

ENV_JOB_ID = "DISPATCH_JOB_ID"
ENV_SUBMISSION = "DISPATCH_SUBMISSION"
ENV_ADMISSION = "DISPATCH_ADMISSION"
ENV_NAMESPACE = "DISPATCH_NAMESPACE"
"""The pod's namespace (downward API ``metadata.namespace``); else the service-account namespace file is read."""
ENV_CLUSTER = "DISPATCH_CLUSTER"
"""The cluster whose dispatch numbers A (optional; e.g. its kube-system namespace's uid; under MultiKueue the
manager's, since the manager numbers A for every worker)."""
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
SNAPSHOT_EVERY = 100
"""Every this many entries the log's state is written as a snapshot: a claim reads at most about this many
entries (plus about 2·log2 of the log's length to find its end)."""
LISTED_MAX = 1000
"""How many checkpoints that count the log's state lists (the newest; an older one is forgotten: its data
stays, rotation no longer sees it). It bounds a snapshot's size; resume is always the newest."""
TMP_MAX_AGE = 600.0
"""Seconds after which a POSIX store's temporary entry file is a dead writer's (a live one holds it for the
milliseconds between its write and its link) and a claim removes it."""

_LOG = "log/"
_DATA = "data/"
_SNAP = "snap/"
_VOID = "void/"
_SEQ_DIGITS = 12
_KNOWN_ENTRY_READS = 50
"""How often an entry known to exist is re-read before the store is called inconsistent (an NFS client's
cached negative lookup can hide a name another client just made; see the POSIX store's notes)."""


class Fenced(Refused):
    """A higher ``A`` has claimed this checkpoint location: this execution is stale and must stop.

    Raised by :meth:`Fence.claim` (the process must not start) and by :meth:`Fence.commit` (the checkpoint
    was not committed: it does not count, and no reader will ever resume from it). ``admission`` is this
    execution's ``A``, ``newer`` the higher one that claimed the location.
    """

    def __init__(self, admission: int, newer: int, action: str, location: str) -> None:
        super().__init__(
            f"execution A={admission} may not {action} at {location}: execution A={newer} has claimed it "
            f"(this process is stale and must stop)",
            reason="Fenced",
        )
        self.admission = admission
        self.newer = newer
        self.location = location


class FenceStore(Protocol):
    """What a fence needs of a store. Keys are ``/``-separated and relative to the fenced location.

    ``create`` must be atomic and exclusive (it makes the key with the whole body, or reports that the key
    exists, never both and never half), durable when it returns, and every later ``read`` of any reader
    must see it. Everything the fence guarantees rests on these three properties.
    """

    @property
    def location(self) -> str:
        """Where the fenced location is, for messages (a path or an ``s3://`` URL)."""
        ...

    def create(self, key: str, body: bytes) -> bool:
        """Make ``key`` with ``body`` if it does not exist (True), or leave it untouched (False)."""
        ...

    def read(self, key: str) -> bytes | None:
        """The body of ``key``, or None if it does not exist."""
        ...

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        """Have ``write`` fill a directory, and make its files durable under ``prefix`` (a new prefix)."""
        ...

    def open_data(self, prefix: str) -> contextlib.AbstractContextManager[Path]:
        """A local directory holding the files stored under ``prefix``, for as long as the context lasts."""
        ...

    def discard_data(self, prefix: str) -> None:
        """Remove what is stored under ``prefix`` (best effort: data no commit that counts names)."""
        ...


@dataclass(frozen=True)
class FenceIdentity:
    """Whose numbers a fenced location holds: A counts per (cluster, namespace, job-id, submission).

    Two namespaces (or clusters) may use the same job-id and submission, and each numbers its executions from
    A=1; a location shared by both would let one resume the other's checkpoint or refuse a legitimate
    execution as stale. So the namespace is part of the location's path, and the whole identity is written
    into every entry: the first entry binds the location, and an execution of another identity is refused.
    ``cluster`` names the cluster whose dispatch numbers A (under MultiKueue, the manager); "" when not told.
    """

    namespace: str
    job_id: str
    submission: str
    cluster: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"cluster": self.cluster, "namespace": self.namespace, "job": self.job_id,
                "submission": self.submission}

    def __str__(self) -> str:
        return (f"cluster={self.cluster or '(not set)'} namespace={self.namespace} job-id={self.job_id} "
                f"submission={self.submission}")

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> FenceIdentity:
        return FenceIdentity(namespace=str(raw["namespace"]), job_id=str(raw["job"]), submission=str(raw["submission"]),
                        cluster=str(raw.get("cluster", "")))


@dataclass(frozen=True)
class Checkpoint:
    """One committed checkpoint that counts: written by execution ``admission`` at ``step``.

    ``seq`` is its commit's place in the location's log; ``location`` says where its files are; ``name`` is
    the name it was committed under through :class:`dispatch.fencefs.FencedFileSystem` ("" for ``commit``).
    ``open()`` gives a local directory with its files (the directory itself on POSIX, a download on S3).
    """

    admission: int
    step: int
    seq: int
    location: str
    _store: FenceStore = field(repr=False, compare=False)
    _prefix: str = field(repr=False, compare=False)
    name: str = ""

    @property
    def prefix(self) -> str:
        """Where its files are, relative to the fenced location (``data/a-<A>/...``)."""
        return self._prefix

    @contextlib.contextmanager
    def open(self) -> Iterator[Path]:
        """A local directory with this checkpoint's files, valid inside the ``with`` block."""
        with self._store.open_data(self._prefix) as path:
            yield path


@dataclass(frozen=True)
class _Entry:
    seq: int
    kind: str  # "claim" | "commit" | "delete"
    admission: int
    nonce: str
    step: int = -1
    data: str = ""
    name: str = ""
    target: int = 0  # delete: the commit's seq
    identity: FenceIdentity | None = None  # None: an entry of before identities, or a repaired (voided) one

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "admission": self.admission, "step": self.step, "data": self.data,
                "name": self.name}


@dataclass
class _State:
    """What the log says after some prefix of its entries: all a decision needs (and what a snapshot keeps)."""

    identity: FenceIdentity | None = None
    highest_claim: int = 0
    live: dict[int, _Entry] = field(default_factory=dict)
    """Commits that count and were not deleted, by seq, in log order."""

    def copy(self) -> _State:
        return _State(self.identity, self.highest_claim, dict(self.live))

    def newest(self) -> _Entry | None:
        """The last live commit: the newest checkpoint of the highest A (counting commits never go down in A)."""
        return next(reversed(self.live.values()), None)

    def apply(self, entry: _Entry) -> None:
        if entry.identity is not None:
            if self.identity is None:
                self.identity = entry.identity
            elif entry.identity != self.identity:
                return  # another identity's entry (it was refused): its A is another count's
        if entry.kind == "claim":
            self.highest_claim = max(self.highest_claim, entry.admission)
        elif entry.kind == "commit":
            if entry.admission >= self.highest_claim:
                self.live[entry.seq] = entry
                while len(self.live) > LISTED_MAX:  # the same for every reader: a function of the log alone
                    del self.live[next(iter(self.live))]
        elif entry.kind == "delete":
            newest = self.newest()
            if entry.admission >= self.highest_claim and entry.target in self.live \
                    and (newest is None or newest.seq != entry.target) \
                    and self.live[entry.target].admission <= entry.admission:
                del self.live[entry.target]

    def encode(self, upto: int) -> bytes:
        body = {"kind": "snapshot", "upto": upto, "highest_claim": self.highest_claim,
                "identity": None if self.identity is None else self.identity.as_dict(),
                "live": [e.as_dict() for e in self.live.values()]}
        return json.dumps(body, sort_keys=True).encode() + b"\n"

    @staticmethod
    def decode(body: bytes, upto: int) -> _State | None:
        """A snapshot's state, or None if it is not one of entry ``upto`` (a damaged snapshot is only skipped)."""
        try:
            raw = json.loads(body)
            if raw["kind"] != "snapshot" or int(raw["upto"]) != upto:
                return None
            identity = None if raw["identity"] is None else FenceIdentity.from_dict(raw["identity"])
            live = {}
            for e in raw["live"]:
                entry = _Entry(seq=int(e["seq"]), kind="commit", admission=int(e["admission"]), nonce="",
                               step=int(e["step"]), data=str(e["data"]), name=str(e["name"]), identity=identity)
                live[entry.seq] = entry
            return _State(identity, int(raw["highest_claim"]), live)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


class Fence:
    """The fence of one execution (number ``admission``) on one checkpoint location.

    Use it as a context manager around the training loop::

        with Fence.from_env("/mnt/checkpoints") as fence:     # claims; Fenced if a newer execution did
            if fence.resume is not None:                      # the newest checkpoint that counts
                with fence.resume.open() as directory:
                    state = load(directory)
            for step in ...:
                if step % 1000 == 0:
                    fence.commit(step, lambda directory: save(state, directory))

    ``commit`` raises :class:`Fenced` as soon as a higher ``A`` has claimed the location; let it end the
    process (a stale execution must stop). A fence is for one thread; every process (or rank) that commits
    needs its own, and they may share one location only if they share one ``A``.

    ``identity`` binds the location (see :class:`FenceIdentity`); ``snapshot_every`` entries a snapshot of the
    log's state is written (by exclusive create, like an entry), so a new execution reads a bounded number of
    entries however long the log is.
    """

    def __init__(self, store: FenceStore, admission: int, *, identity: FenceIdentity | None = None,
                 snapshot_every: int = SNAPSHOT_EVERY, legacy: FenceStore | None = None) -> None:
        if isinstance(admission, bool) or not isinstance(admission, int) or admission < 1:
            raise InvalidInput(f"admission must be an integer of at least 1, not {admission!r}")
        if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int) or snapshot_every < 2:
            raise InvalidInput(f"snapshot_every must be an integer of at least 2, not {snapshot_every!r}")
        self.store = store
        self.admission = admission
        self.identity = identity
        self.snapshot_every = snapshot_every
        self._legacy = legacy
        self._loaded = False
        self._base_seq = 0
        self._base = _State()
        self._tail: list[_Entry] = []
        self._claim_seq: int | None = None
        self._resume: Checkpoint | None = None
        self.reads = 0
        """Entries and snapshots read so far (what a claim costs, for tests and the bench)."""

    # ------------------------------------------------------------------------------------------ making

    @classmethod
    def from_env(cls, root: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None,
                 s3_client: Any = None, namespace_file: str | os.PathLike[str] = NAMESPACE_FILE) -> Fence:
        """The fence of this process's execution on ``root``, from the variables dispatch sets.

        ``root`` is a directory (local, or a network filesystem: see :class:`PosixStore`) or an
        ``s3://bucket/prefix`` URL (:class:`S3Store`; ``s3_client`` defaults to ``boto3.client("s3")``,
        which reads ``AWS_ENDPOINT_URL`` and credentials from the environment). The fenced location is
        ``<root>/<namespace>/<DISPATCH_JOB_ID>/<DISPATCH_SUBMISSION>/``: ``A`` counts per submission of a
        namespace. The namespace is ``DISPATCH_NAMESPACE``, else the pod's service-account namespace file;
        the cluster is ``DISPATCH_CLUSTER`` (optional).
        """
        env = os.environ if environ is None else environ
        missing = [name for name in (ENV_JOB_ID, ENV_SUBMISSION, ENV_ADMISSION) if not env.get(name)]
        if missing:
            raise InvalidInput(f"{', '.join(missing)} not set: a fence needs the variables dispatch gives "
                               "every trainer container of an execution it admitted")
        try:
            admission = int(env[ENV_ADMISSION])
        except ValueError:
            raise InvalidInput(f"{ENV_ADMISSION}={env[ENV_ADMISSION]!r} is not a number") from None
        namespace = env.get(ENV_NAMESPACE, "")
        if not namespace:
            with contextlib.suppress(OSError):
                namespace = Path(namespace_file).read_text().strip()
        if not namespace:
            raise InvalidInput(f"the pod's namespace is unknown: neither {ENV_NAMESPACE} is set nor "
                               f"{os.fspath(namespace_file)} readable; two namespaces may use one job-id and "
                               f"submission, so a fence needs it: set {ENV_NAMESPACE} from the downward API "
                               "(fieldRef metadata.namespace) in the training runtime")
        return cls.at(root, env[ENV_JOB_ID], env[ENV_SUBMISSION], admission, namespace=namespace,
                      cluster=env.get(ENV_CLUSTER, ""), s3_client=s3_client)

    @classmethod
    def at(cls, root: str | os.PathLike[str], job_id: str, submission: str, admission: int, *,
           namespace: str, cluster: str = "", s3_client: Any = None,
           snapshot_every: int = SNAPSHOT_EVERY) -> Fence:
        """The fence of execution ``admission`` of (``namespace``, ``job_id``, ``submission``) on ``root``.

        See ``from_env``. The location is ``<root>/<namespace>/<job_id>/<submission>/``; it is bound to
        (``cluster``, ``namespace``, ``job_id``, ``submission``) by its first entry.
        """
        for what, value in (("namespace", namespace), ("job id", job_id), ("submission", submission)):
            if not isinstance(value, str) or not value or value in (".", "..") or "/" in value \
                    or "\\" in value or "\0" in value:
                raise InvalidInput(f"{what} {value!r} cannot name a directory")
        if not isinstance(cluster, str) or "\0" in cluster:
            raise InvalidInput(f"cluster {cluster!r} is not a name")
        identity = FenceIdentity(namespace=namespace, job_id=job_id, submission=submission, cluster=cluster)
        text = os.fspath(root)
        store: FenceStore
        legacy: FenceStore
        if text.startswith("s3://"):
            bucket, _, prefix = text[len("s3://"):].partition("/")
            base = prefix.strip("/")
            store = S3Store(bucket, "/".join(p for p in (base, namespace, job_id, submission) if p), client=s3_client)
            legacy = S3Store(bucket, "/".join(p for p in (base, job_id, submission) if p), client=store.client)
        else:
            store = PosixStore(Path(text) / namespace / job_id / submission)
            legacy = PosixStore(Path(text) / job_id / submission)
        return cls(store, admission, identity=identity, snapshot_every=snapshot_every, legacy=legacy)

    # ------------------------------------------------------------------------------------------ using

    def __enter__(self) -> Fence:
        self.claim()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def claimed(self) -> bool:
        return self._claim_seq is not None

    @property
    def resume(self) -> Checkpoint | None:
        """The checkpoint to resume from, as found when this execution claimed the location (or None)."""
        if self._claim_seq is None:
            raise RuntimeError("claim the location first (Fence.claim, or `with fence:`)")
        return self._resume

    def claim(self) -> Checkpoint | None:
        """Claim the location for this execution; return the checkpoint to resume from.

        Raises :class:`Fenced` if a higher ``A`` has claimed it (before or while this claim is made); then
        this process must not start. Claiming again (a restarted container of the same execution) is
        allowed, and resumes from the newest checkpoint that counts, which may be this execution's own.
        Raises ``Refused`` (reason ``FenceIdentity``) if the location is bound to another identity.
        """
        self._advance()
        self._refuse_other_identity(self._state())
        self._refuse_if_newer("start")
        if self._end == 0 and self._legacy is not None and self._legacy.read(self._key(1)) is not None:
            raise Refused(f"{self._legacy.location}: a fenced location of before the namespace was part of its "
                          f"identity holds this job-id and submission; if it is namespace "
                          f"{self.identity.namespace if self.identity else '?'}'s, move it to "
                          f"{self.store.location} (else move it away) and start again; nothing was written",
                          reason="FenceLegacyLocation")
        seq = self._append("claim")
        before = self._state(before=seq)
        self._refuse_other_identity(self._state(before=seq + 1))
        self._refuse_if_newer("start", state=before)
        self._claim_seq = seq
        newest = before.newest()
        self._resume = None if newest is None else self._checkpoint(newest)
        sweep = getattr(self.store, "sweep", None)
        if callable(sweep):
            with contextlib.suppress(OSError):
                sweep()
        return self._resume

    def check(self, action: str = "go on") -> None:
        """Raise :class:`Fenced` if a higher ``A`` has claimed the location by now (one cheap read)."""
        self._advance()
        self._refuse_if_newer(action)

    def commit(self, step: int, write: Callable[[Path], object]) -> Checkpoint:
        """Write a checkpoint with ``write(directory)`` and commit it, unless a higher ``A`` has claimed.

        ``write`` fills an empty directory (on POSIX, inside the location; on S3, a local one whose files
        are uploaded). Its files are made durable first, under keys no other write uses; then the commit
        entry is appended; then the entries before it are read. The commit counts only if none of them is
        a higher claim, else :class:`Fenced` is raised and the data is removed again. :class:`Fenced` is
        also raised before ``write`` runs if a higher claim is already visible, so a stale writer does not
        spend a checkpoint's time for nothing.
        """
        self._need_claim()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInput(f"step must be a non-negative integer, not {step!r}")
        action = f"commit step {step}"
        self._advance()
        self._refuse_if_newer(action)
        prefix = self.new_prefix(f"step-{step:0{_SEQ_DIGITS}d}")
        entry_may_exist = False
        try:
            self.store.write_data(prefix, write)
            entry_may_exist = True
            return self.commit_prefix(prefix, step=step, action=action)
        except BaseException:
            # The data goes if no commit that counts can name it: refused, or failed before its entry (a
            # failure inside commit_prefix already removed it if refused).
            if not entry_may_exist:
                with contextlib.suppress(Exception):
                    self.store.discard_data(prefix)
            raise

    def new_prefix(self, label: str) -> str:
        """A data prefix of this execution that no other write uses (``data/a-<A>/<label>-<random>``)."""
        return f"{_DATA}a-{self.admission:0{_SEQ_DIGITS}d}/{label}-{secrets.token_hex(6)}"

    def commit_prefix(self, prefix: str, *, step: int = -1, name: str = "", action: str = "") -> Checkpoint:
        """Commit data already durable under ``prefix`` (from :meth:`new_prefix`): the fenced step itself.

        The commit entry is appended, then the entries before it are read: it counts only if none of them is a
        higher claim, else :class:`Fenced` is raised and the data is removed. An append that failed (a lost
        reply) may have made an entry that counts, so then the data stays.
        """
        self._need_claim()
        action = action or f"commit {name or prefix}"
        try:
            self._advance()
            self._refuse_if_newer(action)
            seq = self._append("commit", step=step, data=prefix, name=name)
            self._refuse_if_newer(action, state=self._state(before=seq))
        except Fenced:
            with contextlib.suppress(Exception):
                self.store.discard_data(prefix)
            raise
        return self._checkpoint(self._get(seq))

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that counts now (reads the log to its end): what a new execution resumes."""
        self._advance()
        state = self._state()
        self._refuse_other_identity(state)
        newest = state.newest()
        return None if newest is None else self._checkpoint(newest)

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint that counts and was not rotated away, oldest first (reads the log to its end)."""
        self._advance()
        state = self._state()
        self._refuse_other_identity(state)
        return [self._checkpoint(e) for e in state.live.values()]

    def delete(self, checkpoint: Checkpoint) -> None:
        """Delete one checkpoint: fenced like a commit, and never the newest (the one ``resume`` would return).

        A delete entry is appended first; the data is removed only if the entry counts (no higher claim
        before it, the checkpoint not of a higher ``A``, not the newest). A stale caller gets :class:`Fenced`
        and nothing is removed.
        """
        self._need_claim()
        action = f"delete the checkpoint of A={checkpoint.admission} step {checkpoint.step}"
        self._advance()
        self._refuse_if_newer(action)
        state = self._state()
        newest = state.newest()
        if checkpoint.seq not in state.live:
            return  # deleted already (or never counted): nothing to do
        if checkpoint.admission > self.admission:
            raise Fenced(self.admission, checkpoint.admission, action, self.store.location)
        if newest is not None and newest.seq == checkpoint.seq:
            raise Refused(f"{self.store.location}: the checkpoint of A={checkpoint.admission} step "
                          f"{checkpoint.step} is the one a new execution resumes from; it is never deleted",
                          reason="FenceKeepsResume")
        seq = self._append("delete", target=checkpoint.seq)
        self._refuse_if_newer(action, state=self._state(before=seq))
        if checkpoint.seq not in self._state(before=seq + 1).live:
            with contextlib.suppress(Exception):
                self.store.discard_data(checkpoint.prefix)

    def rotate(self, keep: int) -> list[Checkpoint]:
        """Keep the newest ``keep`` checkpoints that count; delete older ones (each delete fenced).

        Never deletes one of a higher ``A`` than this execution's, nor the newest (what ``resume`` returns).
        Returns the checkpoints deleted. :class:`Fenced` if a higher ``A`` has claimed: nothing more is deleted.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise InvalidInput(f"keep must be an integer of at least 1, not {keep!r}")
        self._need_claim()
        live = self.checkpoints()
        doomed = [c for c in live[:-keep] if c.admission <= self.admission]
        for checkpoint in doomed:
            self.delete(checkpoint)
        return doomed

    # ------------------------------------------------------------------------------------------ repair

    def repair(self, seq: int) -> bool:
        """Make damaged log entry ``seq`` count as a claim of this fence's ``A``: the way out of FenceLogCorrupt.

        Itself fenced: refused unless entry ``seq`` exists and does not parse, and this ``A`` is at least every
        claim the log holds (give the submission's current A). The evidence (the damaged bytes' digest) is
        written to ``void/<seq>`` by exclusive create, so two repairs cannot disagree; readers then take the
        entry as a claim of ``A``: every lower execution is fenced from it on, and no checkpoint counts by it.
        Returns True if this call wrote the repair, False if one with the same digest was already there.
        """
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise InvalidInput(f"entry must be a positive integer, not {seq!r}")
        damaged = self.store.read(self._key(seq))
        if damaged is None:
            raise InvalidInput(f"{self.store.location}: log entry {seq} does not exist; nothing to repair")
        if self._try_parse(seq, damaged) is not None:
            raise InvalidInput(f"{self.store.location}: log entry {seq} parses; only a damaged entry is repaired")
        highest, at = 0, 0
        n = 0
        while (body := self.store.read(self._key(n + 1))) is not None:
            n += 1
            entry = self._try_parse(n, body)
            if entry is not None and entry.kind == "claim" and entry.admission > highest:
                highest, at = entry.admission, n
        if highest > self.admission:
            raise Refused(f"{self.store.location}: a repair as A={self.admission} is refused: entry {at} is a "
                          f"claim of A={highest}; name the submission's current A (at least {highest})",
                          reason="Fenced")
        digest = hashlib.sha256(damaged).hexdigest()
        body = json.dumps({"admission": self.admission, "sha256": digest, "time": time.time(),
                           "host": socket.gethostname()}, sort_keys=True).encode() + b"\n"
        if self.store.create(f"{_VOID}{seq:0{_SEQ_DIGITS}d}", body):
            return True
        existing = self._void(seq, damaged)
        if existing is None:
            raise Refused(f"{self.store.location}: entry {seq} has a repair of other bytes already; compare "
                          f"{_VOID}{seq:0{_SEQ_DIGITS}d} with the entry by hand", reason="FenceLogCorrupt")
        return False

    # ------------------------------------------------------------------------------------------ the log

    @property
    def _end(self) -> int:
        return self._base_seq + len(self._tail)

    def _key(self, seq: int) -> str:
        return f"{_LOG}{seq:0{_SEQ_DIGITS}d}"

    def _get(self, seq: int) -> _Entry:
        return self._tail[seq - self._base_seq - 1]

    def _need_claim(self) -> None:
        if self._claim_seq is None:
            raise RuntimeError("claim the location first (Fence.claim, or `with fence:`)")

    def _read(self, key: str) -> bytes | None:
        self.reads += 1
        return self.store.read(key)

    def _try_parse(self, seq: int, body: bytes) -> _Entry | None:
        try:
            raw = json.loads(body)
            identity = None if raw.get("identity") is None else FenceIdentity.from_dict(raw["identity"])
            return _Entry(seq=seq, kind=str(raw["kind"]), admission=int(raw["admission"]), nonce=str(raw["nonce"]),
                          step=int(raw.get("step", -1)), data=str(raw.get("data", "")), name=str(raw.get("name", "")),
                          target=int(raw.get("target", 0)), identity=identity)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def _void(self, seq: int, damaged: bytes) -> int | None:
        """The A a repair of entry ``seq`` names, if one was made for exactly these bytes."""
        body = self.store.read(f"{_VOID}{seq:0{_SEQ_DIGITS}d}")
        if body is None:
            return None
        try:
            raw = json.loads(body)
            if raw["sha256"] != hashlib.sha256(damaged).hexdigest():
                return None
            return int(raw["admission"])
        except (ValueError, KeyError, TypeError):
            return None

    def _parse(self, seq: int, body: bytes) -> _Entry:
        entry = self._try_parse(seq, body)
        if entry is not None:
            return entry
        repaired = self._void(seq, body)
        if repaired is not None:
            return _Entry(seq=seq, kind="claim", admission=repaired, nonce="void")
        raise Refused(f"{self.store.location}: log entry {seq} does not parse (damaged, or written by something "
                      "else), so the location is blocked; the way out: with the submission's current A (dispatch "
                      f"status), run `python -m dispatch.fence repair {self.store.location} --entry {seq} "
                      "--admission A`, which makes the entry a claim of A (every lower execution fenced, no "
                      "checkpoint counted by it)", reason="FenceLogCorrupt")

    def _load(self) -> None:
        """First read of a fence: start from the newest snapshot, found without reading the whole log.

        Entries exist exactly at 1..end (a writer makes entry n only after reading n-1), so the end is found
        by doubling then bisecting (about 2·log2(end) reads); then the snapshot of the last multiple of
        ``snapshot_every`` (or one before it, if its writer died before making it) is the base.
        """
        self._loaded = True
        if self._read(self._key(1)) is None:
            return
        low, high = 1, 2
        while self._read(self._key(high)) is not None:
            low, high = high, high * 2
        while high - low > 1:  # entry `low` exists, entry `high` does not
            mid = (low + high) // 2
            if self._read(self._key(mid)) is not None:
                low = mid
            else:
                high = mid
        upto = low - low % self.snapshot_every
        for _ in range(3):
            if upto <= 0:
                return
            body = self._read(f"{_SNAP}{upto:0{_SEQ_DIGITS}d}")
            state = None if body is None else _State.decode(body, upto)
            if state is not None:
                self._base_seq, self._base, self._tail = upto, state, []
                return
            upto -= self.snapshot_every

    def _advance(self) -> None:
        """Read the log from the first entry not yet read to its end."""
        if not self._loaded:
            self._load()
        self._rebase()
        while (body := self._read(self._key(self._end + 1))) is not None:
            self._tail.append(self._parse(self._end + 1, body))

    def _rebase(self) -> None:
        """Fold all but the last ``snapshot_every`` entries read into the base state, so a decision folds a
        bounded tail however long this execution runs (decisions look only at the end: its own newest entry)."""
        extra = len(self._tail) - self.snapshot_every
        if extra >= self.snapshot_every:
            for entry in self._tail[:extra]:
                self._base.apply(entry)
            self._base_seq += extra
            del self._tail[:extra]

    def _read_known(self, seq: int) -> None:
        """Read entries up to ``seq``, which exist (a create found ``seq`` taken)."""
        while self._end < seq:
            want = self._end + 1
            for attempt in range(_KNOWN_ENTRY_READS):
                body = self._read(self._key(want))
                if body is not None:
                    self._tail.append(self._parse(want, body))
                    break
                time.sleep(min(0.01 * 2 ** attempt, 0.2))
            else:
                raise Refused(f"{self.store.location}: log entry {want} exists (a create found it) but cannot "
                              "be read; the store does not show every client what others wrote (on NFS, mount "
                              "with lookupcache=positive or none)", reason="FenceStoreInconsistent")

    def _append(self, kind: str, *, step: int = -1, data: str = "", name: str = "", target: int = 0) -> int:
        """Append one entry at the first free number; return its number. Entries before it are read."""
        nonce = secrets.token_hex(12)
        body: dict[str, Any] = {"kind": kind, "admission": self.admission, "nonce": nonce, "time": time.time(),
                                "host": socket.gethostname(), "pid": os.getpid()}
        if self.identity is not None:
            body["identity"] = self.identity.as_dict()
        if kind == "commit":
            body |= {"step": step, "data": data, "name": name}
        if kind == "delete":
            body["target"] = target
        encoded = json.dumps(body, sort_keys=True).encode() + b"\n"
        if not self._loaded:
            self._load()
        while True:
            seq = self._end + 1
            if self.store.create(self._key(seq), encoded):
                self._tail.append(self._parse(seq, encoded))
                break
            # Taken: by someone else, or by this very write whose reply was lost and whose retry found it.
            self._read_known(seq)
            if self._get(seq).nonce == nonce:
                break
        if seq % self.snapshot_every == 0:
            # Whoever makes entry n·K writes the state after it; every writer would write the same, and the
            # exclusive create keeps the first. A snapshot that is missing or damaged is only read past.
            with contextlib.suppress(Exception):
                self.store.create(f"{_SNAP}{seq:0{_SEQ_DIGITS}d}", self._state(before=seq + 1).encode(seq))
        return seq

    def _state(self, *, before: int | None = None) -> _State:
        """The log's state after entries ``1 .. before-1`` (all read entries if None)."""
        state = self._base.copy()
        stop = len(self._tail) if before is None else before - self._base_seq - 1
        for entry in self._tail[:max(stop, 0)]:
            state.apply(entry)
        return state

    def _refuse_other_identity(self, state: _State) -> None:
        if self.identity is not None and state.identity is not None and state.identity != self.identity:
            raise Refused(f"{self.store.location} is bound to {state.identity}, not to this execution's "
                          f"{self.identity}: its A values are another count's, so this execution may not use it "
                          "(give it another root)", reason="FenceIdentity")

    def _refuse_if_newer(self, action: str, *, state: _State | None = None) -> None:
        newer = (self._state() if state is None else state).highest_claim
        if newer > self.admission:
            raise Fenced(self.admission, newer, action, self.store.location)

    def _checkpoint(self, entry: _Entry) -> Checkpoint:
        return Checkpoint(admission=entry.admission, step=entry.step, seq=entry.seq,
                          location=f"{self.store.location.rstrip('/')}/{entry.data}",
                          _store=self.store, _prefix=entry.data, name=entry.name)


# ---------------------------------------------------------------------------------------------- POSIX


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PosixStore:
    """A fenced location in a directory, on a local disk or a network filesystem.

    Entries are created by writing a private temporary file, ``fsync``-ing it, and ``link(2)``-ing it to
    the entry's name: ``link`` fails with ``EEXIST`` if the name exists, so it is an exclusive create like
    ``O_CREAT|O_EXCL``, but the name appears only with its whole content. The log directory is ``fsync``-ed
    after each entry; checkpoint data is written into a new directory, and every file and directory of it
    is ``fsync``-ed before its commit entry is made.

    Local filesystems (ext4, xfs, btrfs, tmpfs) give all three properties a fence needs. On NFS (v3 and
    later) ``link`` and exclusive create are single operations on the server, so exclusivity holds across
    clients; a lost reply to a retried ``link`` is recognised (the entry holds this writer's nonce). What
    NFS does not give by default is that a client sees a name another client has just made: a cached
    negative lookup (``lookupcache=all``, the default) can hide it for up to ``acdirmax`` seconds. The fence
    never trusts a missing name for safety (a hidden entry makes a create fail, and the fence then reads
    that entry until it appears), but a stale writer may then notice a newer claim only at its next commit
    after the cache expires: mount with ``lookupcache=positive`` (or ``none``). Contents need nothing more:
    an entry's file is closed before its name exists, and close-to-open consistency makes it whole for every
    later open. Filesystems without hard links (some FUSE mounts of object stores) are refused.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._ready = False

    @property
    def location(self) -> str:
        return str(self.path)

    def _prepare(self) -> None:
        if self._ready:
            return
        for sub in ("log", "data", "tmp", "snap", "void"):
            made = []
            d = self.path / sub
            while not d.exists():
                made.append(d)
                d = d.parent
            (self.path / sub).mkdir(parents=True, exist_ok=True)
            for d in made:
                _fsync(d.parent)
        self._ready = True

    def create(self, key: str, body: bytes) -> bool:
        self._prepare()
        target = self.path / key
        tmp = self.path / "tmp" / f"{os.getpid()}-{secrets.token_hex(8)}.entry"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, target)
                made = True
            except FileExistsError:
                # NFS: a retried LINK whose first reply was lost says EEXIST although it made the link.
                made = os.stat(tmp).st_nlink == 2
            except OSError as err:
                if err.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                    raise Refused(f"{self.location}: the filesystem does not support hard links, which the fence "
                                  "needs for an exclusive create; use an S3 location or another filesystem",
                                  reason="FenceUnsupported") from err
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if made:
            _fsync(target.parent)
        return made

    def sweep(self, older_than: float = TMP_MAX_AGE) -> list[str]:
        """Remove temporary entry files of writers killed before their ``link``; return their names.

        Only files older than ``older_than`` seconds go. Removing one can never make a wrong entry: the entry
        exists only once its name is linked, and a writer (however slow) whose file is gone gets an error from
        its ``link``, so the A of the writer does not matter.
        """
        gone = []
        limit = time.time() - older_than
        with os.scandir(self.path / "tmp") as found:
            for item in found:
                with contextlib.suppress(FileNotFoundError):
                    if item.name.endswith(".entry") and item.stat().st_mtime < limit:
                        os.unlink(item.path)
                        gone.append(item.name)
        return gone

    def read(self, key: str) -> bytes | None:
        try:
            return (self.path / key).read_bytes()
        except FileNotFoundError:
            return None

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        self._prepare()
        target = self.path / prefix
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir()  # new: the prefix names this attempt alone
        write(target)
        for root, dirs, files in os.walk(target, topdown=False):
            for name in files:
                _fsync(Path(root) / name)
            for name in dirs:
                _fsync(Path(root) / name)
        _fsync(target)
        _fsync(target.parent)
        _fsync(target.parent.parent)

    @contextlib.contextmanager
    def open_data(self, prefix: str) -> Iterator[Path]:
        path = self.path / prefix
        if not path.is_dir():
            raise Refused(f"{path}: a committed checkpoint's directory is missing (removed by hand?)",
                          reason="FenceDataMissing")
        yield path

    def discard_data(self, prefix: str) -> None:
        shutil.rmtree(self.path / prefix, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- S3


class S3Store:
    """A fenced location under a prefix of an S3 bucket (AWS S3 or an S3-compatible store).

    Entries are created with ``PutObject`` and ``If-None-Match: *``: the store writes the object only if
    the key does not exist (else ``412 Precondition Failed``), as one atomic step, and S3's strong
    read-after-write consistency (AWS since December 2020; MinIO always) makes every later ``GetObject``
    see it. A ``409 ConditionalRequestConflict`` (a concurrent conditional write to the same key) is
    retried. A retried ``PutObject`` whose first reply was lost gets ``412`` for its own object, which the
    fence recognises by its nonce. Nothing is ever overwritten (checkpoint data goes to keys unique to the
    execution, step and attempt), so ``If-Match`` is never needed.

    A store that ignored ``If-None-Match`` would silently break the fence, so the first use writes a probe
    object twice and refuses the store unless the second write is refused (two requests, once per store).
    """

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None) -> None:
        if client is None:
            try:
                import boto3  # optional: only S3 locations need it
            except ImportError as err:
                raise InvalidInput("an s3:// location needs boto3: pip install 'trainjob-dispatch[s3]'") from err
            client = boto3.client("s3")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._probed = False

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @staticmethod
    def _code(err: Exception) -> str:
        response = getattr(err, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def _put_if_absent(self, key: str, body: bytes) -> bool:
        from botocore.exceptions import ClientError

        for attempt in range(8):
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, IfNoneMatch="*")
                return True
            except ClientError as err:
                code = self._code(err)
                if code == "PreconditionFailed":
                    return False
                if code == "ConditionalRequestConflict" and attempt < 7:
                    time.sleep(0.05 * 2 ** attempt)
                    continue
                raise
        raise AssertionError("unreachable")

    def _probe(self) -> None:
        if self._probed:
            return
        key = f"probe/{secrets.token_hex(8)}"
        first = self._put_if_absent(key, b"1")
        second = self._put_if_absent(key, b"2")
        with contextlib.suppress(Exception):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        if not first or second:
            raise Refused(f"{self.location}: the store does not honour If-None-Match: * on PutObject "
                          "(a second conditional write of one key succeeded), so it cannot fence",
                          reason="FenceUnsupported")
        self._probed = True

    def create(self, key: str, body: bytes) -> bool:
        self._probe()
        return self._put_if_absent(key, body)

    def read(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as err:
            if self._code(err) in ("NoSuchKey", "404"):
                return None
            raise
        return bytes(response["Body"].read())

    def _keys(self, prefix: str) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix).rstrip("/") + "/"):
            for item in page.get("Contents", []):
                yield str(item["Key"])

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        with tempfile.TemporaryDirectory(prefix="dispatch-fence-") as tmp:
            write(Path(tmp))
            for root, _dirs, files in os.walk(tmp):
                for name in files:
                    local = Path(root) / name
                    rel = local.relative_to(tmp).as_posix()
                    # upload_file: multipart for large files; the key is new, so no condition is needed
                    self.client.upload_file(str(local), self.bucket, self._key(f"{prefix}/{rel}"))

    @contextlib.contextmanager
    def open_data(self, prefix: str) -> Iterator[Path]:
        base = self._key(prefix).rstrip("/") + "/"
        with tempfile.TemporaryDirectory(prefix="dispatch-fence-") as tmp:
            for key in self._keys(prefix):
                local = Path(tmp) / key[len(base):]
                local.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, key, str(local))
            yield Path(tmp)

    def discard_data(self, prefix: str) -> None:
        for key in list(self._keys(prefix)):
            self.client.delete_object(Bucket=self.bucket, Key=key)


# ---------------------------------------------------------------------------------------------- repair


def main(argv: list[str] | None = None) -> int:
    """``python -m dispatch.fence repair LOCATION --entry N --admission A``: the way out of FenceLogCorrupt."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dispatch.fence")
    sub = parser.add_subparsers(dest="command", required=True)
    repair = sub.add_parser("repair", help="make a damaged log entry count as a claim of the submission's current A")
    repair.add_argument("location", help="the fenced location (a directory, or s3://bucket/prefix) as errors name it")
    repair.add_argument("--entry", type=int, required=True, help="the damaged entry's number")
    repair.add_argument("--admission", type=int, required=True, help="the submission's current A (dispatch status)")
    args = parser.parse_args(argv)
    store: FenceStore
    if args.location.startswith("s3://"):
        bucket, _, prefix = args.location[len("s3://"):].partition("/")
        store = S3Store(bucket, prefix)
    else:
        store = PosixStore(args.location)
    try:
        made = Fence(store, args.admission).repair(args.entry)
    except Refused as err:
        print(f"refused: {err}")
        return 2
    print(f"{store.location}: entry {args.entry} now counts as a claim of A={args.admission}"
          + ("" if made else " (repaired before)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
