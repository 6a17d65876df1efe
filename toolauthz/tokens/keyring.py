"""The key ring (which keys sign and verify, by kid) and the key directory it is loaded
from: a manifest, `keyring.json`, beside PKCS#8 PEM key files (mode 0600).

    {"version": 1, "keys": [{"file": "key-1800000000-1a2b3c4d.pem", "kid": "k4.pid.…",
      "state": "active" | "published" | "retired",
      "created_at": 1800000000, "retired_at": null}]}

Exactly one key is `active` and signs. A `published` key verifies (and is announced by
GetKeys) before it signs, so verifiers learn it first. A `retired` key verifies until
retired_at + grace, where grace is the longest token lifetime plus leeway, and not after.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyseto import KeyInterface

from toolauthz.clock import Clock
from toolauthz.errors import ConflictError, KeyFileError, NotFoundError
from toolauthz.tokens.keys import (
    KEY_FILE_NAME,
    KeyInfo,
    SigningKey,
    create_private_file,
    generate_key_file,
    load_private_key_file,
    public_jwk,
)

MANIFEST = "keyring.json"
STATES = ("active", "published", "retired")


# ---------------------------------------------------------------- the key ring

@dataclass(frozen=True)
class _Entry:
    key: SigningKey
    state: str
    created_at: float
    retired_at: float | None
    file: str | None = None

    def verifies_until(self, grace: float) -> float | None:
        return None if self.retired_at is None else self.retired_at + grace

    def info(self, now: float, grace: float) -> KeyInfo:
        until = self.verifies_until(grace)
        k = self.key
        return KeyInfo(k.kid, self.state, self.created_at, self.retired_at, k.public_key.to_paserk(),
                       public_jwk(k.public_bytes, k.kid), until, until is None or now <= until, self.file)


class KeyRing:
    """The signing key plus every key that may still verify, looked up by kid."""

    def __init__(self, entries: Iterable[_Entry], *, grace_seconds: float, created_key: KeyInfo | None = None):
        if grace_seconds < 0:
            raise ValueError("grace_seconds must not be negative")
        self._entries = {e.key.kid: e for e in entries}
        active = [e for e in self._entries.values() if e.state == "active"]
        if len(active) != 1:
            raise ValueError(f"a key ring needs exactly one active key, not {len(active)}")
        self.signing: SigningKey = active[0].key
        self.grace_seconds = grace_seconds
        self.created_key = created_key  # the key load_keyring(create_if_missing=True) generated

    @classmethod
    def from_keys(cls, *, active: SigningKey, others: Iterable[tuple[SigningKey, str, float | None]] = (),
                  grace_seconds: float, created_at: float = 0.0) -> KeyRing:
        """An in-memory ring; `others` are (key, "published" | "retired", retired_at)."""
        entries = [_Entry(active, "active", created_at, None)]
        for key, state, retired_at in others:
            if state not in ("published", "retired") or (state == "retired") != (retired_at is not None):
                raise ValueError(f"`{state}` with retired_at `{retired_at}` is not a valid other key")
            entries.append(_Entry(key, state, created_at, retired_at))
        return cls(entries, grace_seconds=grace_seconds)

    def verification_key(self, kid: object, now: float) -> KeyInterface | None:
        """The public key for `kid`, or None when unknown or past its grace period."""
        entry = self._entries.get(kid) if isinstance(kid, str) else None
        if entry is None:
            return None
        until = entry.verifies_until(self.grace_seconds)
        return entry.key.public_key if until is None or now <= until else None

    def public_keys(self, now: float) -> list[KeyInfo]:
        """Every key that verifies at `now` (for GetKeys), active first."""
        infos = [e.info(now, self.grace_seconds) for e in self._entries.values()]
        return sorted((i for i in infos if i.verifies), key=lambda i: (STATES.index(i.state), -i.created_at))


# ---------------------------------------------------------------- the key directory

def _check_not_writable_by_others(path: str, st: os.stat_result, what: str) -> None:
    # Whoever can replace the manifest chooses which keys we trust.
    if st.st_mode & 0o022:
        raise KeyFileError(f"{what} `{path}` has mode {stat.S_IMODE(st.st_mode):04o}; "
                           "it must not be writable by group or others")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read_manifest(keys_dir: str) -> list[_Entry]:
    path = os.path.join(keys_dir, MANIFEST)
    try:
        with open(path, "rb") as f:
            _check_not_writable_by_others(path, os.fstat(f.fileno()), "key manifest")
            doc = json.loads(f.read())
    except FileNotFoundError:
        raise KeyFileError(f"key directory `{keys_dir}` has no `{MANIFEST}`; generate a key first") from None
    except (OSError, ValueError) as err:
        raise KeyFileError(f"cannot read key manifest `{path}`: {err}") from None
    if not isinstance(doc, dict) or set(doc) != {"version", "keys"} or doc["version"] != 1 \
            or not isinstance(doc["keys"], list):
        raise KeyFileError(f"key manifest `{path}` must be {{\"version\": 1, \"keys\": [...]}}")
    entries: list[_Entry] = []
    for i, k in enumerate(doc["keys"]):
        where = f"key manifest `{path}`: key {i}"
        if not isinstance(k, dict) or set(k) != {"file", "kid", "state", "created_at", "retired_at"}:
            raise KeyFileError(f"{where} must have exactly file, kid, state, created_at, retired_at")
        if not isinstance(k["file"], str) or not KEY_FILE_NAME.fullmatch(k["file"]):
            raise KeyFileError(f"{where}: file `{k['file']}` must be a plain file name in the key directory")
        if k["state"] not in STATES or not _number(k["created_at"]) \
                or (k["state"] == "retired") != _number(k["retired_at"]) \
                or (k["state"] != "retired" and k["retired_at"] is not None):
            raise KeyFileError(f"{where}: state `{k['state']}`, created_at and retired_at are inconsistent")
        key = load_private_key_file(os.path.join(keys_dir, k["file"]))
        if key.kid != k["kid"]:
            raise KeyFileError(f"{where}: file `{k['file']}` has kid `{key.kid}`, not `{k['kid']}`")
        entries.append(_Entry(key, k["state"], k["created_at"], k["retired_at"], k["file"]))
    if len({e.key.kid for e in entries}) != len(entries):
        raise KeyFileError(f"key manifest `{path}` lists a key twice")
    if [e.state for e in entries].count("active") != 1:
        raise KeyFileError(f"key manifest `{path}` must have exactly one active key")
    return entries


def _write_manifest(keys_dir: str, entries: list[_Entry]) -> None:
    doc = {"version": 1, "keys": [
        {"file": e.file, "kid": e.key.kid, "state": e.state, "created_at": e.created_at, "retired_at": e.retired_at}
        for e in entries]}
    tmp = os.path.join(keys_dir, f".{MANIFEST}.{secrets.token_hex(8)}.tmp")
    create_private_file(tmp, (json.dumps(doc, indent=2) + "\n").encode())
    try:
        os.replace(tmp, os.path.join(keys_dir, MANIFEST))  # readers see the old or the new, never half
    except BaseException:
        os.unlink(tmp)
        raise
    dfd = os.open(keys_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)  # make the rename itself durable
    finally:
        os.close(dfd)


@contextmanager
def _locked(keys_dir: str, *, create: bool) -> Iterator[None]:
    """Serialize read-modify-write of the manifest between CLI invocations."""
    if create:
        try:
            os.makedirs(keys_dir, mode=0o700)
            os.chmod(keys_dir, 0o700)  # the umask may have narrowed it; make it exact
        except FileExistsError:
            pass
    try:
        dfd = os.open(keys_dir, os.O_RDONLY)
    except OSError as err:
        raise KeyFileError(f"cannot open key directory `{keys_dir}`: {err.strerror}") from None
    try:
        _check_not_writable_by_others(keys_dir, os.fstat(dfd), "key directory")
        fcntl.flock(dfd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(dfd)  # also releases the lock


def _entries_or_empty(keys_dir: str) -> list[_Entry]:
    return _read_manifest(keys_dir) if os.path.exists(os.path.join(keys_dir, MANIFEST)) else []


def _epoch(clock: Clock) -> int:
    return int(clock.now())  # whole seconds, like the token times (floored the same way)


def _generate(d: str, clock: Clock, *, only_if_empty: bool) -> KeyInfo | None:
    with _locked(d, create=True):
        entries = _entries_or_empty(d)
        if entries and only_if_empty:
            return None  # another process created the first key meanwhile
        now = _epoch(clock)
        name = f"key-{now}-{secrets.token_hex(4)}.pem"
        generate_key_file(os.path.join(d, name))
        new = _Entry(load_private_key_file(os.path.join(d, name)), "published" if entries else "active",
                     now, None, name)
        try:
            _write_manifest(d, entries + [new])
        except BaseException:
            os.unlink(os.path.join(d, name))
            raise
        return new.info(now, 0)


def generate_key(keys_dir: str | os.PathLike[str], *, clock: Clock) -> KeyInfo:
    """Add a new key: the first becomes active, later ones are published (verify, not sign)."""
    info = _generate(os.fspath(keys_dir), clock, only_if_empty=False)
    assert info is not None
    return info


def activate_key(keys_dir: str | os.PathLike[str], kid: str, *, clock: Clock) -> None:
    """Make the published key `kid` the signer; the current active key retires now."""
    d = os.fspath(keys_dir)
    with _locked(d, create=False):
        entries = _read_manifest(d)
        target = next((e for e in entries if e.key.kid == kid), None)
        if target is None:
            raise NotFoundError(f"no key `{kid}` in `{d}`")
        if target.state != "published":
            raise ConflictError(f"key `{kid}` is {target.state}; only a published key can be activated")
        now = _epoch(clock)
        _write_manifest(d, [
            _Entry(e.key, "retired", e.created_at, now, e.file) if e.state == "active"
            else _Entry(e.key, "active", e.created_at, None, e.file) if e is target else e
            for e in entries])


def list_keys(keys_dir: str | os.PathLike[str], *, clock: Clock, grace_seconds: float) -> list[KeyInfo]:
    """Every key in the manifest, in manifest order; `verifies` says whether it still does."""
    d = os.fspath(keys_dir)
    with _locked(d, create=False):
        return [e.info(clock.now(), grace_seconds) for e in _read_manifest(d)]


def load_keyring(keys_dir: str | os.PathLike[str], *, grace_seconds: float, clock: Clock,
                 create_if_missing: bool = False) -> KeyRing:
    """Load the ring; with create_if_missing, first create the dir (0700) and one active key.

    When a key was created, `ring.created_key` says which, so the caller can log it.
    """
    d = os.fspath(keys_dir)
    created = None
    if create_if_missing and not os.path.exists(os.path.join(d, MANIFEST)):
        created = _generate(d, clock, only_if_empty=True)
    with _locked(d, create=False):
        return KeyRing(_read_manifest(d), grace_seconds=grace_seconds, created_key=created)
