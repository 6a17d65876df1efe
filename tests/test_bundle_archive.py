"""Bundle archives: `toolauthz bundle build` writes the same bytes for the same signed
bundle, and the reader refuses every archive a hostile bundle server could send
(traversal, links, device files, FIFOs, duplicates, too many files, a gzip bomb) whole,
in memory, before any of it is trusted."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import subprocess
import sys
import tarfile
import zlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolauthz.bundle import archive
from toolauthz.bundle.archive import ArchiveError, ArchiveLimits, archive_snapshot, build_archive, read_archive
from toolauthz.bundle.signature import SIGNATURE_FILE, SignatureError, bundle_files, sign_bundle, verify_bundle
from toolauthz.bundle.snapshot import BundleSnapshot
from toolauthz.bundle.verified import load_verified
from toolauthz.errors import BundleError

TOOLAUTHZ = pathlib.Path(sys.executable).parent / "toolauthz"


def signed(bundle: pathlib.Path, key: Ed25519PrivateKey, revision: int) -> pathlib.Path:
    (bundle / SIGNATURE_FILE).write_bytes(sign_bundle(bundle, key, "ci-1", revision))
    return bundle


def tar_gz(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buffer.getvalue()


def entry(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE,
          link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, data


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def test_build_then_read_gives_exactly_the_signed_files(bundle_dir, key):
    signed(bundle_dir, key, 3)
    (bundle_dir / "tests" / "extra.yaml").write_text("cases: []\n")  # never signed, never packed
    files = read_archive(build_archive(bundle_dir))
    assert set(files) == set(bundle_files(bundle_dir)) | {SIGNATURE_FILE}
    assert all(files[name] == (bundle_dir / name).read_bytes() for name in files)
    assert verify_bundle(BundleSnapshot.of(files, "a.tar.gz"), {"ci-1": key.public_key()}).revision == 3
    with pytest.raises(TypeError):
        files["refunds.cedar"] = b"permit (principal, action, resource);"  # type: ignore[index]


def test_the_archive_is_deterministic(bundle_dir, key):
    signed(bundle_dir, key, 3)
    first = build_archive(bundle_dir)
    for path in bundle_dir.rglob("*"):
        os.utime(path, (1, 1))  # other times on disk (a fresh checkout) change nothing
    assert build_archive(bundle_dir) == first


def test_build_refuses_an_unsigned_bundle_and_one_changed_since_signing(bundle_dir, key):
    with pytest.raises(SignatureError, match="not signed"):
        build_archive(bundle_dir)
    signed(bundle_dir, key, 3)
    (bundle_dir / "refunds.cedar").write_text((bundle_dir / "refunds.cedar").read_text() + "\n")
    with pytest.raises(SignatureError, match="`refunds.cedar` changed since the bundle was signed"):
        build_archive(bundle_dir)
    (bundle_dir / "added.cedar").write_text("")
    with pytest.raises(SignatureError, match="`added.cedar`"):
        build_archive(bundle_dir)


def test_the_cli_builds_the_archive(bundle_dir, key, tmp_path):
    signed(bundle_dir, key, 4)
    out = tmp_path / "bundle.tar.gz"
    done = subprocess.run([str(TOOLAUTHZ), "bundle", "build", str(bundle_dir), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == build_archive(bundle_dir)
    assert hashlib.sha256(out.read_bytes()).hexdigest() in done.stdout
    (bundle_dir / SIGNATURE_FILE).unlink()
    done = subprocess.run([str(TOOLAUTHZ), "bundle", "build", str(bundle_dir), "-o", str(tmp_path / "x.tar.gz")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "refused: the bundle is not signed" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "x.tar.gz").exists()


def test_the_cli_verifies_an_archive_as_the_poller_does(bundle_dir, key, tmp_path):
    from cryptography.hazmat.primitives import serialization as ser

    public = tmp_path / "ci-1.pub"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    good = tmp_path / "bundle.tar.gz"
    good.write_bytes(build_archive(signed(bundle_dir, key, 6)))
    verify = [str(TOOLAUTHZ), "bundle", "verify", "--public-key", f"ci-1={public}"]
    done = subprocess.run([*verify, str(good)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "revision 6" in done.stdout, done.stderr
    done = subprocess.run([*verify, "--min-revision", "7", str(good)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "revision 6 is below the floor, 7" in done.stderr
    hostile = tmp_path / "hostile.tar.gz"
    hostile.write_bytes(tar_gz(entry("refunds.cedar", kind=tarfile.SYMTYPE, link="/etc/passwd")))
    done = subprocess.run([*verify, str(hostile)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "`refunds.cedar` is a symlink" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("member, message", [
    (entry("../refunds.cedar"), "is not a plain relative path"),
    (entry("tools/../../etc/passwd"), "is not a plain relative path"),
    (entry("/etc/passwd"), "is not a plain relative path"),
    (entry("./refunds.cedar"), "is not a plain relative path"),
    (entry("a\\..\\b.cedar"), "is not a plain relative path"),
    (entry("evil\n.cedar"), "is not a plain relative path"),
    (entry("refunds.cedar", kind=tarfile.SYMTYPE, link="/etc/passwd"), "is a symlink"),
    (entry("refunds.cedar", kind=tarfile.LNKTYPE, link="orders.cedar"), "is a hard link"),
    (entry("dev.cedar", kind=tarfile.CHRTYPE), "is a device file"),
    (entry("disk.cedar", kind=tarfile.BLKTYPE), "is a device file"),
    (entry("pipe.cedar", kind=tarfile.FIFOTYPE), "is a FIFO"),
    (entry("sparse.cedar", kind=tarfile.GNUTYPE_SPARSE), "is a sparse file"),
    (entry("contiguous.cedar", kind=tarfile.CONTTYPE), "is not a regular file"),
    (entry("/".join(["d"] * 20) + "/x.cedar"), "deeper than 16 directories"),
    (entry("x" * 2000), "longer than 1024 characters"),
])
def test_a_hostile_entry_refuses_the_whole_archive(member, message):
    data = tar_gz(entry("orders.cedar", b"permit (principal, action, resource);"), member)
    with pytest.raises(ArchiveError, match=message):
        read_archive(data)


def test_a_name_twice_or_as_file_and_directory_is_refused():
    with pytest.raises(ArchiveError, match="`refunds.cedar` is in the archive twice"):
        read_archive(tar_gz(entry("refunds.cedar", b"a"), entry("refunds.cedar", b"b")))
    with pytest.raises(ArchiveError, match="`tools` is both a file and a directory"):
        read_archive(tar_gz(entry("tools", b"a"), entry("tools/x.yaml", b"b")))


def test_ten_thousand_files_are_refused():
    data = tar_gz(*(entry(f"tools/t{i}.yaml", b"") for i in range(10_000)))
    with pytest.raises(ArchiveError, match="more than 5000 files"):
        read_archive(data)


def gzip_bomb(files: int, each: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = []
    for index in range(files):
        header = tarfile.TarInfo(f"bomb{index}.cedar")
        header.size = each
        parts.append(compressor.compress(header.tobuf(format=tarfile.PAX_FORMAT)))
        parts += [compressor.compress(bytes(1 << 20)) for _ in range(each >> 20)]
    return b"".join(parts) + compressor.flush()


def test_a_member_declaring_more_than_the_bound_is_refused_before_it_is_read():
    header = tarfile.TarInfo("big.cedar")
    header.size = 100 << 20
    with pytest.raises(ArchiveError, match=f"`big.cedar` is larger than {4 << 20} bytes"):
        read_archive(gzip.compress(header.tobuf(format=tarfile.PAX_FORMAT), mtime=0),
                     ArchiveLimits(max_uncompressed_bytes=4 << 20))


def test_a_gzip_bomb_is_stopped_as_soon_as_it_passes_the_bound(monkeypatch):
    """100 MB of zeros in about 100 KB of gzip, as 50 files of 2 MiB (each under the
    bound, so only the stream's cap can stop them): the reader inflates at most the bound
    plus one step before it refuses, whatever the bomb would grow to."""
    bomb = gzip_bomb(files=50, each=2 << 20)
    assert len(bomb) < 1 << 20
    inflated = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self, *args, **kwargs):
            self._inner = real(*args, **kwargs)

        def decompress(self, data, max_length=0):
            out = self._inner.decompress(data, max_length)
            inflated.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(archive.zlib, "decompressobj", Counting)
    cap = 4 << 20
    with pytest.raises(ArchiveError, match=f"inflates to more than {cap} bytes"):
        read_archive(bomb, ArchiveLimits(max_uncompressed_bytes=cap))
    assert cap < sum(inflated) <= cap + 64 * 1024


@pytest.mark.parametrize("data, message", [
    (b"", "truncated"),
    (b"not gzip at all", "not valid gzip"),
    (gzip.compress(b"not a tar file" * 100, mtime=0), "not a valid tar.gz"),
])
def test_garbage_is_refused_with_a_clear_error(data, message):
    with pytest.raises(ArchiveError, match=message):
        read_archive(data)


def test_data_after_the_gzip_stream_and_oversized_archives_are_refused(bundle_dir, key):
    good = build_archive(signed(bundle_dir, key, 1))
    with pytest.raises(ArchiveError, match="data after the end"):
        read_archive(good + gzip.compress(b"more", mtime=0))
    with pytest.raises(ArchiveError, match="larger than 1024 bytes"):
        read_archive(good, ArchiveLimits(max_compressed_bytes=1024))


def test_an_archive_verifies_and_loads_from_its_snapshot_and_tampering_is_refused(bundle_dir, key):
    """The archive's files become a snapshot and load through the one verifying loader
    (verified.py), as a directory's do: nothing is written to disk."""
    data = build_archive(signed(bundle_dir, key, 9))
    keys = {"ci-1": key.public_key()}
    snapshot = archive_snapshot(data, "https://bundles.test/b.tar.gz")
    bundle = load_verified(snapshot, keys)
    assert bundle.revision == 9 and bundle.signer == "ci-1" and "issue_refund" in bundle.tools
    assert bundle.digest == snapshot.digest
    files = read_archive(data)

    def load(changed: dict[str, bytes], floor: int | None = None):
        return load_verified(BundleSnapshot.of(changed, "archive"), keys, floor)

    with pytest.raises(BundleError, match="altered: `refunds.cedar`"):
        load({**files, "refunds.cedar": b"permit (principal, action, resource);"})
    with pytest.raises(BundleError, match="revision 9 is below the floor, 10"):
        load(dict(files), 10)
    with pytest.raises(BundleError, match="not signed: `extra.cedar`"):
        load({**files, "extra.cedar": b""})


def test_an_archive_over_the_snapshot_bounds_is_refused(bundle_dir, key):
    """The archive's own bounds pass it, a snapshot's bound on depth does not: the
    archive is held to what a directory is held to."""
    deep = "/".join(["d"] * 10) + "/x.cedar"
    data = tar_gz(entry(deep, b"permit (principal, action, resource);"))
    assert deep in read_archive(data)
    with pytest.raises(ArchiveError, match="deeper than 8 directories"):
        archive_snapshot(data, "archive")


def test_a_sparse_member_declaring_a_huge_size_is_refused_before_it_is_read():
    """A GNU sparse header with no data and a real size of 256 MiB: tarfile would hand
    back 256 MiB of zeros from a few hundred bytes, past the gzip stream's cap."""
    info = tarfile.TarInfo("holes.cedar")
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[483:495] = b"%011o\0" % (256 << 20)  # the real size of the sparse file
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header[:512])
    data = gzip.compress(bytes(header) + bytes(1024), mtime=0)
    with pytest.raises(ArchiveError, match="`holes.cedar` is a sparse file"):
        read_archive(data)
