"""Key files, the key directory and the key ring (adversarial cases 2, 14, 15)."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa, x25519
from pyseto import Key

from toolauthz.clock import FrozenClock
from toolauthz.errors import ConflictError, KeyFileError, NotFoundError
from toolauthz.tokens.keyring import MANIFEST, KeyRing, activate_key, generate_key, list_keys, load_keyring
from toolauthz.tokens.keys import SigningKey, generate_key_file, load_private_key_file

T0 = 1_800_000_000
GRACE = 65


def b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def write(path, data: bytes, mode: int = 0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)
    os.chmod(path, mode)  # exact, whatever the umask
    return path


def pkcs8(key) -> bytes:
    return key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())


def refused(path, *fragments: str) -> str:
    """Loading `path` fails with a Cedar-style message naming it."""
    with pytest.raises(KeyFileError) as info:
        load_private_key_file(path)
    msg = str(info.value)
    assert f"`{path}`" in msg
    assert msg[0].islower() and not msg.endswith(".") and "\n" not in msg
    for fragment in fragments:
        assert fragment in msg
    return msg


@pytest.fixture
def clock():
    return FrozenClock(T0)


@pytest.fixture
def keys_dir(tmp_path):
    return str(tmp_path / "keys")


# ---------------------------------------------------------------- key files

def test_generated_file_is_0600_and_loads(tmp_path):
    path = tmp_path / "k.pem"
    kid = generate_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    key = load_private_key_file(path)
    assert key.kid == kid and kid.startswith("k4.pid.") and len(kid) == 7 + 44
    assert key.kid == Key.from_paserk(key.public_key.to_paserk()).to_paserk_id()


def test_generated_file_is_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        generate_key_file(tmp_path / "k.pem")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "k.pem").st_mode) == 0o600


def test_generate_never_overwrites(tmp_path):
    path = write(tmp_path / "k.pem", b"existing")
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key_file(path)
    assert path.read_bytes() == b"existing"


def test_missing_file(tmp_path):
    refused(tmp_path / "nope.pem", "does not exist")


@pytest.mark.parametrize("make, kind", [
    (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "RSA"),
    (lambda: ec.generate_private_key(ec.SECP256R1()), "EC"),
    (lambda: x25519.X25519PrivateKey.generate(), "X25519"),
])
def test_wrong_key_type(tmp_path, make, kind):
    path = write(tmp_path / "k.pem", pkcs8(make()))
    refused(path, f"`{kind}`", "not an Ed25519 private key")


def test_traditional_ec_pem_is_refused(tmp_path):
    pem = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.TraditionalOpenSSL, ser.NoEncryption())
    refused(write(tmp_path / "k.pem", pem), "not an Ed25519 private key")


def test_public_key_is_refused(tmp_path):
    pub = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    refused(write(tmp_path / "k.pem", pub), "public key")


def test_public_paserk_is_refused(tmp_path):
    paserk = SigningKey.generate().public_key.to_paserk().encode()
    refused(write(tmp_path / "k.paserk", paserk), "not an Ed25519 private key")


@pytest.mark.parametrize("data", [
    b"", b"garbage", os.urandom(64), b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n",
    b"k4.secret.", b"k4.secret.AAAA", b"k4.secret-pw.AAAA", "k4.secret.\u00e9".encode(), b"x" * 20000,
])
def test_garbage_is_refused(tmp_path, data):
    refused(write(tmp_path / "k.pem", data))


def test_encrypted_pem_is_refused(tmp_path):
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(b"pw"))
    refused(write(tmp_path / "k.pem", pem), "encrypted")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601, 0o610, 0o700 | 0o004])
def test_open_modes_are_refused(tmp_path, mode):
    path = write(tmp_path / "k.pem", pkcs8(ed25519.Ed25519PrivateKey.generate()), mode)
    refused(path, f"{mode:04o}", "group or others")


def test_mode_0400_is_fine(tmp_path):
    load_private_key_file(write(tmp_path / "k.pem", pkcs8(ed25519.Ed25519PrivateKey.generate()), 0o400))


def test_directory_is_refused(tmp_path):
    (tmp_path / "d").mkdir(mode=0o700)
    refused(tmp_path / "d", "not a regular file")


def test_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "k.pem", 0o600)
    refused(tmp_path / "k.pem", "not a regular file")


def test_paserk_secret_file_loads_to_the_same_key(tmp_path):
    private = ed25519.Ed25519PrivateKey.generate()
    from_pem = load_private_key_file(write(tmp_path / "k.pem", pkcs8(private)))
    paserk = from_pem.key.to_paserk()
    assert paserk.startswith("k4.secret.")
    from_paserk = load_private_key_file(write(tmp_path / "k.paserk", paserk.encode() + b"\n"))
    assert from_paserk.kid == from_pem.kid and from_paserk.public_bytes == from_pem.public_bytes


def test_paserk_secret_with_a_foreign_public_half_is_refused(tmp_path):
    a, b = SigningKey.generate(), SigningKey.generate()
    raw = b64d(a.key.to_paserk().removeprefix("k4.secret."))
    forged = "k4.secret." + base64.urlsafe_b64encode(raw[:32] + b.public_bytes).rstrip(b"=").decode()
    refused(write(tmp_path / "k.paserk", forged.encode()), "does not match")


def test_symlink_is_checked_by_its_target_mode(tmp_path):
    target = write(tmp_path / "k.pem", pkcs8(ed25519.Ed25519PrivateKey.generate()), 0o644)
    (tmp_path / "link.pem").symlink_to(target)
    refused(tmp_path / "link.pem", "0644")


# ---------------------------------------------------------------- key directory

def manifest(keys_dir) -> dict:
    with open(os.path.join(keys_dir, MANIFEST)) as f:
        return json.load(f)


def test_first_key_active_then_published(keys_dir, clock):
    a = generate_key(keys_dir, clock=clock)
    clock.advance(10)
    b = generate_key(keys_dir, clock=clock)
    assert (a.state, b.state) == ("active", "published")
    assert stat.S_IMODE(os.stat(keys_dir).st_mode) == 0o700
    doc = manifest(keys_dir)
    assert doc == {"version": 1, "keys": [
        {"file": a.file, "kid": a.kid, "state": "active", "created_at": T0, "retired_at": None},
        {"file": b.file, "kid": b.kid, "state": "published", "created_at": T0 + 10, "retired_at": None}]}
    for entry in doc["keys"]:
        assert stat.S_IMODE(os.stat(os.path.join(keys_dir, entry["file"])).st_mode) == 0o600
    assert sorted(os.listdir(keys_dir)) == sorted([MANIFEST, a.file, b.file])  # no temp files left
    ring = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    assert ring.signing.kid == a.kid and ring.created_key is None


def test_missing_dir_is_refused_without_create(keys_dir, clock):
    with pytest.raises(KeyFileError, match="cannot open key directory"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    os.mkdir(keys_dir, 0o700)
    with pytest.raises(KeyFileError, match="has no `keyring.json`"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)


def test_create_if_missing(keys_dir, clock):
    ring = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock, create_if_missing=True)
    assert ring.created_key is not None and ring.created_key.kid == ring.signing.kid
    assert stat.S_IMODE(os.stat(keys_dir).st_mode) == 0o700
    assert [k["state"] for k in manifest(keys_dir)["keys"]] == ["active"]
    again = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock, create_if_missing=True)
    assert again.created_key is None and again.signing.kid == ring.signing.kid


def test_activate_switches_the_signer_and_retires_the_old_key(keys_dir, clock):
    a = generate_key(keys_dir, clock=clock)
    b = generate_key(keys_dir, clock=clock)
    clock.advance(100)
    activate_key(keys_dir, b.kid, clock=clock)
    ring = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    assert ring.signing.kid == b.kid
    states = {k["kid"]: (k["state"], k["retired_at"]) for k in manifest(keys_dir)["keys"]}
    assert states == {a.kid: ("retired", T0 + 100), b.kid: ("active", None)}
    # The retired key verifies until retired_at + grace, inclusive, and not after.
    assert ring.verification_key(a.kid, T0 + 100 + GRACE) is not None
    assert ring.verification_key(a.kid, T0 + 100 + GRACE + 0.001) is None
    assert ring.verification_key(a.kid, T0 + 100 + GRACE + 1) is None
    infos = {i.kid: i for i in list_keys(keys_dir, clock=FrozenClock(T0 + 100 + GRACE + 1), grace_seconds=GRACE)}
    assert infos[a.kid].verifies is False and infos[a.kid].verifies_until == T0 + 100 + GRACE
    assert infos[b.kid].verifies is True and infos[b.kid].verifies_until is None


def test_activate_refuses_unknown_active_and_retired(keys_dir, clock):
    a = generate_key(keys_dir, clock=clock)
    b = generate_key(keys_dir, clock=clock)
    with pytest.raises(NotFoundError):
        activate_key(keys_dir, "k4.pid." + "A" * 44, clock=clock)
    with pytest.raises(ConflictError, match="active"):
        activate_key(keys_dir, a.kid, clock=clock)
    activate_key(keys_dir, b.kid, clock=clock)
    with pytest.raises(ConflictError, match="retired"):
        activate_key(keys_dir, a.kid, clock=clock)


def edit_manifest(keys_dir, change) -> None:
    doc = manifest(keys_dir)
    change(doc)
    path = os.path.join(keys_dir, MANIFEST)
    with open(path, "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d["keys"][0].update(kid="k4.pid." + "B" * 44), "has kid"),
    (lambda d: d["keys"][0].update(file="../../etc/passwd"), "plain file name"),
    (lambda d: d["keys"][0].update(file="/etc/passwd"), "plain file name"),
    (lambda d: d["keys"][1].update(state="active"), "exactly one active"),
    (lambda d: d["keys"][0].update(state="retired"), "inconsistent"),
    (lambda d: d["keys"][1].update(state="revoked"), "inconsistent"),
    (lambda d: d["keys"].append(dict(d["keys"][1])), "twice"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d["keys"][0].update(extra=1), "exactly"),
])
def test_tampered_manifest_is_refused(keys_dir, clock, change, fragment):
    generate_key(keys_dir, clock=clock)
    generate_key(keys_dir, clock=clock)
    edit_manifest(keys_dir, change)
    with pytest.raises(KeyFileError, match=fragment):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)


def test_every_key_file_is_checked(keys_dir, clock):
    generate_key(keys_dir, clock=clock)
    b = generate_key(keys_dir, clock=clock)  # published, not signing: still checked
    os.chmod(os.path.join(keys_dir, b.file), 0o644)
    with pytest.raises(KeyFileError, match="0644"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    os.remove(os.path.join(keys_dir, b.file))
    with pytest.raises(KeyFileError, match="does not exist"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)


def test_writable_manifest_or_dir_is_refused(keys_dir, clock):
    generate_key(keys_dir, clock=clock)
    os.chmod(os.path.join(keys_dir, MANIFEST), 0o666)
    with pytest.raises(KeyFileError, match="writable by group or others"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    os.chmod(os.path.join(keys_dir, MANIFEST), 0o600)
    os.chmod(keys_dir, 0o777)
    with pytest.raises(KeyFileError, match="writable by group or others"):
        load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)


# ---------------------------------------------------------------- the ring in memory

def test_kid_is_only_a_lookup_key():
    ring = KeyRing.from_keys(active=SigningKey.generate(), grace_seconds=GRACE)
    for kid in ["../../etc/passwd", "", "k4.pid." + "A" * 44, "' OR 1=1 --", None, 7, ["x"], {"a": 1}]:
        assert ring.verification_key(kid, T0) is None


def test_published_verifies_and_retired_has_a_window():
    active, published, retired = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    ring = KeyRing.from_keys(active=active, others=[(published, "published", None), (retired, "retired", T0)],
                             grace_seconds=GRACE)
    assert ring.signing is active
    assert ring.verification_key(published.kid, T0 + 10**6) is published.public_key
    assert ring.verification_key(retired.kid, T0 + GRACE) is retired.public_key
    assert ring.verification_key(retired.kid, T0 + GRACE + 1) is None
    assert [i.state for i in ring.public_keys(T0)] == ["active", "published", "retired"]
    assert [i.kid for i in ring.public_keys(T0 + GRACE + 1)] == [active.kid, published.kid]
    assert not any(i.paserk.startswith("k4.secret") for i in ring.public_keys(T0))


def test_from_keys_refuses_inconsistent_states():
    k = SigningKey.generate()
    with pytest.raises(ValueError):
        KeyRing.from_keys(active=k, others=[(SigningKey.generate(), "retired", None)], grace_seconds=GRACE)
    with pytest.raises(ValueError):
        KeyRing.from_keys(active=k, others=[(SigningKey.generate(), "active", None)], grace_seconds=GRACE)
    with pytest.raises(ValueError):
        KeyRing.from_keys(active=k, grace_seconds=-1)


def test_jwk_and_paserk_round_trip_to_the_same_public_key():
    key = SigningKey.generate()
    ring = KeyRing.from_keys(active=key, others=[(SigningKey.generate(), "published", None)], grace_seconds=GRACE)
    for info in ring.public_keys(T0):
        jwk = info.jwk
        assert {k: jwk[k] for k in ("kty", "crv", "use", "alg")} == \
            {"kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA"}
        assert jwk["kid"] == info.kid and "=" not in jwk["x"] and "d" not in jwk
        from_jwk = b64d(jwk["x"])
        assert info.paserk.startswith("k4.public.")
        from_paserk = b64d(info.paserk.removeprefix("k4.public."))
        assert from_jwk == from_paserk and len(from_jwk) == 32
        # The PASERK id of the published PASERK is the kid, computed independently by pyseto.
        assert Key.from_paserk(info.paserk).to_paserk_id() == info.kid
        # And the raw key really is the one that signs.
        ed25519.Ed25519PublicKey.from_public_bytes(from_jwk)
    assert b64d(ring.public_keys(T0)[0].jwk["x"]) == key.public_bytes
    d = ring.public_keys(T0)[0].to_dict()
    assert set(d) == {"kid", "paserk", "jwk", "state", "created_at", "retired_at", "verifies_until"}
