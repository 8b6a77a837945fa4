#!/usr/bin/env python3
"""Reproducible OCI image layers and layouts, with nothing but the standard library.

`build.sh` gets the pieces (a Debian root filesystem from mmdebstrap, locked wheels
installed with uv, the project's wheel, llama-server); this file turns them into
layers and images whose bytes depend only on those pieces:

- every tar entry is sorted by path, owned by 0:0 unless a rule says otherwise, and
  stamped with SOURCE_DATE_EPOCH; files from directories get 0644/0755 (whatever the
  builder's umask was), directories 0755;
- gzip streams carry no name and mtime 0;
- configs, manifests and indexes are JSON with sorted keys and no whitespace.

Subcommands:
  layer OUT --epoch N [--tar TAR] [--dir SRC=DEST[::GLOB]]... (only the files matching
        GLOB) [--drop GLOB]... [--keep GLOB]... (exceptions to --drop)
        [--chown PATH=UID:GID]... [--mode PATH=OCTAL]... [--file DEST=SRC]...
        [--text DEST=CONTENT]... [--symlink DEST=TARGET]... [--mkdir DEST]...
      writes OUT (tar+gzip) and OUT.json ({"digest", "diffID", "size"})
  debian-status TAR OUTDIR
      reads the .deb files kept in an mmdebstrap tarball (var/cache/apt/archives) and
      writes OUTDIR/var/lib/dpkg/status.d/<package> (what scanners read in images without
      dpkg) and OUTDIR/packages.txt ("name version sha256" of every .deb)
  image OUTDIR --epoch N --ref NAME:TAG --config JSON --layer OUT.tar.gz...
      writes an OCI image layout (oci-layout, index.json, blobs/sha256/...) into OUTDIR and
      OUTDIR.tar (the same layout as an oci-archive); prints the manifest digest
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import stat
import sys
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GZIP_LEVEL = 6
CHUNK = 1 << 20
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class HashingWriter(io.RawIOBase):
    """Counts and hashes what passes through to `target`."""

    def __init__(self, target: io.RawIOBase | io.BufferedIOBase) -> None:
        self.target = target
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        view = memoryview(data)
        self.sha.update(view)
        self.size += len(view)
        self.target.write(view)
        return len(view)


@dataclass
class Entry:
    """One tar member to write: metadata plus where its bytes come from."""

    info: tarfile.TarInfo
    source_tar: tarfile.TarFile | None = None
    source_member: tarfile.TarInfo | None = None
    source_path: Path | None = None
    content: bytes | None = None


def _norm(path: str) -> str:
    while path.startswith("./"):
        path = path[2:]
    return path.strip("/")


def _matches(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _dir_info(name: str, epoch: int, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = epoch
    return info


def _stamp(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    info.mtime = epoch
    info.uname = info.gname = ""
    info.pax_headers = {}
    return info


def collect(args: argparse.Namespace) -> dict[str, Entry]:
    epoch: int = args.epoch
    entries: dict[str, Entry] = {}
    by_name: dict[str, tarfile.TarInfo] = {}
    if args.tar:
        source = tarfile.open(args.tar)  # noqa: SIM115  (read until the layer is written)
        for member in source.getmembers():
            name = _norm(member.name)
            by_name[name] = member
            if not name or (_matches(name, args.drop) and not _matches(name, args.keep)):
                continue
            if member.ischr() or member.isblk() or member.isfifo():
                continue  # the runtime provides /dev
            info = _stamp(member, epoch)
            info.name = name
            info.uid = info.gid = 0
            entries[name] = Entry(info=info, source_tar=source, source_member=member)
    for spec in args.dir:
        spec, _, only = spec.partition("::")
        src, _, dest = spec.partition("=")
        root = Path(src)
        dest = _norm(dest)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            name = f"{dest}/{rel}" if dest else rel
            if _matches(name, args.drop) and not _matches(name, args.keep):
                continue
            if only and not path.is_dir() and not fnmatch.fnmatchcase(name, only):
                continue
            st = path.lstat()
            info = tarfile.TarInfo(name)
            info.mtime = epoch
            if stat.S_ISLNK(st.st_mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                info.mode = 0o777
                entries[name] = Entry(info=info)
            elif stat.S_ISDIR(st.st_mode):
                entries[name] = Entry(info=_dir_info(name, epoch))
            elif stat.S_ISREG(st.st_mode):
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o100 else 0o644
                entries[name] = Entry(info=info, source_path=path)
    for spec in args.file:
        dest, _, src = spec.partition("=")
        name = _norm(dest)
        path = Path(src)
        info = tarfile.TarInfo(name)
        info.size = path.stat().st_size
        info.mode = 0o755 if path.stat().st_mode & 0o100 else 0o644
        info.mtime = epoch
        entries[name] = Entry(info=info, source_path=path)
    for spec in args.text:
        dest, _, content = spec.partition("=")
        name = _norm(dest)
        data = content.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = epoch
        entries[name] = Entry(info=info, content=data)
    for spec in args.symlink:
        dest, _, target = spec.partition("=")
        name = _norm(dest)
        info = tarfile.TarInfo(name)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        info.mtime = epoch
        entries[name] = Entry(info=info)
    for dest in args.mkdir:
        name = _norm(dest)
        entries[name] = Entry(info=_dir_info(name, epoch))
    # parents of everything, so the layer unpacks the same on any runtime
    for name in list(entries):
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in entries:
                entries[parent] = Entry(info=_dir_info(parent, epoch))
    for spec in args.mode:
        path, _, mode = spec.partition("=")
        entries[_norm(path)].info.mode = int(mode, 8)
    for spec in args.chown:
        path, _, owner = spec.partition("=")
        uid, _, gid = owner.partition(":")
        info = entries[_norm(path)].info
        info.uid, info.gid = int(uid), int(gid or uid)
    # hard links whose target was dropped become regular files
    for entry in entries.values():
        info = entry.info
        if info.type == tarfile.LNKTYPE and _norm(info.linkname) not in entries:
            target = by_name[_norm(info.linkname)]
            info.type = tarfile.REGTYPE
            info.size = target.size
            entry.source_member = target
        elif info.type == tarfile.LNKTYPE:
            info.linkname = _norm(info.linkname)
    return entries


def _open(entry: Entry) -> io.BufferedIOBase | io.BytesIO | None:
    if entry.content is not None:
        return io.BytesIO(entry.content)
    if entry.source_path is not None:
        return entry.source_path.open("rb")
    if entry.source_tar is not None and entry.source_member is not None and entry.info.isreg():
        return entry.source_tar.extractfile(entry.source_member)  # type: ignore[return-value]
    return None


def write_layer(args: argparse.Namespace) -> None:
    entries = collect(args)
    out = Path(args.out)
    tmp = out.with_suffix(out.suffix + ".part")
    with tmp.open("wb") as raw:
        compressed = HashingWriter(raw)
        with gzip.GzipFile(
            filename="", fileobj=compressed, mode="wb", compresslevel=GZIP_LEVEL, mtime=0
        ) as gz:  # type: ignore[arg-type]
            uncompressed = HashingWriter(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=uncompressed, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for name in sorted(entries):
                    entry = entries[name]
                    entry.info.name = name + "/" if entry.info.isdir() else name
                    fileobj = _open(entry)
                    tar.addfile(entry.info, fileobj)
                    if fileobj is not None:
                        fileobj.close()
    tmp.rename(out)
    meta = {
        "digest": "sha256:" + compressed.sha.hexdigest(),
        "diffID": "sha256:" + uncompressed.sha.hexdigest(),
        "size": compressed.size,
        "uncompressedSize": uncompressed.size,
    }
    Path(str(out) + ".json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    print(json.dumps(meta, sort_keys=True))


# --- Debian package records ------------------------------------------------------


def _ar_members(data: bytes) -> Iterator[tuple[str, bytes]]:
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        pos += 60
        yield name, data[pos : pos + size]
        pos += size + (size % 2)


def _control_of(deb: bytes) -> str:
    for name, member in _ar_members(deb):
        if not name.startswith("control.tar"):
            continue
        if name.endswith(".xz"):
            member = lzma.decompress(member)
        elif name.endswith(".gz"):
            member = zlib.decompress(member, 16 + zlib.MAX_WBITS)
        elif name.endswith(".zst"):
            raise ValueError("zstd-compressed control archives are not supported")
        with tarfile.open(fileobj=io.BytesIO(member)) as tar:
            for m in tar.getmembers():
                if _norm(m.name) == "control":
                    f = tar.extractfile(m)
                    assert f is not None
                    return f.read().decode()
    raise ValueError("no control file in .deb")


def debian_status(args: argparse.Namespace) -> None:
    out = Path(args.outdir)
    status_dir = out / "var" / "lib" / "dpkg" / "status.d"
    status_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    with tarfile.open(args.tar) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = _norm(member.name)
            if not (name.startswith("var/cache/apt/archives/") and name.endswith(".deb")):
                continue
            f = tar.extractfile(member)
            assert f is not None
            deb = f.read()
            control = _control_of(deb)
            fields = dict(
                line.split(": ", 1)
                for line in control.splitlines()
                if ": " in line and not line.startswith(" ")
            )
            package, version = fields["Package"], fields["Version"]
            text = control.rstrip("\n") + "\n"
            if "Status:" not in text:
                text = text.replace(
                    f"Package: {package}\n",
                    f"Package: {package}\nStatus: install ok installed\n",
                    1,
                )
            (status_dir / package).write_text(text)
            lines.append(f"{package} {version} {hashlib.sha256(deb).hexdigest()}")
    if not lines:
        raise SystemExit(
            "debian-status: no .deb files in the tarball (mmdebstrap --skip=cleanup/apt/cache?)"
        )
    (out / "packages.txt").write_text("\n".join(sorted(lines)) + "\n")
    print(f"{len(lines)} Debian packages")


# --- images ------------------------------------------------------------------------


def _put_blob(blobs: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}"


def _archive(layout: Path, out: Path, epoch: int) -> None:
    """The layout as an oci-archive tar (what `skopeo copy oci-archive:` and
    `ctr images import` read), written with the same rules as the layers."""
    tmp = out.with_suffix(out.suffix + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted([layout, *layout.rglob("*")]):
            rel = path.relative_to(layout).as_posix()
            if rel == ".":
                continue
            info = tarfile.TarInfo(rel + ("/" if path.is_dir() else ""))
            info.mtime = epoch
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = path.stat().st_size
                info.mode = 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
    tmp.rename(out)


def write_image(args: argparse.Namespace) -> None:
    layout = Path(args.outdir)
    if layout.exists():
        shutil.rmtree(layout)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    created = datetime.datetime.fromtimestamp(args.epoch, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    image_config = json.loads(args.config)
    layers, diff_ids, history = [], [], []
    for path in args.layer:
        meta = json.loads(Path(path + ".json").read_text())
        digest = meta["digest"]
        target = blobs / digest.split(":", 1)[1]
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
        layers.append({"mediaType": MEDIA_LAYER, "digest": digest, "size": meta["size"]})
        diff_ids.append(meta["diffID"])
        history.append({"created": created, "created_by": f"kama deploy/images: {Path(path).name}"})
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    config_bytes = canonical_json(config)
    config_digest = _put_blob(blobs, config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": layers,
        "annotations": {
            "org.opencontainers.image.created": created,
            **{
                k: v
                for k, v in (image_config.get("Labels") or {}).items()
                if k.startswith("org.opencontainers.image.")
            },
        },
    }
    manifest_bytes = canonical_json(manifest)
    manifest_digest = _put_blob(blobs, manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    # `umoci`/`skopeo` read the tag, `ctr images import` the full name
                    "org.opencontainers.image.ref.name": args.ref.rsplit(":", 1)[1],
                    "io.containerd.image.name": args.ref,
                },
            }
        ],
    }
    (layout / "index.json").write_bytes(canonical_json(index))
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    _archive(layout, Path(str(layout) + ".tar"), args.epoch)
    print(manifest_digest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    layer = sub.add_parser("layer")
    layer.add_argument("out")
    layer.add_argument("--epoch", type=int, required=True)
    layer.add_argument("--tar")
    for flag in ("dir", "drop", "keep", "chown", "mode", "file", "text", "symlink", "mkdir"):
        layer.add_argument(f"--{flag}", action="append", default=[])
    layer.set_defaults(func=write_layer)
    status = sub.add_parser("debian-status")
    status.add_argument("tar")
    status.add_argument("outdir")
    status.set_defaults(func=debian_status)
    image = sub.add_parser("image")
    image.add_argument("outdir")
    image.add_argument("--epoch", type=int, required=True)
    image.add_argument("--ref", required=True)
    image.add_argument("--config", required=True)
    image.add_argument("--layer", action="append", required=True)
    image.set_defaults(func=write_image)
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
