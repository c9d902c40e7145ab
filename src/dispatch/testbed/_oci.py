"""One-layer OCI image archives from local files, for the real node's images.

The testbed has no registry and need not have podman: the sandbox (pause) and workload images are static
programs built here, so an image is just those files in one layer plus a config naming the entrypoint.
The archive is what ``ctr images import`` reads (an OCI image layout in a tar). Every timestamp and owner
is fixed, so the same files always give the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
_INDEX = "application/vnd.oci.image.index.v1+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _dirs_of(paths: Sequence[str]) -> list[str]:
    """Every parent directory the layer's entries need, parents first (a tar without them still unpacks
    with containerd, but explicit entries give the directories a fixed mode)."""
    out: set[str] = set()
    for p in paths:
        parts = p.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(out, key=lambda d: (d.count("/"), d))


def layer(files: Mapping[str, Path], links: Mapping[str, str] | None = None) -> bytes:
    """An uncompressed layer tar: ``files`` maps a path in the image to a local file; ``links`` maps more
    paths in the image to one of those paths (hard links, so aliases cost no space)."""
    links = dict(links or {})
    names = [p.strip("/") for p in files] + [p.strip("/") for p in links]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in _dirs_of(names):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        modes: dict[str, int] = {}
        for dst, src in sorted(files.items()):
            data = src.read_bytes()
            info = tarfile.TarInfo(dst.strip("/"))
            info.size = len(data)
            info.mode = modes[dst] = src.stat().st_mode & 0o777
            tar.addfile(info, io.BytesIO(data))
        for dst, target in sorted(links.items()):
            if target not in files:
                raise ValueError(f"link {dst} -> {target}: {target} is not one of the image's files")
            info = tarfile.TarInfo(dst.strip("/"))
            info.type = tarfile.LNKTYPE
            info.linkname = target.strip("/")
            # The unpacker applies a link's mode to the one inode it shares: it must be the target's own.
            info.mode = modes[target]
            tar.addfile(info)
    return raw.getvalue()


def archive(
    out: Path,
    ref: str,
    entrypoint: Sequence[str],
    files: Mapping[str, Path],
    *,
    links: Mapping[str, str] | None = None,
    env: Sequence[str] = ("PATH=/usr/local/bin:/usr/bin:/bin:/",),
    arch: str = "amd64",
) -> str:
    """Write an OCI archive of one image named ``ref`` to ``out``; returns the manifest's digest."""
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image reference {ref!r} needs a tag")
    layer_tar = layer(files, links)
    layer_gz = gzip.compress(layer_tar, compresslevel=6, mtime=0)
    config = _json({
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": list(entrypoint), "Env": list(env)},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar)]},
    })
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": {"mediaType": _CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": _LAYER, "digest": _digest(layer_gz), "size": len(layer_gz)}],
    })
    index = _json({
        "schemaVersion": 2,
        "mediaType": _INDEX,
        "manifests": [{
            "mediaType": _MANIFEST,
            "digest": _digest(manifest),
            "size": len(manifest),
            "platform": {"architecture": arch, "os": "linux"},
            # containerd names the imported image by the first annotation; OCI tools by the second.
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        }],
    })
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        add("index.json", index)
        for blob in (layer_gz, config, manifest):
            add("blobs/sha256/" + _digest(blob).removeprefix("sha256:"), blob)
    tmp.replace(out)
    return _digest(manifest)
