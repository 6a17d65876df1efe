"""A bundle as bytes, read once: the whole directory in memory, within bounds.

Everything that acts on a bundle (the signature check, the loader, the catalog the
gateway is served) takes a `BundleSnapshot`, never a path, so what is verified is
exactly what is parsed and enforced: a file swapped on disk after the read cannot
matter, because nothing reads the disk again. A bundle from elsewhere (an archive a
bundle server serves) becomes the same kind of snapshot and loads the same way
(`BundleSnapshot.of`).

The reader is bounded before it trusts anything: the number of files, the depth of
directories, each file's size and the total. It reads regular files only (no FIFO,
socket or device; a FIFO planted in the bundle never blocks it), and a symlink only
when it leads to a regular file inside the bundle; every file is checked on the
descriptor actually opened (fstat), not on its path. `tests/` at the top (policy tests,
never loaded) is left out, as the signature leaves it out.

This module imports no policy engine: light tools can read and digest a bundle.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from toolauthz.errors import BundleError, Problem

SIGNATURE_FILE = ".signatures.json"
UNSIGNED_DIRS = ("tests",)  # top-level directories that are not part of the bundle
TOOL_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class SnapshotLimits:
    """What a bundle may hold at most. The defaults take the largest bundle of the
    benchmarks (1,000 tools, 10,000 policies: 12 MB) with room to spare."""

    max_files: int = 5_000
    max_depth: int = 8  # directories below the bundle's root
    max_file_bytes: int = 16 << 20
    max_total_bytes: int = 64 << 20
    max_signature_bytes: int = 4 << 20  # `.signatures.json`: a manifest of 20,000 files


DEFAULT_LIMITS = SnapshotLimits()


class BundleSnapshot(Mapping[str, bytes]):
    """An immutable bundle: POSIX relative path -> bytes, with the digest of them all.
    `source` names where it came from (a directory, a URL), for messages only."""

    __slots__ = ("_files", "source", "digest")

    def __init__(self, files: Mapping[str, bytes], source: str):
        self._files = dict(sorted(files.items()))
        self.source = source
        self.digest = _digest(self._files)

    @classmethod
    def of(cls, files: Mapping[str, bytes], source: str, limits: SnapshotLimits = DEFAULT_LIMITS) -> BundleSnapshot:
        """A snapshot of files already in memory (an unpacked archive), held to the same
        names and bounds as a directory read."""
        problems: list[Problem] = []
        total = 0
        if len(files) > limits.max_files:
            raise BundleError([Problem(source, f"the bundle has more than {limits.max_files} files")])
        for name, data in files.items():
            if not isinstance(data, bytes) or not plain_path(name):
                problems.append(Problem(source, f"`{name[:200]!r}` is not a plain relative path to a file"))
                continue
            if name.count("/") > limits.max_depth:
                problems.append(Problem(name, f"is deeper than {limits.max_depth} directories"))
            cap = limits.max_signature_bytes if name == SIGNATURE_FILE else limits.max_file_bytes
            if len(data) > cap:
                problems.append(Problem(name, f"is larger than {cap} bytes"))
            total += len(data)
        if total > limits.max_total_bytes:
            problems.append(Problem(source, f"the bundle is larger than {limits.max_total_bytes} bytes"))
        if problems:
            raise BundleError(problems)
        return cls({n: d for n, d in files.items() if n.split("/")[0] not in UNSIGNED_DIRS}, source)

    def __getitem__(self, name: str) -> bytes:
        return self._files[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"BundleSnapshot({self.source!r}, {len(self._files)} files, {self.digest[:16]})"

    @property
    def version(self) -> str:
        """The short form of the digest that status, metrics and audit records show."""
        return self.digest[:16]

    def tool_files(self) -> dict[str, bytes]:
        """`tools/<name>` -> bytes of every tool file (directly under `tools/`)."""
        return {name: data for name, data in self._files.items()
                if name.startswith("tools/") and name.count("/") == 1 and name.endswith(TOOL_SUFFIXES)}

    def text(self, name: str) -> str:
        """A file as UTF-8 text; KeyError when absent, UnicodeDecodeError when not UTF-8."""
        return self._files[name].decode("utf-8")


def _digest(files: Mapping[str, bytes]) -> str:
    """SHA-256 over every file in name order, each as `name NUL length NUL bytes`: a
    name and its content cannot run into the next."""
    h = hashlib.sha256()
    for name, data in files.items():
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def plain_path(name: str) -> bool:
    """A relative POSIX path with no `..`, `.`, empty part, backslash or NUL."""
    parts = name.split("/")
    return (0 < len(name) <= 1024 and "\\" not in name and "\x00" not in name and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in parts))


def read_snapshot(directory: str | os.PathLike[str], limits: SnapshotLimits = DEFAULT_LIMITS) -> BundleSnapshot:
    """Every file of the bundle in `directory`, read once, or BundleError naming what was
    refused. `directory` is resolved once; every path below it is read relative to it."""
    base = os.path.realpath(directory)
    try:
        if not stat.S_ISDIR(os.stat(base).st_mode):
            raise BundleError([Problem(str(directory), "bundle directory does not exist")])
    except FileNotFoundError:
        raise BundleError([Problem(str(directory), "bundle directory does not exist")]) from None
    except OSError as exc:
        raise BundleError([Problem(str(directory), f"cannot read the bundle directory: {exc.strerror}")]) from None
    reader = _Reader(base, limits)
    reader.walk("", 0)
    if reader.problems:
        raise BundleError(reader.problems)
    return BundleSnapshot(reader.files, str(directory))


class _Reader:
    """One walk of a bundle directory, counting what it reads against the limits."""

    def __init__(self, base: str, limits: SnapshotLimits):
        self.base = base
        self.limits = limits
        self.files: dict[str, bytes] = {}
        self.problems: list[Problem] = []
        self.total = 0
        self.entries = 0  # files and directories seen, bounded by max_files too

    def walk(self, rel_dir: str, depth: int) -> None:
        here = os.path.join(self.base, rel_dir) if rel_dir else self.base
        names: list[str] = []
        try:
            with os.scandir(here) as entries:
                for entry in entries:  # lazily: a directory of a million entries is refused early
                    self.entries += 1
                    if self.entries > self.limits.max_files:
                        self.problems.append(Problem(rel_dir or ".", f"the bundle has more than "
                                                     f"{self.limits.max_files} files and directories"))
                        return
                    names.append(entry.name)
        except OSError as exc:
            self.problems.append(Problem(rel_dir or ".", f"cannot list directory: {exc.strerror}"))
            return
        for name in sorted(names):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if not rel_dir and name in UNSIGNED_DIRS:
                continue
            if self.problems:
                return  # one refusal is enough: stop reading a hostile tree
            self._entry(os.path.join(here, name), rel, depth)

    def _entry(self, path: str, rel: str, depth: int) -> None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            self.problems.append(Problem(rel, f"cannot read: {exc.strerror}"))
            return
        if stat.S_ISDIR(st.st_mode):
            if depth + 1 > self.limits.max_depth:
                self.problems.append(Problem(rel, f"is deeper than {self.limits.max_depth} directories"))
            else:
                self.walk(rel, depth + 1)
            return
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(path)
            if os.path.commonpath([self.base, target]) != self.base:
                self.problems.append(Problem(rel, "is a symlink out of the bundle"))
                return
            path = target
        elif not stat.S_ISREG(st.st_mode):
            self.problems.append(Problem(rel, "is not a regular file"))
            return
        if len(self.files) >= self.limits.max_files:
            self.problems.append(Problem(rel, f"the bundle has more than {self.limits.max_files} files"))
            return
        data = self._read(path, rel, follow=stat.S_ISLNK(st.st_mode))
        if data is not None:
            self.files[rel] = data

    def _read(self, path: str, rel: str, *, follow: bool) -> bytes | None:
        # O_NONBLOCK: a FIFO swapped in after the lstat must not hang the reader; the
        # fstat below refuses it. O_NOFOLLOW: a file swapped for a symlink is refused.
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
        cap = self.limits.max_signature_bytes if rel == SIGNATURE_FILE else self.limits.max_file_bytes
        limit = min(cap, self.limits.max_total_bytes - self.total)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            self.problems.append(Problem(rel, f"cannot open: {exc.strerror}"))
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                what = "a symlink to something other than a file" if follow else "not a regular file"
                self.problems.append(Problem(rel, f"is {what}"))
                return None
            if st.st_size > limit:  # refused by its size before a byte of it is read
                self._too_large(rel, cap, limit)
                return None
            chunks: list[bytes] = []
            size = 0
            while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            self.problems.append(Problem(rel, f"cannot read: {exc.strerror}"))
            return None
        finally:
            os.close(fd)
        if size > limit:  # it grew after the fstat
            self._too_large(rel, cap, limit)
            return None
        self.total += size
        return b"".join(chunks)

    def _too_large(self, rel: str, cap: int, limit: int) -> None:
        if limit < cap:
            self.problems.append(Problem(rel, f"takes the bundle over {self.limits.max_total_bytes} bytes"))
        else:
            self.problems.append(Problem(rel, f"is larger than {cap} bytes"))
