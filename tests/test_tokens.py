"""Execution tokens (adversarial cases 1-4, 7, 15)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import struct
from dataclasses import replace
from datetime import UTC, datetime

import pyseto
import pytest
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from pyseto import Key

from toolauthz.clock import FrozenClock
from toolauthz.tokens import (
    DEFAULT_GRACE_SECONDS,
    CallClaims,
    TokenIssuer,
    TokenVerifier,
    verify_offline,
)
from toolauthz.tokens.keyring import KeyRing, activate_key, generate_key, load_keyring
from toolauthz.tokens.keys import SigningKey, load_private_key_file

T0 = 1_800_000_000
ISS, AUD = "toolauthz", "agent-runtime"
LIFE, LEEWAY = 60, 5
GRACE = LIFE + LEEWAY
CODES = {"ok", "malformed", "unknown_key", "bad_signature", "expired", "not_yet_valid", "wrong_audience",
         "claims_mismatch"}

CALL = CallClaims(tenant="acme", principal_type="User", principal_id="alice", tool="send_email", call_id="c-1")
ARGS = {"to": "bob@example.com", "amount": 10}


def digest_of(call: CallClaims, args: dict) -> str:
    """A stand-in for the sidecar's call digest: any change to the call changes it."""
    body = {"tool": call.tool, "input": args, "principal": {"type": call.principal_type, "id": call.principal_id},
            "tenant": call.tenant, "call_id": call.call_id}
    return "sha256:" + hashlib.sha256(b"toolauthz.call.v1\x00" + rfc8785.dumps(body)).hexdigest()


DIGEST = digest_of(CALL, ARGS)


def b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture
def clock():
    return FrozenClock(T0)


@pytest.fixture
def key():
    return SigningKey.generate()


@pytest.fixture
def ring(key):
    return KeyRing.from_keys(active=key, grace_seconds=GRACE)


@pytest.fixture
def issuer(ring, clock):
    return TokenIssuer(ring, issuer=ISS, audience=AUD, lifetime_seconds=LIFE, clock=clock)


@pytest.fixture
def verifier(ring, clock):
    return TokenVerifier(ring, issuer=ISS, audience=AUD, leeway_seconds=LEEWAY, clock=clock)


@pytest.fixture
def token(issuer):
    return issuer.issue(CALL, DIGEST, decision_id="d-1", policy_version="pv-1").token


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def claims_for(call=CALL, digest=DIGEST, **over) -> dict:
    c = {"iss": ISS, "aud": AUD, "sub": call.subject, "tenant": call.tenant, "tool": call.tool,
         "call_id": call.call_id, "dig": digest, "decision_id": "d-1", "policy_version": "pv-1", "jti": "j" * 32,
         "iat": rfc3339(T0), "nbf": rfc3339(T0), "exp": rfc3339(T0 + LIFE)}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def sign_raw(key: SigningKey, claims: dict | bytes, digest: str = DIGEST, footer: bytes | None = None) -> str:
    """Sign arbitrary claims with a real key, to reach the checks after the signature."""
    payload = claims if isinstance(claims, bytes) else json.dumps(claims).encode()
    foot = footer if footer is not None else json.dumps({"kid": key.kid}).encode()
    return pyseto.encode(key.key, payload, footer=foot, implicit_assertion=digest.encode()).decode()


# ---------------------------------------------------------------- issue

def test_issue_and_verify_ok(issuer, verifier, key, clock):
    clock.advance(0.9)  # token times are whole seconds, floored
    issued = issuer.issue(CALL, DIGEST, decision_id="d-1", policy_version="pv-1")
    assert issued.token.startswith("v4.public.") and issued.kid == key.kid
    assert issued.expires_at == T0 + LIFE
    assert len(issued.jti) == 32 and int(issued.jti, 16) >= 0
    assert json.loads(b64d(issued.token.split(".")[3])) == {"kid": key.kid}
    v = verifier.verify(issued.token, DIGEST, CALL)
    assert (v.code, v.jti, v.decision_id) == ("ok", issued.jti, "d-1") and v.ok
    c = v.claims
    assert c == {"iss": ISS, "aud": AUD, "sub": 'User::"alice"', "tenant": "acme", "tool": "send_email",
                 "call_id": "c-1", "dig": DIGEST, "decision_id": "d-1", "policy_version": "pv-1",
                 "jti": issued.jti, "iat": "2027-01-15T08:00:00Z", "nbf": "2027-01-15T08:00:00Z",
                 "exp": "2027-01-15T08:01:00Z"}
    assert "approval_id" not in c and "approver" not in c


def test_approval_claims_only_when_given(issuer, verifier):
    t = issuer.issue(CALL, DIGEST, decision_id="d", policy_version="p", approval_id="ap-1", approver='Admin::"bo"')
    c = verifier.verify(t.token, DIGEST, CALL).claims
    assert (c["approval_id"], c["approver"]) == ("ap-1", 'Admin::"bo"')


def test_subject_escapes_quotes_and_backslashes():
    assert CALL.subject == 'User::"alice"'
    assert replace(CALL, principal_id='a"b\\c').subject == 'User::"a\\"b\\\\c"'
    # Without escaping these two would collide.
    assert replace(CALL, principal_id='x" "y').subject != replace(CALL, principal_id='x\\" \\"y').subject


def test_jti_is_fresh_each_time(issuer):
    assert len({issuer.issue(CALL, DIGEST, decision_id="d", policy_version="p").jti for _ in range(200)}) == 200


@pytest.mark.parametrize("lifetime", [0, -1, 601, 3600, True, 60.0])
def test_lifetime_out_of_range_is_refused(ring, clock, lifetime):
    with pytest.raises(ValueError, match="lifetime_seconds"):
        TokenIssuer(ring, issuer=ISS, audience=AUD, lifetime_seconds=lifetime, clock=clock)


@pytest.mark.parametrize("leeway", [-1, 6, 60, 5.5])
def test_leeway_out_of_range_is_refused(ring, clock, leeway):
    with pytest.raises(ValueError, match="leeway_seconds"):
        TokenVerifier(ring, issuer=ISS, audience=AUD, leeway_seconds=leeway, clock=clock)
    with pytest.raises(ValueError, match="leeway_seconds"):
        verify_offline("x", public_keys=[], digest=DIGEST, expected=CALL, audience=AUD, issuer=ISS,
                       leeway_seconds=leeway)


def test_limits_are_accepted(ring, clock):
    TokenIssuer(ring, issuer=ISS, audience=AUD, lifetime_seconds=1, clock=clock)
    TokenIssuer(ring, issuer=ISS, audience=AUD, lifetime_seconds=600, clock=clock)
    TokenVerifier(ring, issuer=ISS, audience=AUD, leeway_seconds=0, clock=clock)


def test_issue_refuses_what_verify_would_call_malformed(issuer):
    with pytest.raises(ValueError):
        issuer.issue(replace(CALL, call_id="c" * 9000), DIGEST, decision_id="d", policy_version="p")
    with pytest.raises(ValueError):
        issuer.issue(CALL, "sha256:\u00e9", decision_id="d", policy_version="p")


# ---------------------------------------------------------------- case 7: the token is for one call only

SWAPS = {
    "tool": replace(CALL, tool="delete_all"),
    "principal_id": replace(CALL, principal_id="mallory"),
    "principal_type": replace(CALL, principal_type="Service"),
    "tenant": replace(CALL, tenant="other-tenant"),
    "call_id": replace(CALL, call_id="c-2"),
}


@pytest.mark.parametrize("field", sorted(SWAPS))
def test_swapped_field_changes_the_digest_and_fails(verifier, token, field):
    other = SWAPS[field]
    assert verifier.verify(token, digest_of(other, ARGS), other).code == "bad_signature"
    # Same digest, only the expectation differs: the claims catch it.
    assert verifier.verify(token, DIGEST, other).code == "claims_mismatch"


def test_changed_argument_fails(verifier, token):
    assert verifier.verify(token, digest_of(CALL, {**ARGS, "amount": 1_000_000}), CALL).code == "bad_signature"
    assert verifier.verify(token, digest_of(CALL, {**ARGS, "to": "eve@example.com"}), CALL).code == "bad_signature"


def test_non_ascii_digest_is_an_answer(verifier, token):
    assert verifier.verify(token, DIGEST + "\u00e9", CALL).code == "bad_signature"
    assert verifier.verify(token, "\ud800", CALL).code == "bad_signature"


def test_dig_claim_must_match_even_when_signed(verifier, key):
    # A signer that put another digest in `dig` than it asserted: still refused.
    t = sign_raw(key, claims_for(digest="sha256:other"))
    assert verifier.verify(t, DIGEST, CALL).code == "claims_mismatch"


# ---------------------------------------------------------------- case 1: shape

def other_version_tokens(key: SigningKey) -> dict[str, str]:
    claims = json.dumps(claims_for()).encode()
    footer = json.dumps({"kid": key.kid}).encode()
    ed_pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    p384_pem = ec.generate_private_key(ec.SECP384R1()).private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    header = b64e(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64e(claims)
    mac = b64e(hmac.new(b"secret", f"{header}.{body}".encode(), hashlib.sha256).digest())
    none = b64e(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return {
        "v4.local": pyseto.encode(Key.new(4, "local", b"k" * 32), claims, footer, DIGEST).decode(),
        "v3.public": pyseto.encode(Key.new(3, "public", p384_pem), claims, footer, DIGEST).decode(),
        "v2.public": pyseto.encode(Key.new(2, "public", ed_pem), claims, footer).decode(),
        "jwt-hs256": f"{header}.{body}.{mac}",
        "jwt-none": f"{none}.{body}.",
        "jwt-none-with-v4-prefix": f"v4.public.{none}.{body}.",
    }


def test_other_versions_and_purposes_are_malformed(verifier, key):
    tokens = other_version_tokens(key)
    assert tokens["v4.local"].startswith("v4.local.") and tokens["v3.public"].startswith("v3.public.")
    assert tokens["v2.public"].startswith("v2.public.")
    for name, t in tokens.items():
        assert verifier.verify(t, DIGEST, CALL).code == "malformed", name


def noncanonical(segment: str) -> str:
    """Same bytes under the stdlib decoder, different text: set the last char's unused bits."""
    assert len(b64d(segment)) % 3 != 0, "this segment has no unused bits"
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet[alphabet.index(segment[-1]) | 1]
    assert last != segment[-1]
    mutated = segment[:-1] + last
    assert b64d(mutated) == b64d(segment)
    return mutated


def test_shape_variants(verifier, token, key):
    head, body, footer = token.rsplit(".", 2)
    assert head == "v4.public"
    raw = b64d(body)
    flipped = bytearray(raw)
    flipped[-1] ^= 0x01  # one bit of the signature
    dup_kid = f'{{"kid":"{key.kid}","kid":"{key.kid}"}}'.encode()
    cases = {
        "truncated": token[:-10],
        "truncated-into-payload": token[:40],
        "no-footer": f"{head}.{body}",
        "empty-footer": f"{head}.{body}.",
        "extra-segment": token + ".e30",
        "padded": token + "==",
        "std-alphabet": f"{head}.{body.replace('-', '+').replace('_', '/')}.{footer}" if "-" in body or "_" in body
        else f"{head}.{body[:-1]}+.{footer}",
        "noncanonical-footer": f"{head}.{body}.{noncanonical(footer)}",
        "uppercase-header": "V4.PUBLIC." + token[len("v4.public."):],
        "trailing-newline": token + "\n",
        "leading-space": " " + token,
        "short-payload": f"{head}.{b64e(raw[:64])}.{footer}",
        "footer-not-json": f"{head}.{body}.{b64e(b'kid')}",
        "footer-not-object": f"{head}.{body}.{b64e(json.dumps([key.kid]).encode())}",
        "footer-extra-key": f"{head}.{body}.{b64e(json.dumps({'kid': key.kid, 'x': 1}).encode())}",
        "footer-duplicate-kid": f"{head}.{body}.{b64e(dup_kid)}",
        "footer-kid-not-string": f"{head}.{body}.{b64e(json.dumps({'kid': 1}).encode())}",
        "footer-utf16": f"{head}.{body}.{b64e(json.dumps({'kid': key.kid}).encode('utf-16'))}",
        "footer-kid-newline": f"{head}.{body}.{b64e(json.dumps({'kid': key.kid + chr(10)}).encode())}",
    }
    for name, t in cases.items():
        assert verifier.verify(t, DIGEST, CALL).code == "malformed", name
    # A flipped signature bit keeps the shape, so it is the signature that fails.
    assert verifier.verify(f"{head}.{b64e(bytes(flipped))}.{footer}", DIGEST, CALL).code == "bad_signature"


def test_noncanonical_payload_is_malformed(issuer, verifier):
    # Find a call whose payload length leaves unused bits in the last base64 character.
    for i in range(10):
        call = replace(CALL, call_id=f"c-{'x' * i}")
        t = issuer.issue(call, DIGEST, decision_id="d", policy_version="p").token
        body, footer = t.split(".")[2:]
        if len(b64d(body)) % 3:
            break
    assert verifier.verify(t, DIGEST, call).code == "ok"
    assert verifier.verify(f"v4.public.{noncanonical(body)}.{footer}", DIGEST, call).code == "malformed"


@pytest.mark.parametrize("junk", [
    "", " ", ".", "...", "v4.public.", "v4.public..", "v4.public...", "\u00e9\u2603\U0001F600", "\x00" * 10,
    "v4.public.\u0663\u0663\u0663\u0663", "\ud800", "v4.public.AAAA.\ud800", "a" * 100_000, "v4.public." + "A" * 9000,
])
def test_garbage_is_malformed(verifier, junk):
    assert verifier.verify(junk, DIGEST, CALL).code == "malformed"


@pytest.mark.parametrize("junk", [None, b"v4.public.", 42, ["v4.public."]])
def test_non_strings_are_malformed(verifier, junk):
    assert verifier.verify(junk, DIGEST, CALL).code == "malformed"


def test_random_mutations_never_pass_and_never_raise(verifier, token):
    rng = random.Random(1234)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ \u00e9"
    for _ in range(500):
        chars = list(token)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.6:
                chars[i] = rng.choice(alphabet)
            elif op < 0.8:
                del chars[i]
            else:
                chars.insert(i, rng.choice(alphabet))
        mutated = "".join(chars)
        if mutated == token:
            continue
        code = verifier.verify(mutated, DIGEST, CALL).code
        assert code in CODES - {"ok"}, mutated


# ---------------------------------------------------------------- case 2: key ids

def with_footer(token: str, footer: bytes) -> str:
    return f"{token.rsplit('.', 1)[0]}.{b64e(footer)}"


@pytest.mark.parametrize("kid", [
    "../../etc/passwd", "k4.pid.../../etc/passwd", "/etc/passwd", "k4.pid." + "A" * 43, "k4.pid." + "A" * 45,
    "k4.lid." + "A" * 44, "k4.pid." + "A" * 43 + "=", "' OR 1=1 --", "k4.pid." + "A" * 400, "",
])
def test_malicious_kid_is_malformed(verifier, token, kid):
    assert verifier.verify(with_footer(token, json.dumps({"kid": kid}).encode()), DIGEST, CALL).code == "malformed"


def test_oversized_footer_is_malformed(verifier, token):
    big = with_footer(token, json.dumps({"kid": "k" * 10_000}).encode())
    assert len(big) > 8 * 1024
    assert verifier.verify(big, DIGEST, CALL).code == "malformed"
    padded = with_footer(token, json.dumps({"kid": "k" * 600}).encode())  # under 8 KiB, over 512 bytes
    assert len(padded) < 8 * 1024
    assert verifier.verify(padded, DIGEST, CALL).code == "malformed"


def test_unknown_but_well_formed_kid(verifier, token):
    assert verifier.verify(with_footer(token, json.dumps({"kid": "k4.pid." + "A" * 44}).encode()),
                           DIGEST, CALL).code == "unknown_key"


def test_token_signed_by_the_audit_key_is_unknown_key(verifier, clock):
    audit = SigningKey.generate()  # a valid Ed25519 key, just not one of ours
    forged = TokenIssuer(KeyRing.from_keys(active=audit, grace_seconds=GRACE), issuer=ISS, audience=AUD,
                         clock=clock).issue(CALL, DIGEST, decision_id="d", policy_version="p")
    assert verifier.verify(forged.token, DIGEST, CALL).code == "unknown_key"


def test_signature_by_another_key_under_our_kid_is_bad_signature(verifier, key):
    forged = sign_raw(SigningKey.generate(), claims_for(), footer=json.dumps({"kid": key.kid}).encode())
    assert verifier.verify(forged, DIGEST, CALL).code == "bad_signature"


# ---------------------------------------------------------------- case 3: times

def test_exp_boundary_with_leeway(token, verifier, clock):
    clock.set(T0 + LIFE + LEEWAY)  # exactly exp + leeway: still valid
    assert verifier.verify(token, DIGEST, CALL).code == "ok"
    clock.set(T0 + LIFE + LEEWAY + 0.5)
    assert verifier.verify(token, DIGEST, CALL).code == "expired"
    clock.set(T0 + LIFE + LEEWAY + 1)
    assert verifier.verify(token, DIGEST, CALL).code == "expired"


def test_exp_boundary_without_leeway(token, ring, clock):
    strict = TokenVerifier(ring, issuer=ISS, audience=AUD, leeway_seconds=0, clock=clock)
    clock.set(T0 + LIFE)  # exactly at exp: valid
    assert strict.verify(token, DIGEST, CALL).code == "ok"
    clock.set(T0 + LIFE + 1)
    assert strict.verify(token, DIGEST, CALL).code == "expired"


def test_pyseto_does_not_judge_time_with_the_system_clock(token, ring):
    # The real clock is far from T0; only the injected clock matters.
    far = FrozenClock(T0 + 10)
    assert TokenVerifier(ring, issuer=ISS, audience=AUD, clock=far).verify(token, DIGEST, CALL).code == "ok"


@pytest.mark.parametrize("over, at, code", [
    ({"nbf": rfc3339(T0 + LEEWAY + 1)}, T0, "not_yet_valid"),
    ({"nbf": rfc3339(T0 + LEEWAY)}, T0, "ok"),
    ({"iat": rfc3339(T0 + LEEWAY + 1)}, T0, "not_yet_valid"),
    ({"iat": rfc3339(T0 + 3600), "nbf": rfc3339(T0 - 10)}, T0, "not_yet_valid"),
    ({"iat": rfc3339(T0 + LEEWAY)}, T0, "ok"),
    ({"exp": None}, T0, "malformed"),
    ({"nbf": None}, T0, "malformed"),
    ({"iat": None}, T0, "malformed"),
    ({"exp": T0 + 60}, T0, "malformed"),
    ({"exp": "tomorrow"}, T0, "malformed"),
    ({"exp": "2027-01-15T08:01:00"}, T0, "malformed"),  # no offset
    ({"exp": "2027-02-30T08:01:00Z"}, T0, "malformed"),
    ({"exp": "\u0662027-01-15T08:01:00Z"}, T0, "malformed"),
    ({"exp": "2027-01-15T09:01:00+01:00"}, T0 + LIFE + LEEWAY, "ok"),
    ({"exp": "2027-01-15T09:01:00+01:00"}, T0 + LIFE + LEEWAY + 1, "expired"),
    ({"jti": None}, T0, "malformed"),
])
def test_time_claims(verifier, key, clock, over, at, code):
    clock.set(at)
    assert verifier.verify(sign_raw(key, claims_for(**over)), DIGEST, CALL).code == code


def test_claims_that_are_not_a_json_object(verifier, key):
    for payload in [b"[]", b"not json", b"\xff\xfe", b'{"exp": NaN}', b'{"a":1,"a":2}']:
        assert verifier.verify(sign_raw(key, payload), DIGEST, CALL).code == "malformed"


def test_issued_in_the_future_by_a_skewed_issuer(ring, verifier, clock):
    ahead = TokenIssuer(ring, issuer=ISS, audience=AUD, clock=FrozenClock(T0 + 100))
    t = ahead.issue(CALL, DIGEST, decision_id="d", policy_version="p").token
    assert verifier.verify(t, DIGEST, CALL).code == "not_yet_valid"


# ---------------------------------------------------------------- case 4: audience and issuer

def test_wrong_audience_and_issuer(token, ring, clock):
    other_aud = TokenVerifier(ring, issuer=ISS, audience="another-runtime", clock=clock)
    assert other_aud.verify(token, DIGEST, CALL).code == "wrong_audience"
    other_iss = TokenVerifier(ring, issuer="someone-else", audience=AUD, clock=clock)
    assert other_iss.verify(token, DIGEST, CALL).code == "claims_mismatch"


def test_first_failure_wins(token, ring, verifier, clock):
    assert verifier.verify(token + ".x", "wrong", CALL).code == "malformed"  # a before c
    clock.set(T0 + 10_000)
    assert verifier.verify(token, "wrong", CALL).code == "bad_signature"  # c before d
    other_aud = TokenVerifier(ring, issuer=ISS, audience="x", clock=clock)
    assert other_aud.verify(token, DIGEST, CALL).code == "expired"  # d before e
    clock.set(T0)
    assert other_aud.verify(token, DIGEST, SWAPS["tool"]).code == "wrong_audience"  # e before f


# ---------------------------------------------------------------- case 15: rotation

def test_rotation_with_a_key_directory(tmp_path, clock):
    keys_dir = tmp_path / "keys"
    a = generate_key(keys_dir, clock=clock)
    b = generate_key(keys_dir, clock=clock)
    ring0 = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    old = TokenIssuer(ring0, issuer=ISS, audience=AUD, lifetime_seconds=LIFE, clock=clock).issue(
        CALL, DIGEST, decision_id="d", policy_version="p")
    assert old.kid == a.kid

    # Published before use: a token from b already verifies against the old ring.
    b_key = load_private_key_file(keys_dir / b.file)
    early = TokenIssuer(KeyRing.from_keys(active=b_key, grace_seconds=GRACE), issuer=ISS, audience=AUD,
                        clock=clock).issue(CALL, DIGEST, decision_id="d", policy_version="p")
    assert TokenVerifier(ring0, issuer=ISS, audience=AUD, clock=clock).verify(early.token, DIGEST, CALL).ok

    activate_key(keys_dir, b.kid, clock=clock)  # a retires at T0
    ring1 = load_keyring(keys_dir, grace_seconds=GRACE, clock=clock)
    new = TokenIssuer(ring1, issuer=ISS, audience=AUD, clock=clock).issue(
        CALL, DIGEST, decision_id="d", policy_version="p")
    assert new.kid == b.kid
    verifier = TokenVerifier(ring1, issuer=ISS, audience=AUD, leeway_seconds=LEEWAY, clock=clock)
    assert verifier.verify(old.token, DIGEST, CALL).ok
    clock.set(T0 + GRACE)  # the last moment the old token could be valid anyway
    assert verifier.verify(old.token, DIGEST, CALL).ok
    clock.set(T0 + GRACE + 1)
    assert verifier.verify(old.token, DIGEST, CALL).code == "unknown_key"
    assert [k.kid for k in ring1.public_keys(clock.now())] == [b.kid]


def test_retired_key_window_is_independent_of_token_expiry(clock):
    old, new = SigningKey.generate(), SigningKey.generate()
    # A lagging process kept signing with `old` after it retired at T0.
    late = TokenIssuer(KeyRing.from_keys(active=old, grace_seconds=0), issuer=ISS, audience=AUD,
                       lifetime_seconds=600, clock=FrozenClock(T0 + 500)).issue(
        CALL, DIGEST, decision_id="d", policy_version="p")
    ring = KeyRing.from_keys(active=new, others=[(old, "retired", T0)], grace_seconds=DEFAULT_GRACE_SECONDS)
    assert DEFAULT_GRACE_SECONDS == 605
    verifier = TokenVerifier(ring, issuer=ISS, audience=AUD, clock=clock)
    clock.set(T0 + 605)
    assert verifier.verify(late.token, DIGEST, CALL).ok
    clock.set(T0 + 606)  # token still unexpired, but the key no longer verifies
    assert verifier.verify(late.token, DIGEST, CALL).code == "unknown_key"


# ---------------------------------------------------------------- offline verification

def test_verify_offline_matches_the_sidecar(ring, token, verifier, clock):
    published = [k.to_dict() for k in ring.public_keys(clock.now())]
    json.dumps(published)  # what GetKeys would send is plain JSON

    def offline(t, digest=DIGEST, expected=CALL, at=T0, aud=AUD):
        return verify_offline(t, public_keys=published, digest=digest, expected=expected, audience=aud,
                              issuer=ISS, now=at).code

    assert offline(token) == "ok"
    assert offline(token, digest=digest_of(SWAPS["tool"], ARGS), expected=SWAPS["tool"]) == "bad_signature"
    assert offline(token, expected=SWAPS["tenant"]) == "claims_mismatch"
    assert offline(token, at=T0 + LIFE + LEEWAY + 1) == "expired"
    assert offline(token, aud="x") == "wrong_audience"
    assert offline(token + ".x") == "malformed"
    assert verify_offline(token, public_keys=[], digest=DIGEST, expected=CALL, audience=AUD, issuer=ISS,
                          now=T0).code == "unknown_key"
    assert "single use" in verify_offline.__doc__ and "Verify" in verify_offline.__doc__


def test_verify_offline_honours_verifies_until_and_checks_its_input(clock):
    old, new = SigningKey.generate(), SigningKey.generate()
    ring = KeyRing.from_keys(active=new, others=[(old, "retired", T0)], grace_seconds=GRACE)
    cached = [k.to_dict() for k in ring.public_keys(T0)]
    t = TokenIssuer(KeyRing.from_keys(active=old, grace_seconds=0), issuer=ISS, audience=AUD,
                    lifetime_seconds=600, clock=clock).issue(CALL, DIGEST, decision_id="d", policy_version="p")

    def offline(keys, at):
        return verify_offline(t.token, public_keys=keys, digest=DIGEST, expected=CALL, audience=AUD,
                              issuer=ISS, now=at).code

    assert offline(cached, T0 + GRACE) == "ok"
    assert offline(cached, T0 + GRACE + 1) == "unknown_key"
    with pytest.raises(ValueError, match="kid"):
        offline([{**cached[1], "kid": cached[0]["kid"]}], T0)
    with pytest.raises(ValueError, match="paserk"):
        offline([{"kid": old.kid}], T0)
    with pytest.raises(ValueError, match="paserk"):
        offline([{"paserk": old.key.to_paserk()}], T0)  # a secret key is not a public key entry


# ---------------------------------------------------------------- an independent verifier

def le64(n: int) -> bytes:
    return struct.pack("<Q", n & ((1 << 63) - 1))  # PASETO clears the top bit


def pae(*pieces: bytes) -> bytes:
    return le64(len(pieces)) + b"".join(le64(len(p)) + p for p in pieces)


def independent_verify(token: str, jwk_x: str, implicit: bytes) -> dict:
    """PASETO v4.public verification from the spec, with `cryptography` only (no pyseto)."""
    h = "v4.public."
    assert token.startswith(h)
    body, footer = token[len(h):].split(".")
    m, f = b64d(body), b64d(footer)
    message, sig = m[:-64], m[-64:]
    ed25519.Ed25519PublicKey.from_public_bytes(b64d(jwk_x)).verify(sig, pae(h.encode(), message, f, implicit))
    return json.loads(message)


def test_pae_matches_the_spec_examples():
    # From the PASETO spec, Common.md: PAE test vectors.
    assert pae() == b"\x00" * 8
    assert pae(b"") == b"\x01" + b"\x00" * 7 + b"\x00" * 8
    assert pae(b"test") == b"\x01" + b"\x00" * 7 + b"\x04" + b"\x00" * 7 + b"test"


def test_tokens_verify_independently_of_pyseto(ring, issuer, clock):
    issued = issuer.issue(CALL, DIGEST, decision_id="d-1", policy_version="pv-1")
    [published] = ring.public_keys(clock.now())
    claims = independent_verify(issued.token, published.jwk["x"], DIGEST.encode("ascii"))
    assert claims["dig"] == DIGEST and claims["jti"] == issued.jti and claims["sub"] == 'User::"alice"'
    with pytest.raises(InvalidSignature):
        independent_verify(issued.token, published.jwk["x"], digest_of(CALL, {**ARGS, "amount": 11}).encode())
    with pytest.raises(InvalidSignature):
        independent_verify(issued.token, published.jwk["x"], b"")  # the digest is not optional
    # And the same from the PASERK form of the key.
    x_from_paserk = published.paserk.removeprefix("k4.public.")
    assert independent_verify(issued.token, x_from_paserk, DIGEST.encode())["jti"] == issued.jti
