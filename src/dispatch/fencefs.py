"""A fenced fsspec filesystem: checkpoint libraries that write through fsspec get the fence without code of ours.

:class:`FencedFileSystem` wraps any fsspec filesystem (a local directory, ``s3fs`` on S3 or MinIO, ...) at a
fenced location (``<root>/<namespace>/<job-id>/<submission>/``, the same as :class:`dispatch.fence.Fence`'s).
A library sees an ordinary directory of checkpoints, ``<name>/<files>``; underneath:

* every write, rename and delete first takes this execution's claim (on its first write) or checks that no
  higher ``A`` has claimed since (one read); a stale execution gets :class:`dispatch.fence.Fenced`, naming
  both ``A`` values, and nothing is written;
* the files of a checkpoint being written go to a prefix of their own under ``data/a-<A>/``, invisible to
  every other process (each ``A`` writes only under its own prefix, so a stale writer's bytes never reach a
  newer execution's files);
* the step a library uses to publish a checkpoint is the fenced commit: renaming a checkpoint directory
  (``tmp-checkpoint-500`` to ``checkpoint-500``, as Hugging Face's Trainer does), or renaming a marker file
  inside it into place (``.metadata.tmp`` to ``.metadata``, PyTorch Distributed Checkpoint's commit), or an
  explicit :meth:`FencedFileSystem.commit`. It appends a commit entry to the location's log and counts only if
  no higher claim precedes it; otherwise :class:`Fenced` is raised and the files are removed;
* reads are never fenced: ``<name>/...`` reads the newest commit of that name that counts (or this process's
  own checkpoint being written). :meth:`resume` names the newest checkpoint of the highest ``A``;
  :meth:`rotate` keeps the last N, never deleting one of a higher ``A`` nor the one ``resume`` names.

Needs ``fsspec`` (``pip install 'trainjob-dispatch[fsspec]'``; ``s3fs`` for S3). ``dispatch.fence`` does not
import this module.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from .errors import InvalidInput, Refused
from .fence import (
    ENV_ADMISSION,
    ENV_CLUSTER,
    ENV_JOB_ID,
    ENV_SUBMISSION,
    NAMESPACE_FILE,
    Checkpoint,
    Fence,
    FenceIdentity,
    PosixStore,
)

__all__ = ["DEFAULT_MARKERS", "FencedFileSystem", "FsspecStore"]

DEFAULT_MARKERS = frozenset({".metadata"})
"""File names whose rename into place inside a checkpoint commits it (PyTorch Distributed Checkpoint's)."""


def _fsync_tree(path: Path) -> None:
    """Make every file and directory under ``path`` durable (a commit entry must never name lost data)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in [*files, *dirs]:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in (path, path.parent, path.parent.parent):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FsspecStore:
    """A fence's store on an fsspec filesystem: a local one through :class:`PosixStore` (``link(2)``), any other
    through ``pipe_file(mode="create")`` (on S3, ``PutObject`` with ``If-None-Match: *``), refused unless a probe
    shows that a second exclusive create of one key fails."""

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path.rstrip("/")
        self.posix = PosixStore(self.path) if isinstance(fs, LocalFileSystem) else None
        self._probed = False

    @property
    def location(self) -> str:
        if self.posix is not None:
            return self.posix.location
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{protocol}://{self.path}"

    def _full(self, key: str) -> str:
        return f"{self.path}/{key}"

    def _put_if_absent(self, key: str, body: bytes) -> bool:
        for attempt in range(8):
            try:
                self.fs.pipe_file(self._full(key), body, mode="create")
                return True
            except FileExistsError:
                return False
            except OSError as err:
                # s3fs says FileExistsError only when the 412 names its condition; MinIO's does not, so the
                # S3 error code is read from the cause s3fs keeps.
                response = getattr(err.__cause__, "response", None) or {}
                code = str(response.get("Error", {}).get("Code", ""))
                if code == "PreconditionFailed":
                    return False
                if code == "ConditionalRequestConflict" and attempt < 7:
                    time.sleep(0.05 * 2 ** attempt)
                    continue
                raise
        raise AssertionError("unreachable")

    def create(self, key: str, body: bytes) -> bool:
        if self.posix is not None:
            return self.posix.create(key, body)
        if not self._probed:
            probe = f"probe/{secrets.token_hex(8)}"
            first, second = self._put_if_absent(probe, b"1"), self._put_if_absent(probe, b"2")
            with contextlib.suppress(Exception):
                self.fs.rm_file(self._full(probe))
            if not first or second:
                raise Refused(f"{self.location}: the store does not refuse a second exclusive create of one key "
                              "(If-None-Match ignored?), so it cannot fence", reason="FenceUnsupported")
            self._probed = True
        return self._put_if_absent(key, body)

    def read(self, key: str) -> bytes | None:
        if self.posix is not None:
            return self.posix.read(key)
        try:
            return bytes(self.fs.cat_file(self._full(key)))
        except FileNotFoundError:
            return None

    def sweep(self) -> list[str]:
        return [] if self.posix is None else self.posix.sweep()

    def write_data(self, prefix: str, write: Callable[[Path], object]) -> None:
        if self.posix is not None:
            self.posix.write_data(prefix, write)
            return
        with tempfile.TemporaryDirectory(prefix="dispatch-fence-") as tmp:
            write(Path(tmp))
            for root, _dirs, files in os.walk(tmp):
                for name in files:
                    local = Path(root) / name
                    self.fs.put_file(str(local), self._full(f"{prefix}/{local.relative_to(tmp).as_posix()}"))

    @contextlib.contextmanager
    def open_data(self, prefix: str) -> Iterator[Path]:
        if self.posix is not None:
            with self.posix.open_data(prefix) as path:
                yield path
            return
        with tempfile.TemporaryDirectory(prefix="dispatch-fence-") as tmp:
            base = self._full(prefix)
            for key in self.fs.find(base):
                local = Path(tmp) / key[len(base):].lstrip("/")
                local.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(key, str(local))
            yield Path(tmp)

    def discard_data(self, prefix: str) -> None:
        if self.posix is not None:
            self.posix.discard_data(prefix)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._full(prefix), recursive=True)


def _step_of(name: str) -> int:
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


class FencedFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """An fsspec filesystem whose root is one execution's fenced checkpoint location (see the module's notes).

    Paths are ``<name>/<file...>`` relative to the root (``fenced://`` may prefix them): a checkpoint is a
    directory at the top, named by the library. Make one with :meth:`from_env` (the variables dispatch
    sets) or :meth:`at`. One instance is for one process (one ``A``): it remembers the checkpoints it is
    writing.
    """

    protocol = "fenced"
    root_marker = ""
    cachable = False

    def __init__(self, fence: Fence, fs: AbstractFileSystem, location: str, *,
                 markers: frozenset[str] = DEFAULT_MARKERS) -> None:
        super().__init__()
        self.fence = fence
        self.fs = fs
        self.location = location.rstrip("/")
        self.markers = frozenset(markers)
        self._staged: dict[str, str] = {}  # name -> data prefix (relative to the location) being written
        self._lock = threading.RLock()  # a Fence is for one thread; libraries write files from thread pools

    # ------------------------------------------------------------------------------------------ making

    @classmethod
    def at(cls, root: str, job_id: str, submission: str, admission: int, *, namespace: str, cluster: str = "",
           storage_options: Mapping[str, Any] | None = None, markers: frozenset[str] = DEFAULT_MARKERS,
           snapshot_every: int | None = None) -> FencedFileSystem:
        """The fenced filesystem of execution ``admission`` on ``root`` (an fsspec URL or a local path)."""
        for what, value in (("namespace", namespace), ("job id", job_id), ("submission", submission)):
            if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or "\\" in value:
                raise InvalidInput(f"{what} {value!r} cannot name a directory")
        fs, path = url_to_fs(os.fspath(root), **dict(storage_options or {}))
        location = "/".join(p for p in (str(path).rstrip("/"), namespace, job_id, submission) if p)
        if isinstance(fs, LocalFileSystem) and not location.startswith("/"):
            location = "/" + location
        identity = FenceIdentity(namespace=namespace, job_id=job_id, submission=submission, cluster=cluster)
        store = FsspecStore(fs, location)
        fence = Fence(store, admission, identity=identity) if snapshot_every is None else \
            Fence(store, admission, identity=identity, snapshot_every=snapshot_every)
        return cls(fence, fs, location, markers=markers)

    @classmethod
    def from_env(cls, root: str, *, environ: Mapping[str, str] | None = None,
                 storage_options: Mapping[str, Any] | None = None, markers: frozenset[str] = DEFAULT_MARKERS,
                 namespace_file: str | os.PathLike[str] = NAMESPACE_FILE) -> FencedFileSystem:
        """This process's fenced filesystem on ``root``, from the variables dispatch sets (as ``Fence.from_env``)."""
        env = os.environ if environ is None else environ
        probe = Fence.from_env("/", environ=env, namespace_file=namespace_file)  # validates; writes nothing
        assert probe.identity is not None
        return cls.at(root, env[ENV_JOB_ID], env[ENV_SUBMISSION], int(env[ENV_ADMISSION]),
                      namespace=probe.identity.namespace, cluster=env.get(ENV_CLUSTER, ""),
                      storage_options=storage_options, markers=markers)

    # ------------------------------------------------------------------------------------------ paths

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        if text.startswith("fenced://"):
            text = text[len("fenced://"):]
        return text.strip("/")

    def _split(self, path: Any) -> tuple[str, str]:
        rel = self._strip_protocol(path)
        parts = [p for p in rel.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise InvalidInput(f"{path!r}: '.' and '..' are not allowed in a fenced path")
        return (parts[0], "/".join(parts[1:])) if parts else ("", "")

    def _phys(self, prefix: str, rest: str) -> str:
        return "/".join(p for p in (self.location, prefix, rest) if p)

    def _visible(self) -> dict[str, Checkpoint]:
        """Committed checkpoints by name: the newest commit of each name that counts (reads the log's new end)."""
        with self._lock:
            return {c.name: c for c in self.fence.checkpoints() if c.name}

    def _resolve(self, path: Any) -> tuple[str, str, str]:
        """(name, rest, physical path) for a read: this process's checkpoint being written, else the committed."""
        name, rest = self._split(path)
        if name in self._staged:
            return name, rest, self._phys(self._staged[name], rest)
        found = self._visible().get(name)
        if found is None:
            raise FileNotFoundError(path)
        return name, rest, self._phys(found.prefix, rest)

    def _guard(self, action: str) -> None:
        """Before any write: take the claim on the first one (Fenced if a higher A has claimed), else check."""
        with self._lock:
            if not self.fence.claimed:
                self.fence.claim()
            else:
                self.fence.check(action)

    def _stage(self, name: str) -> str:
        with self._lock:
            if name not in self._staged:
                label = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80] or "x"
                self._staged[name] = self.fence.new_prefix(label)
            return self._staged[name]

    # ------------------------------------------------------------------------------------------ the fence

    def commit(self, name: str) -> Checkpoint:
        """Commit the checkpoint ``name`` this process has written: the fenced step (``Fenced`` if stale)."""
        name, rest = self._split(name)
        if rest or name not in self._staged:
            raise InvalidInput(f"{name!r} is not a checkpoint this process is writing")
        return self._commit(name, self._staged.pop(name))

    def _commit(self, name: str, prefix: str) -> Checkpoint:
        if isinstance(self.fs, LocalFileSystem):
            path = Path(self._phys(prefix, ""))
            if not path.exists():
                path.mkdir(parents=True)
            _fsync_tree(path)
        with self._lock:
            return self.fence.commit_prefix(prefix, step=_step_of(name), name=name, action=f"commit {name}")

    def resume(self) -> str | None:
        """The name of the newest committed checkpoint of the highest ``A`` (None if there is none)."""
        with self._lock:
            latest = self.fence.latest()
        return None if latest is None else latest.name

    def checkpoints(self) -> list[Checkpoint]:
        """Committed checkpoints that count and were not rotated away, oldest first."""
        with self._lock:
            return self.fence.checkpoints()

    def rotate(self, keep: int) -> list[str]:
        """Keep the newest ``keep`` checkpoints; delete older ones (fenced; see ``Fence.rotate``). Their names."""
        with self._lock:
            self._guard("rotate")
            return [c.name for c in self.fence.rotate(keep)]

    # ------------------------------------------------------------------------------------------ fsspec

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        if "r" in mode and "+" not in mode:
            return self.fs.open(self._resolve(path)[2], mode, **kwargs)
        name, rest = self._split(path)
        if not name or not rest:
            raise InvalidInput(f"{path!r}: a fenced filesystem holds checkpoint directories: write <name>/<file>")
        if "a" in mode or "+" in mode:
            raise InvalidInput(f"{path!r}: mode {mode!r}: a fenced checkpoint's files are written whole ('wb')")
        self._guard(f"write {path}")
        phys = self._phys(self._stage(name), rest)
        if isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(phys.rsplit("/", 1)[0], exist_ok=True)
        return self.fs.open(phys, mode.replace("x", "w"), **kwargs)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        name, rest = self._split(path)
        if not name:
            return
        self._guard(f"mkdir {path}")
        phys = self._phys(self._stage(name), rest)
        if isinstance(self.fs, LocalFileSystem):
            self.fs.makedirs(phys, exist_ok=True)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.mkdir(path)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: Any = None, **kwargs: Any) -> None:
        n1, r1 = self._split(path1)
        n2, r2 = self._split(path2)
        self._guard(f"rename {path1} to {path2}")
        if n1 in self._staged and not r1 and not r2 and n2 != n1:
            if n2 in self._staged:
                raise InvalidInput(f"{path2!r} is being written by this process too; rename onto it is ambiguous")
            self._commit(n2, self._staged.pop(n1))  # a checkpoint directory renamed into place: the commit
            return
        if n1 in self._staged and r1 and n2 == n1 and r2:
            prefix = self._staged[n1]
            self.fs.mv(self._phys(prefix, r1), self._phys(prefix, r2))
            if r2.rsplit("/", 1)[-1] in self.markers:
                self._commit(n1, self._staged.pop(n1))  # a marker renamed into place: the commit
            return
        raise InvalidInput(f"rename {path1!r} to {path2!r}: a fenced filesystem renames a checkpoint being written "
                           "into place, or a file inside it; a committed checkpoint is never changed")

    rename = mv

    def rm_file(self, path: str) -> None:
        self.rm(path)

    def _rm(self, path: str) -> None:
        self.rm(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        for one in path if isinstance(path, list) else [path]:
            name, rest = self._split(one)
            if not name:
                raise InvalidInput("the fenced root itself is never removed")
            self._guard(f"remove {one}")
            if name in self._staged:
                target = self._phys(self._staged[name], rest)
                if not rest:
                    self._staged.pop(name)
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(target, recursive=True)
                continue
            found = self._visible().get(name)
            if found is None:
                raise FileNotFoundError(one)
            if rest:
                raise InvalidInput(f"{one!r}: a committed checkpoint is never changed; remove the whole {name!r}")
            with self._lock:
                self.fence.delete(found)

    def rmdir(self, path: str) -> None:
        self.rm(path, recursive=True)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        name, rest = self._split(path)
        if not name:
            names = sorted({*self._visible(), *self._staged})
            out: list[dict[str, Any]] = [{"name": n, "type": "directory", "size": 0} for n in names]
        else:
            _n, _r, phys = self._resolve(path)
            base = phys[: len(phys) - len(rest)].rstrip("/") if rest else phys
            out = []
            for info in self.fs.ls(phys, detail=True):
                inner = str(info["name"]).rstrip("/")
                if not inner.startswith(base):
                    inner = "/" + inner if ("/" + inner).startswith(base) else inner
                out.append({**info, "name": f"{name}/{inner[len(base):].lstrip('/')}".rstrip("/")})
        return out if detail else [o["name"] for o in out]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        name, rest = self._split(path)
        if not name:
            return {"name": "", "type": "directory", "size": 0}
        _n, _r, phys = self._resolve(path)
        if not rest:
            return {"name": name, "type": "directory", "size": 0}
        info = dict(self.fs.info(phys))
        info["name"] = f"{name}/{rest}"
        return info

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)

    def created(self, path: str) -> Any:
        return self.fs.created(self._resolve(path)[2])

    def modified(self, path: str) -> Any:
        return self.fs.modified(self._resolve(path)[2])

