"""Bundle archives: a signed bundle as one deterministic tar.gz, and the reader that
turns such bytes, from whoever sent them, into an immutable mapping of
POSIX relative path -> file bytes, or refuses them whole.

The reader treats the archive as hostile (it comes from a bundle server, or anyone who
can answer in its place before the signature is checked). It decompresses by streaming
with a cap, so a gzip bomb is stopped as soon as it has produced one byte more than the
bound, never after; it counts files, and bounds each path's length and depth; it takes
regular files and directories only (a symlink, hard link, device file, FIFO or sparse
file refuses the archive), and refuses `..`, absolute paths, a name twice, and a name that is both a
file and a directory. Nothing is ever written to disk: `archive_snapshot` makes the files a
`BundleSnapshot` (snapshot.py), which verifies and loads as a directory's does (verified.py).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pathlib
import tarfile
import types
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from toolauthz.bundle.signature import MAX_SIGNATURE_BYTES, SIGNATURE_FILE, SignatureError, as_snapshot
from toolauthz.bundle.snapshot import BundleSnapshot, SnapshotLimits
from toolauthz.errors import BundleError, ToolAuthzError

# Read in steps of this size from the gzip stream, so that what one step can inflate to
# is bounded too (zlib's `max_length`).
_STEP = 64 * 1024
_CONTROL = {chr(c) for c in range(0x20)} | {"\x7f"}


class ArchiveError(ToolAuthzError):
    """The archive is malformed, over a bound, or holds what a bundle may not."""


@dataclass(frozen=True)
class ArchiveLimits:
    max_compressed_bytes: int = 16 << 20
    max_uncompressed_bytes: int = 64 << 20  # the tar stream: headers and every file
    max_files: int = 5_000
    max_depth: int = 16  # path components
    max_path_length: int = 1024  # as the signed manifest's names (signature.py)

    def snapshot_limits(self) -> SnapshotLimits:
        """The snapshot's bounds (depth, each file's size) with this archive's count and total."""
        return SnapshotLimits(max_files=self.max_files, max_total_bytes=self.max_uncompressed_bytes)


DEFAULT_LIMITS = ArchiveLimits()


def archive_snapshot(data: bytes, source: str, limits: ArchiveLimits = DEFAULT_LIMITS) -> BundleSnapshot:
    """The bundle the tar.gz `data` holds, as a snapshot held to a snapshot's bounds too,
    or ArchiveError. `source` names it in messages (the bundle server's URL, a file)."""
    files = read_archive(data, limits)
    try:
        return BundleSnapshot.of(files, source, limits.snapshot_limits())
    except BundleError as exc:
        raise ArchiveError("; ".join(str(problem) for problem in exc.problems[:5])) from None


class _CappedGunzip(io.RawIOBase):
    """The decompressed bytes of one gzip member, refusing (ArchiveError) to produce more
    than `cap` of them and refusing data after the member's end."""

    def __init__(self, data: bytes, cap: int):
        self._data = memoryview(data)
        self._offset = 0
        self._cap = cap
        self._produced = 0
        self._inflate = zlib.decompressobj(wbits=31)  # gzip header and trailer checked by zlib
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]  # io's signature
        while not self._pending:
            if self._inflate.eof:
                if self._inflate.unused_data or self._offset < len(self._data):
                    raise ArchiveError("the archive has data after the end of its gzip stream")
                return 0
            if self._inflate.unconsumed_tail:
                chunk = self._inflate.unconsumed_tail
            elif self._offset < len(self._data):
                chunk = bytes(self._data[self._offset:self._offset + _STEP])
                self._offset += len(chunk)
            else:
                raise ArchiveError("the archive is truncated: its gzip stream does not end")
            try:
                self._pending = self._inflate.decompress(chunk, _STEP)
            except zlib.error:
                raise ArchiveError("the archive is not valid gzip") from None
            self._produced += len(self._pending)
            if self._produced > self._cap:
                raise ArchiveError(f"the archive inflates to more than {self._cap} bytes")
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def read_archive(data: bytes, limits: ArchiveLimits = DEFAULT_LIMITS) -> Mapping[str, bytes]:
    """The files of the tar.gz `data`, path -> bytes (read-only), or ArchiveError."""
    if len(data) > limits.max_compressed_bytes:
        raise ArchiveError(f"the archive is larger than {limits.max_compressed_bytes} bytes")
    stream = io.BufferedReader(_CappedGunzip(data, limits.max_uncompressed_bytes), buffer_size=_STEP)
    files: dict[str, bytes] = {}
    directories: set[str] = set()
    try:
        # Stream mode ("r|"): one pass, no seeking back, members read in order.
        with tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="strict") as tar:
            for member in tar:
                name = _checked_name(member.name, limits)
                if member.isdir():
                    directories.add(name)
                    continue
                # Plain files only: tarfile's isreg() admits sparse and contiguous files too,
                # and a sparse file inflates to its declared size past the gzip cap.
                if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.issparse():
                    raise ArchiveError(f"`{_shown(name)}` is {_kind(member)}; a bundle archive holds regular "
                                       "files only")
                if member.size > limits.max_uncompressed_bytes:
                    raise ArchiveError(f"`{_shown(name)}` is larger than {limits.max_uncompressed_bytes} bytes")
                if name in files:
                    raise ArchiveError(f"`{_shown(name)}` is in the archive twice")
                if len(files) >= limits.max_files:
                    raise ArchiveError(f"the archive holds more than {limits.max_files} files")
                extracted = tar.extractfile(member)
                if extracted is None:  # isreg() members always have content; never trust it
                    raise ArchiveError(f"`{_shown(name)}` has no content")
                content = extracted.read()
                if len(content) != member.size:
                    raise ArchiveError(f"`{_shown(name)}` is truncated")
                files[name] = content
        # Read to the gzip stream's end (within the cap): its trailer is checked, and
        # data after it refused, even though the tar's end-of-archive came first.
        while stream.read(_STEP):
            pass
    except ArchiveError:
        raise
    except (tarfile.TarError, UnicodeError, EOFError, OSError, ValueError) as exc:
        raise ArchiveError(f"the archive is not a valid tar.gz: {_shown(str(exc))[:200]}") from None
    _check_layout(files, directories)
    return types.MappingProxyType(files)


def _checked_name(raw: str, limits: ArchiveLimits) -> str:
    name = raw[:-1] if raw.endswith("/") else raw  # a directory entry may end in `/`
    shown = _shown(name)
    if not name or len(name) > limits.max_path_length:
        raise ArchiveError(f"an archive path is empty or longer than {limits.max_path_length} characters")
    if name.startswith("/") or "\\" in name or any(ch in _CONTROL for ch in name):
        raise ArchiveError(f"`{shown}` is not a plain relative path")
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ArchiveError(f"`{shown}` is not a plain relative path (`.`, `..` or an empty part)")
    if len(parts) > limits.max_depth:
        raise ArchiveError(f"`{shown}` is deeper than {limits.max_depth} directories")
    return name


def _check_layout(files: Mapping[str, bytes], directories: set[str]) -> None:
    """No name may be a file and also a directory of another file."""
    for name in files:
        if name in directories:
            raise ArchiveError(f"`{_shown(name)}` is both a file and a directory")
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in files:
                raise ArchiveError(f"`{_shown('/'.join(parts[:depth]))}` is both a file and a directory")


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "a symlink"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    if member.issparse() or member.type == tarfile.GNUTYPE_SPARSE:
        return "a sparse file"
    return "not a regular file"


def _shown(text: str) -> str:
    """A name as an error message may quote it: one line, no control characters."""
    return "".join(ch if ch not in _CONTROL else f"\\x{ord(ch):02x}" for ch in text)[:300]


def build_archive(root: str | os.PathLike[str]) -> bytes:
    """The deterministic tar.gz of the signed bundle in `root`: the files its signature
    names, each read once and checked against its signed hash, plus the signature file;
    sorted, with fixed times, owners and modes, so that one signed bundle always gives
    the same bytes. SignatureError when the bundle is unsigned or its files are not what
    its signature names (sign again)."""
    base = pathlib.Path(root)
    snapshot = as_snapshot(base)  # read once: what is packed is what was checked
    signature = _signature_of(snapshot)
    signed = _signed_hashes(signature)
    on_disk = {name for name in snapshot if name != SIGNATURE_FILE}
    if on_disk != set(signed):
        changed = sorted(on_disk ^ set(signed))
        raise SignatureError(f"the bundle's files are not those its signature names ({_listed(changed)}): "
                             "sign it again")
    contents = {SIGNATURE_FILE: signature}
    for name in sorted(signed):
        data = snapshot[name]
        if hashlib.sha256(data).hexdigest() != signed[name]:
            raise SignatureError(f"`{name}` changed since the bundle was signed: sign it again")
        contents[name] = data
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(contents):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(contents[name]), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(contents[name]))
    return buffer.getvalue()


def _signature_of(snapshot: BundleSnapshot) -> bytes:
    data = snapshot.get(SIGNATURE_FILE)
    if data is None:
        raise SignatureError(f"the bundle is not signed: no `{SIGNATURE_FILE}` (run `toolauthz bundle sign`)")
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"`{SIGNATURE_FILE}` is larger than {MAX_SIGNATURE_BYTES} bytes")
    return data


def _signed_hashes(signature: bytes) -> dict[str, str]:
    """The names and hashes the signature's manifest lists, read without checking the
    signature (the builder need not hold the public key; every sidecar checks it)."""
    from joserfc import jws
    from joserfc.errors import JoseError

    try:
        token = json.loads(signature)["signatures"][0]
        payload = json.loads(jws.extract_compact(token.encode("ascii")).payload)
        return {entry["name"]: entry["hash"] for entry in payload["files"]}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, JoseError, RecursionError):
        raise SignatureError(f"`{SIGNATURE_FILE}` is not a bundle signature") from None


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{_shown(n)}`" for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
