"""The identity provider's keys by `kid` (toolauthz/identity/jwks.py): a static JWK Set, or one
fetched over HTTPS from an IdP the test serves (tests/idp.py), by `jwks_uri` or OpenID
discovery; cached, refreshed at most once per interval, and refused on any failure."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from idp import DISCOVERY_PATH, JWKS_PATH, TestIdp
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

from toolauthz.errors import KeyFileError
from toolauthz.identity.jwks import (
    KEYS_UNAVAILABLE,
    UNKNOWN_KID,
    JwtRefused,
    RemoteJwks,
    RemoteSettings,
    keys_from_file,
    static_keys,
    verify_jwt,
    verify_jwt_async,
)

KEY_1 = ECKey.generate_key("P-256", parameters={"kid": "k1"})
KEY_2 = ECKey.generate_key("P-256", parameters={"kid": "k2"})
INTERVAL, MAX_AGE = 60.0, 3600.0


@pytest.fixture
def idp(tmp_path):
    served = TestIdp(tmp_path)
    served.publish(KEY_1)
    yield served
    served.close()


def remote(idp, clock, *, discovery=False, **changes) -> RemoteJwks:
    where = {"issuer": idp.issuer} if discovery else {"jwks_uri": idp.jwks_uri}
    settings = RemoteSettings(**where, ca_file=idp.ca_file, refresh_interval_seconds=INTERVAL,
                              max_age_seconds=MAX_AGE, **changes)
    return RemoteJwks(settings, clock)


def refused(source, kid: str) -> str:
    with pytest.raises(JwtRefused) as err:
        source.key(kid)
    return err.value.reason


@pytest.mark.parametrize("discovery", [False, True])
def test_keys_are_fetched_once_and_served_from_the_cache(idp, clock, discovery):
    source = remote(idp, clock, discovery=discovery)
    assert idp.requests[JWKS_PATH] == 0  # nothing fetched before the first lookup
    for _ in range(5):
        assert source.key("k1").thumbprint() == KEY_1.thumbprint()
    assert idp.requests[JWKS_PATH] == 1
    assert idp.requests[DISCOVERY_PATH] == (1 if discovery else 0)


def test_a_rotated_key_is_picked_up_on_the_first_refresh_the_interval_allows(idp, clock):
    source = remote(idp, clock)
    source.key("k1")
    idp.publish(KEY_2)  # the IdP rotates: k1 is gone, k2 signs
    clock.advance(INTERVAL)
    assert source.key("k2").thumbprint() == KEY_2.thumbprint()
    assert refused(source, "k1") == UNKNOWN_KID  # the retired key is trusted no more
    assert idp.requests[JWKS_PATH] == 2


def test_random_kids_cost_one_fetch_per_interval(idp, clock):
    source = remote(idp, clock)
    source.key("k1")
    for n in range(500):
        assert refused(source, f"attacker-{n}") == UNKNOWN_KID
    assert idp.requests[JWKS_PATH] == 1
    clock.advance(INTERVAL)
    for n in range(500):
        refused(source, f"attacker-again-{n}")
    assert idp.requests[JWKS_PATH] == 2
    assert source.key("k1")  # the known key still verifies throughout


def test_concurrent_lookups_of_an_unknown_kid_make_one_fetch(idp, clock):
    source = remote(idp, clock)
    barrier = threading.Barrier(8)
    results: list[object] = []

    def look() -> None:
        barrier.wait()
        results.append(source.key("k1"))

    threads = [threading.Thread(target=look) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and idp.requests[JWKS_PATH] == 1


BAD_RESPONSES = {
    "server error": (b'{"keys": []}', 500, None),
    "redirect": (b"", 302, {"Location": "http://127.0.0.1:1/jwks"}),
    "not JSON": (b"<html>", 200, None),
    "no keys": (b'{"keys": []}', 200, None),
    "a symmetric key": (json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "k1"}]}).encode(), 200, None),
    "a private key": (json.dumps({"keys": [KEY_1.as_dict(private=True)]}).encode(), 200, None),
    "a repeated kid": (json.dumps({"keys": [KEY_1.as_dict(private=False)] * 2}).encode(), 200, None),
    "over the size cap": (json.dumps({"keys": [KEY_1.as_dict(private=False)], "pad": "x" * 5000}).encode(),
                          200, None),
    "over the cap, undeclared": (json.dumps({"keys": [KEY_1.as_dict(private=False)], "pad": "x" * 5000}).encode(),
                                 200, {"Content-Type": "application/json", "Content-Length": ""}),
}


@pytest.mark.parametrize("name", sorted(BAD_RESPONSES))
def test_a_failed_or_invalid_fetch_is_refused(idp, clock, name):
    body, status, headers = BAD_RESPONSES[name]
    idp.respond(JWKS_PATH, body, status, headers)
    source = remote(idp, clock, max_bytes=4096)
    assert refused(source, "k1") == KEYS_UNAVAILABLE


def test_the_size_cap_stops_reading(idp, clock):
    idp.respond(JWKS_PATH, b" " * 10_000_000, 200, {"Content-Type": "application/json", "Content-Length": ""})
    source = remote(idp, clock, max_bytes=4096)
    failures: list[str] = []
    original = source._get_json

    def recording(url, deadline):
        try:
            return original(url, deadline)
        except ValueError as exc:
            failures.append(str(exc))
            raise

    source._get_json = recording  # type: ignore[method-assign]
    assert refused(source, "k1") == KEYS_UNAVAILABLE
    assert failures == ["the response is larger than 4096 bytes"]  # stopped by the cap, not by parsing 10 MB


@pytest.mark.parametrize("document", [
    {"issuer": "https://evil.example", "jwks_uri": "{jwks}"},
    {"issuer": "{issuer}/", "jwks_uri": "{jwks}"},
    {"issuer": "{issuer}", "jwks_uri": "http://127.0.0.1:1/jwks"},
    {"issuer": "{issuer}"},
])
def test_discovery_of_another_issuer_or_a_plain_http_jwks_uri_is_refused(idp, clock, document):
    idp.discovery(**{k: v.format(issuer=idp.issuer, jwks=idp.jwks_uri) for k, v in document.items()})
    assert refused(remote(idp, clock, discovery=True), "k1") == KEYS_UNAVAILABLE
    assert idp.requests[JWKS_PATH] == 0


def test_a_server_the_ca_does_not_vouch_for_is_refused(idp, clock, tmp_path):
    from certs import CertificateAuthority

    other_ca = CertificateAuthority("another CA").write(tmp_path / "other-ca.pem")
    settings = RemoteSettings(jwks_uri=idp.jwks_uri, ca_file=other_ca)
    assert refused(RemoteJwks(settings, clock), "k1") == KEYS_UNAVAILABLE
    assert refused(RemoteJwks(RemoteSettings(jwks_uri=idp.jwks_uri), clock), "k1") == KEYS_UNAVAILABLE


def test_a_silent_server_times_out_and_is_refused(clock, idp):
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}/jwks"
        source = RemoteJwks(RemoteSettings(jwks_uri=url, ca_file=idp.ca_file, timeout_seconds=0.2), clock)
        assert refused(source, "k1") == KEYS_UNAVAILABLE
    finally:
        silent.close()


def test_a_failed_refresh_keeps_the_keys_until_their_max_age_then_refuses(idp, clock):
    source = remote(idp, clock)
    source.key("k1")
    idp.respond(JWKS_PATH, b"", 503)
    clock.advance(INTERVAL)
    assert refused(source, "k9") == UNKNOWN_KID  # the refresh failed: the held keys stand
    assert idp.requests[JWKS_PATH] == 2
    assert source.key("k1")
    clock.advance(MAX_AGE - INTERVAL)  # the held keys are now MAX_AGE old: trusted no more
    assert refused(source, "k1") == KEYS_UNAVAILABLE
    assert idp.requests[JWKS_PATH] == 3
    idp.publish(KEY_1)
    assert refused(source, "k1") == KEYS_UNAVAILABLE  # within the interval of the failed fetch
    clock.advance(INTERVAL)
    assert source.key("k1") and idp.requests[JWKS_PATH] == 4


def test_a_fetch_never_runs_on_the_event_loop(idp, clock):
    source = remote(idp, clock)
    threads: list[int] = []
    original = source._fetch_document

    def recording():
        threads.append(threading.get_ident())
        return original()

    source._fetch_document = recording  # type: ignore[method-assign]

    async def main() -> int:
        await source.key_async("k1")
        await source.key_async("k1")  # cached: no thread, no fetch
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert len(threads) == 1 and threads[0] != loop_thread


@pytest.mark.parametrize("changes", [
    {"jwks_uri": "http://idp.example/jwks"},
    {"issuer": "http://idp.example"},
    {},
    {"jwks_uri": "https://idp.example/jwks", "issuer": "https://idp.example"},
    {"jwks_uri": "https://idp.example/jwks", "max_bytes": 0},
    {"jwks_uri": "https://idp.example/jwks", "refresh_interval_seconds": 7200},
    {"jwks_uri": "https://idp.example/jwks", "refresh_interval_seconds": 0},
])
def test_remote_settings_are_checked(changes):
    with pytest.raises(KeyFileError):
        RemoteSettings(**changes)


def test_static_keys_from_a_file(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [KEY_1.as_dict(private=False),
                                         {**KEY_2.as_dict(private=False), "use": "enc"}]}))
    keys = keys_from_file(path)
    assert keys.key("k1")
    assert refused(keys, "k2") == UNKNOWN_KID  # an encryption key signs nothing
    path.write_text("[]")
    with pytest.raises(KeyFileError):
        keys_from_file(path)


def test_verify_jwt_checks_the_algorithm_the_key_and_the_signature():
    rsa = RSAKey.generate_key(2048, parameters={"kid": "r1"})
    keys = static_keys({"keys": [KEY_1.as_dict(private=False), rsa.as_dict(private=False)]})
    token = jwt.encode({"alg": "ES256", "kid": "k1"}, {"sub": "dave"}, KEY_1)
    verified = verify_jwt(token, keys, ("ES256",))
    assert verified.claims == {"sub": "dave"} and verified.header["kid"] == "k1"
    assert asyncio.run(verify_jwt_async(token, keys, ("ES256",))).claims == {"sub": "dave"}
    cases = {
        "algorithm not accepted": (token, ("RS256",)),
        "the key of this `kid` does not fit the algorithm":
            (jwt.encode({"alg": "ES256", "kid": "r1"}, {"sub": "x"}, KEY_1), ("ES256",)),
        "bad signature": (jwt.encode({"alg": "ES256", "kid": "k1"}, {"sub": "x"}, KEY_2), ("ES256",)),
        UNKNOWN_KID: (jwt.encode({"alg": "ES256"}, {"sub": "x"}, KEY_1), ("ES256",)),
        "malformed": ("a.b", ("ES256",)),
    }
    for reason, (bad, algorithms) in cases.items():
        with pytest.raises(JwtRefused) as err:
            verify_jwt(bad, keys, algorithms)
        assert err.value.reason == reason


def test_a_clock_set_back_ages_the_keys_out_and_allows_a_fetch(idp, clock):
    source = remote(idp, clock)
    source.key("k1")
    clock.advance(-MAX_AGE * 10)  # keys fetched "in the future" are trusted no longer than any others
    assert source.key("k1") and idp.requests[JWKS_PATH] == 2


def test_any_failure_of_a_fetch_refuses_the_token(idp, clock):
    source = remote(idp, clock)

    def broken():
        raise RuntimeError("something no one foresaw")

    source._fetch_document = broken  # type: ignore[method-assign]
    assert refused(source, "k1") == KEYS_UNAVAILABLE
