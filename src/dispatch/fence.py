"""Fencing at the storage: a stale execution can never commit a checkpoint.

dispatch never starts two executions of one object at once, and numbers them: every trainer container of
an execution gets ``DISPATCH_JOB_ID``, ``DISPATCH_SUBMISSION`` and ``DISPATCH_ADMISSION`` (``A``, strictly
increasing per submission). A fence makes an overlap that happens anyway (a node tainted while its process
still runs, a copy started by hand in another cluster) harmless for checkpoints: ``A`` is a fencing token
and the checkpoint store checks it.

One location (``<root>/<job-id>/<submission>/``) holds an append-only **log** of small entries, numbered
``1, 2, 3, ...`` with no gap, each created by a write that succeeds only if its number is still free
(``link(2)`` on POSIX, ``If-None-Match: *`` on S3), so the log's order is the order the entries were made.
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
    "ENV_JOB_ID",
    "ENV_SUBMISSION",
    "Checkpoint",
    "Fence",
    "FenceStore",
    "Fenced",
    "PosixStore",
    "S3Store",
]

ENV_JOB_ID = "DISPATCH_JOB_ID"
ENV_SUBMISSION = "DISPATCH_SUBMISSION"
ENV_ADMISSION = "DISPATCH_ADMISSION"

_LOG = "log/"
_DATA = "data/"
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
class Checkpoint:
    """One committed checkpoint that counts: written by execution ``admission`` at ``step``.

    ``seq`` is its commit's place in the location's log; ``location`` says where its files are.
    ``open()`` gives a local directory with its files (the directory itself on POSIX, a download on S3).
    """

    admission: int
    step: int
    seq: int
    location: str
    _store: FenceStore = field(repr=False, compare=False)
    _prefix: str = field(repr=False, compare=False)

    @contextlib.contextmanager
    def open(self) -> Iterator[Path]:
        """A local directory with this checkpoint's files, valid inside the ``with`` block."""
        with self._store.open_data(self._prefix) as path:
            yield path


@dataclass(frozen=True)
class _Entry:
    seq: int
    kind: str  # "claim" | "commit"
    admission: int
    nonce: str
    step: int = -1
    data: str = ""


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
    """

    def __init__(self, store: FenceStore, admission: int) -> None:
        if isinstance(admission, bool) or not isinstance(admission, int) or admission < 1:
            raise InvalidInput(f"admission must be an integer of at least 1, not {admission!r}")
        self.store = store
        self.admission = admission
        self._log: list[_Entry] = []
        self._claim_seq: int | None = None
        self._resume: Checkpoint | None = None

    # ------------------------------------------------------------------------------------------ making

    @classmethod
    def from_env(cls, root: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None,
                 s3_client: Any = None) -> Fence:
        """The fence of this process's execution on ``root``, from the variables dispatch sets.

        ``root`` is a directory (local, or a network filesystem: see :class:`PosixStore`) or an
        ``s3://bucket/prefix`` URL (:class:`S3Store`; ``s3_client`` defaults to ``boto3.client("s3")``,
        which reads ``AWS_ENDPOINT_URL`` and credentials from the environment). The fenced location is
        ``<root>/<DISPATCH_JOB_ID>/<DISPATCH_SUBMISSION>/``: ``A`` counts per submission.
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
        return cls.at(root, env[ENV_JOB_ID], env[ENV_SUBMISSION], admission, s3_client=s3_client)

    @classmethod
    def at(cls, root: str | os.PathLike[str], job_id: str, submission: str, admission: int, *,
           s3_client: Any = None) -> Fence:
        """The fence of execution ``admission`` of (``job_id``, ``submission``) on ``root`` (see ``from_env``)."""
        for what, value in (("job id", job_id), ("submission", submission)):
            if not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value:
                raise InvalidInput(f"{what} {value!r} cannot name a directory")
        text = os.fspath(root)
        store: FenceStore
        if text.startswith("s3://"):
            bucket, _, prefix = text[len("s3://"):].partition("/")
            prefix = "/".join(p for p in (prefix.strip("/"), job_id, submission) if p)
            store = S3Store(bucket, prefix, client=s3_client)
        else:
            store = PosixStore(Path(text) / job_id / submission)
        return cls(store, admission)

    # ------------------------------------------------------------------------------------------ using

    def __enter__(self) -> Fence:
        self.claim()
        return self

    def __exit__(self, *exc: object) -> None:
        return None

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
        """
        self._advance()
        self._refuse_if_newer("start")
        seq = self._append("claim")
        self._refuse_if_newer("start", before=seq)
        self._claim_seq = seq
        self._resume = self._newest(before=seq)
        return self._resume

    def check(self) -> None:
        """Raise :class:`Fenced` if a higher ``A`` has claimed the location by now (one cheap read)."""
        self._advance()
        self._refuse_if_newer("go on")

    def commit(self, step: int, write: Callable[[Path], object]) -> Checkpoint:
        """Write a checkpoint with ``write(directory)`` and commit it, unless a higher ``A`` has claimed.

        ``write`` fills an empty directory (on POSIX, inside the location; on S3, a local one whose files
        are uploaded). Its files are made durable first, under keys no other write uses; then the commit
        entry is appended; then the entries before it are read. The commit counts only if none of them is
        a higher claim, else :class:`Fenced` is raised and the data is removed again. :class:`Fenced` is
        also raised before ``write`` runs if a higher claim is already visible, so a stale writer does not
        spend a checkpoint's time for nothing.
        """
        if self._claim_seq is None:
            raise RuntimeError("claim the location first (Fence.claim, or `with fence:`)")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidInput(f"step must be a non-negative integer, not {step!r}")
        action = f"commit step {step}"
        self._advance()
        self._refuse_if_newer(action)
        prefix = f"{_DATA}a-{self.admission:0{_SEQ_DIGITS}d}/step-{step:0{_SEQ_DIGITS}d}-{secrets.token_hex(6)}"
        entry_may_exist = False
        try:
            self.store.write_data(prefix, write)
            self._advance()
            self._refuse_if_newer(action)
            entry_may_exist = True
            seq = self._append("commit", step=step, data=prefix)
            self._refuse_if_newer(action, before=seq)
        except BaseException as err:
            # The data goes if no commit that counts can name it: refused, or failed before its entry. An
            # append that failed (a lost reply) may have made an entry that counts, so its data stays.
            if isinstance(err, Fenced) or not entry_may_exist:
                with contextlib.suppress(Exception):
                    self.store.discard_data(prefix)
            raise
        return self._checkpoint(self._log[seq - 1])

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that counts now (reads the log to its end): what a new execution resumes."""
        self._advance()
        return self._newest(before=len(self._log) + 1)

    # ------------------------------------------------------------------------------------------ the log

    def _key(self, seq: int) -> str:
        return f"{_LOG}{seq:0{_SEQ_DIGITS}d}"

    def _parse(self, seq: int, body: bytes) -> _Entry:
        try:
            raw = json.loads(body)
            return _Entry(seq=seq, kind=str(raw["kind"]), admission=int(raw["admission"]), nonce=str(raw["nonce"]),
                          step=int(raw.get("step", -1)), data=str(raw.get("data", "")))
        except (ValueError, KeyError, TypeError) as err:
            raise Refused(f"{self.store.location}: log entry {seq} does not parse ({err}); the location is "
                          "not a fence's, or was written by something else", reason="FenceLogCorrupt") from None

    def _advance(self) -> None:
        """Read the log from the first entry not yet read to its end."""
        while (body := self.store.read(self._key(len(self._log) + 1))) is not None:
            self._log.append(self._parse(len(self._log) + 1, body))

    def _read_known(self, seq: int) -> None:
        """Read entries up to ``seq``, which exist (a create found ``seq`` taken)."""
        while len(self._log) < seq:
            want = len(self._log) + 1
            for attempt in range(_KNOWN_ENTRY_READS):
                body = self.store.read(self._key(want))
                if body is not None:
                    self._log.append(self._parse(want, body))
                    break
                time.sleep(min(0.01 * 2 ** attempt, 0.2))
            else:
                raise Refused(f"{self.store.location}: log entry {want} exists (a create found it) but cannot "
                              "be read; the store does not show every client what others wrote (on NFS, mount "
                              "with lookupcache=positive or none)", reason="FenceStoreInconsistent")

    def _append(self, kind: str, *, step: int = -1, data: str = "") -> int:
        """Append one entry at the first free number; return its number. Entries before it are read."""
        nonce = secrets.token_hex(12)
        body = {"kind": kind, "admission": self.admission, "nonce": nonce, "time": time.time(),
                "host": socket.gethostname(), "pid": os.getpid()}
        if kind == "commit":
            body |= {"step": step, "data": data}
        encoded = json.dumps(body, sort_keys=True).encode() + b"\n"
        while True:
            seq = len(self._log) + 1
            if self.store.create(self._key(seq), encoded):
                self._log.append(self._parse(seq, encoded))
                return seq
            # Taken: by someone else, or by this very write whose reply was lost and whose retry found it.
            self._read_known(seq)
            if self._log[seq - 1].nonce == nonce:
                return seq

    def _refuse_if_newer(self, action: str, *, before: int | None = None) -> None:
        entries = self._log if before is None else self._log[:before - 1]
        newer = max((e.admission for e in entries if e.kind == "claim"), default=0)
        if newer > self.admission:
            raise Fenced(self.admission, newer, action, self.store.location)

    def _newest(self, *, before: int) -> Checkpoint | None:
        """The last commit that counts among entries ``1 .. before-1``."""
        highest_claim = 0
        newest: _Entry | None = None
        for entry in self._log[:before - 1]:
            if entry.kind == "claim":
                highest_claim = max(highest_claim, entry.admission)
            elif entry.kind == "commit" and entry.admission >= highest_claim:
                newest = entry
        return None if newest is None else self._checkpoint(newest)

    def _checkpoint(self, entry: _Entry) -> Checkpoint:
        return Checkpoint(admission=entry.admission, step=entry.step, seq=entry.seq,
                          location=f"{self.store.location.rstrip('/')}/{entry.data}",
                          _store=self.store, _prefix=entry.data)


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
        for sub in ("log", "data", "tmp"):
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
        tmp = self.path / "tmp" / f"{secrets.token_hex(8)}.entry"
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
