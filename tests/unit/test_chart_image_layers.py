"""deploy/images/oci.py, the standard-library writer of the images' layers and layouts:
the same files give the same bytes whatever their times, owners and the builder's
umask; the layout is one a runtime can read (index → manifest → config, digests and
sizes that match); .deb control records become dpkg status files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from kamadev.binaries import REPO_ROOT

OCI = REPO_ROOT / "deploy" / "images" / "oci.py"
EPOCH = 1704067200


def oci(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(OCI), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def tree(root: Path, *, mtime: int, umask_mode: int) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    files = {
        "pkg/__init__.py": b"",
        "pkg/sub/data.bin": bytes(range(256)) * 40,
        "pkg/tool": b"#!/opt/kama/bin/python\nprint('hi')\n",
    }
    for rel, data in files.items():
        path = root / rel
        path.write_bytes(data)
        path.chmod(umask_mode | (0o111 if rel == "pkg/tool" else 0))
        os.utime(path, (mtime, mtime))
    (root / "pkg" / "link").symlink_to("tool")
    return root


def layer(tmp: Path, source: Path, name: str) -> dict[str, Any]:
    out = tmp / f"{name}.tar.gz"
    oci(
        "layer", str(out), "--epoch", str(EPOCH), "--dir", f"{source}=/opt/app",
        "--mkdir", "home/nonroot", "--chown", "home/nonroot=65532:65532",
        "--drop", "opt/app/pkg/sub/*", "--keep", "opt/app/pkg/sub/data.bin",
    )  # fmt: skip
    meta: dict[str, Any] = json.loads(Path(str(out) + ".json").read_text())
    assert meta["digest"] == "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest()
    assert meta["size"] == out.stat().st_size
    return meta


def test_layers_depend_only_on_content(tmp_path: Path) -> None:
    a = tree(tmp_path / "a", mtime=1_600_000_000, umask_mode=0o644)
    b = tree(tmp_path / "b", mtime=1_700_000_000, umask_mode=0o664)  # other times, group-write
    first, second = layer(tmp_path, a, "a"), layer(tmp_path, b, "b")
    assert first == second

    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
    names = [m.name.rstrip("/") for m in members]
    assert names == sorted(names)
    assert {m.mtime for m in members} == {EPOCH}
    by_name = {m.name.rstrip("/"): m for m in members}
    assert (
        by_name["opt/app/pkg/tool"].mode == 0o755
        and by_name["opt/app/pkg/__init__.py"].mode == 0o644
    )
    assert by_name["opt/app/pkg/link"].issym() and by_name["opt/app/pkg/link"].linkname == "tool"
    assert (by_name["home/nonroot"].uid, by_name["home/nonroot"].gid) == (65532, 65532)
    assert {m.uid for n, m in by_name.items() if n != "home/nonroot"} == {0}
    assert "opt" in by_name and "opt/app" in by_name  # parents are explicit
    with gzip.open(tmp_path / "a.tar.gz") as gz:
        diff_id = "sha256:" + hashlib.sha256(gz.read()).hexdigest()
    assert diff_id == first["diffID"]


def test_image_layout_is_consistent_and_reproducible(tmp_path: Path) -> None:
    source = tree(tmp_path / "src", mtime=1_650_000_000, umask_mode=0o644)
    meta = layer(tmp_path, source, "app")
    config = json.dumps({"User": "65532:65532", "Entrypoint": ["/opt/app/pkg/tool"]})
    digests = []
    for name in ("one", "two"):
        digests.append(
            oci(
                "image", str(tmp_path / name), "--epoch", str(EPOCH), "--ref", "kama.dev/app:1",
                "--config", config, "--layer", str(tmp_path / "app.tar.gz"),
            ).strip()
        )  # fmt: skip
    assert digests[0] == digests[1]
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()

    layout = tmp_path / "one"
    blobs = layout / "blobs" / "sha256"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["digest"] == digests[0]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1"
    manifest_bytes = (blobs / entry["digest"].split(":")[1]).read_bytes()
    assert len(manifest_bytes) == entry["size"]
    manifest = json.loads(manifest_bytes)
    for descriptor in [manifest["config"], *manifest["layers"]]:
        blob = (blobs / descriptor["digest"].split(":")[1]).read_bytes()
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == descriptor["digest"]
        assert len(blob) == descriptor["size"]
    image_config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    assert image_config["rootfs"]["diff_ids"] == [meta["diffID"]]
    assert image_config["config"]["User"] == "65532:65532"
    assert image_config["created"] == "2024-01-01T00:00:00Z"


def _ar(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, data in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out.write(header.encode() + data + (b"\n" if len(data) % 2 else b""))
    return out.getvalue()


def test_debian_status_records_come_from_the_debs(tmp_path: Path) -> None:
    control = b"Package: libfoo1\nVersion: 1.2-3\nArchitecture: amd64\nDescription: foo\n"
    control_tar = io.BytesIO()
    with tarfile.open(fileobj=control_tar, mode="w:gz") as tar:
        info = tarfile.TarInfo("./control")
        info.size = len(control)
        tar.addfile(info, io.BytesIO(control))
    deb = _ar(
        {"debian-binary": b"2.0\n", "control.tar.gz": control_tar.getvalue(), "data.tar.xz": b""}
    )
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("./var/cache/apt/archives/libfoo1_1.2-3_amd64.deb")
        info.size = len(deb)
        tar.addfile(info, io.BytesIO(deb))
    oci("debian-status", str(rootfs), str(tmp_path / "out"))
    status = (tmp_path / "out" / "var" / "lib" / "dpkg" / "status.d" / "libfoo1").read_text()
    assert status.startswith("Package: libfoo1\nStatus: install ok installed\nVersion: 1.2-3")
    packages = (tmp_path / "out" / "packages.txt").read_text()
    assert packages == f"libfoo1 1.2-3 {hashlib.sha256(deb).hexdigest()}\n"
