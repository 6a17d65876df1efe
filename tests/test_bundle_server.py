"""A hostile bundle server, one behaviour per test, against a real local HTTPS server:
each poll that meets it leaves the last good bundle serving and says why (the poller's
`last_error`, which GetStatus shows), and never sends the bearer token elsewhere.

The poller is driven one poll at a time (`reload()`), so nothing waits on a clock."""

from __future__ import annotations

import io
import logging
import tarfile
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.bundle_server import PATH, BundleServer, Handler
from tests.certs import CertificateAuthority
from tests.test_bundle_archive import entry, signed, tar_gz
from toolauthz.bundle import BundleHolder
from toolauthz.bundle.archive import DEFAULT_LIMITS, ArchiveLimits, build_archive
from toolauthz.bundle.remote import BundleFetcher, BundleFetchError, Fetched, FetchOptions
from toolauthz.errors import BundleError
from toolauthz.server.remote_reload import PollSchedule, RemoteBundleReloader
from toolauthz.server.remote_start import first_bundle
from toolauthz.telemetry import metrics

FORBID = '@id("no-measurements")\nforbid (principal, action == Action::"tool:measure_runtime", resource);\n'
TOKEN = "s3cret-bundle-token"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture
def server(ca, tmp_path, bundle_dir, key):
    running = BundleServer(ca, tmp_path / "server").start()
    running.publish(build_archive(signed(bundle_dir, key, 1)))
    yield running
    running.stopping.set()
    running.stop()


def options(server: BundleServer, ca: CertificateAuthority, tmp_path, **overrides) -> FetchOptions:
    return FetchOptions(**{"url": server.url, "ca_file": str(ca.write(tmp_path / "ca.pem")),
                           "timeout_seconds": 10.0, **overrides})


class Records:
    def __init__(self):
        self.events = []

    def write(self, event) -> None:
        self.events.append(event)


def poller(server, ca, tmp_path, key, *, revalidate_every: int = 10, limits: ArchiveLimits = DEFAULT_LIMITS,
           **overrides) -> RemoteBundleReloader:
    fetcher = BundleFetcher(options(server, ca, tmp_path, **overrides))
    start = first_bundle(fetcher, {"ci-1": key.public_key()}, limits, tmp_path / "no-cache.tar.gz")
    return RemoteBundleReloader(BundleHolder(start.bundle), fetcher, start.fetched, keys={"ci-1": key.public_key()},
                                schedule=PollSchedule(1.0, revalidate_every=revalidate_every), limits=limits,
                                audit=Records())  # type: ignore[arg-type]


def publish_revision(server, bundle_dir, key, revision: int, extra: str = FORBID) -> None:
    (bundle_dir / "extra.cedar").write_text(extra + f"// revision {revision}\n")
    server.publish(build_archive(signed(bundle_dir, key, revision)))


def refused_and_still_serving(reloader: RemoteBundleReloader, version: str) -> str:
    assert reloader.reload() is False
    assert reloader._holder.current.version == version
    assert reloader.last_error
    return reloader.last_error


def test_a_new_signed_revision_is_picked_up_and_a_304_changes_nothing(server, ca, tmp_path, bundle_dir, key):
    reloader = poller(server, ca, tmp_path, key)
    first = reloader._holder.current
    assert reloader.reload() is False and server.requests[-1]["if-none-match"] == server.etag  # 304
    publish_revision(server, bundle_dir, key, 2)
    assert reloader.reload() is True
    assert reloader._holder.current.revision == 2 and reloader._holder.current.version != first.version
    assert reloader.reloads == 1 and reloader.last_error == ""
    assert [e.result for e in reloader._audit.events] == ["loaded"]


def test_redirect_to_another_host_is_refused_and_the_token_never_leaves(server, ca, tmp_path, bundle_dir, key):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server.bearer = TOKEN
    reloader = poller(server, ca, tmp_path, key, bearer_token_file=str(token_file))
    assert server.requests[-1]["authorization"] == f"Bearer {TOKEN}"
    publish_revision(server, bundle_dir, key, 2)
    server.respond = lambda h: h.redirect(f"https://localhost:{server.port}{PATH}")  # same port, another host
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert "redirected to another origin `https://localhost`; refused" in error
    assert len(server.requests) == 2  # the redirect was not followed
    assert TOKEN not in error


def test_a_redirect_within_the_same_origin_is_followed(server, ca, tmp_path, bundle_dir, key):
    reloader = poller(server, ca, tmp_path, key)
    publish_revision(server, bundle_dir, key, 2)
    archive = server.archive

    def moved(handler: Handler) -> None:
        if handler.path == PATH:
            handler.redirect("/moved/bundle.tar.gz")
        else:
            handler.send(200, archive, {"ETag": '"moved"'})

    server.respond = moved
    assert reloader.reload() is True and reloader._holder.current.revision == 2


@pytest.mark.parametrize("member, message", [
    (entry("../refunds.cedar", b"permit (principal, action, resource);"), "is not a plain relative path"),
    (entry("refunds.cedar", kind=tarfile.SYMTYPE, link="/etc/passwd"), "is a symlink"),
    (entry("dev.cedar", kind=tarfile.CHRTYPE), "is a device file"),
])
def test_an_archive_with_traversal_symlinks_or_device_files_is_refused(server, ca, tmp_path, key, member, message):
    reloader = poller(server, ca, tmp_path, key)
    server.publish(tar_gz(entry("orders.cedar", b"permit (principal, action, resource);"), member))
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert message in error
    assert reloader._audit.events[-1].result == "refused"
    assert reloader._audit.events[-1].error_codes == ("bundle_signature",)


def test_an_archive_of_ten_thousand_files_is_refused(server, ca, tmp_path, key):
    reloader = poller(server, ca, tmp_path, key)
    server.publish(tar_gz(*(entry(f"tools/t{i}.yaml", b"") for i in range(10_000))))
    assert "more than 5000 files" in refused_and_still_serving(reloader, reloader._holder.current.version)


def test_a_gzip_bomb_is_refused(server, ca, tmp_path, key):
    from tests.test_bundle_archive import gzip_bomb

    reloader = poller(server, ca, tmp_path, key, limits=ArchiveLimits(max_uncompressed_bytes=2 << 20))
    server.publish(gzip_bomb(files=64, each=1 << 20))  # 64 MiB of zeros, each file under the bound
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert f"inflates to more than {2 << 20} bytes" in error


def test_a_body_over_the_bound_is_refused_unread(server, ca, tmp_path, key):
    reloader = poller(server, ca, tmp_path, key, max_bytes=64 * 1024)
    server.publish(b"\x1f\x8b" + bytes(200 * 1024))
    assert "larger than 65536 bytes (Content-Length 204802)" in \
        refused_and_still_serving(reloader, reloader._holder.current.version)


def test_a_slow_server_is_cut_off_by_the_total_deadline(server, ca, tmp_path, key):
    """Headers a byte at a time, each well within any per-read timeout: only a deadline
    over the whole fetch ends it."""
    reloader = poller(server, ca, tmp_path, key, timeout_seconds=1.0)

    def trickle(handler: Handler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(600):
            if server.stopping.wait(0.05):
                return
            try:
                handler.wfile.write(b"X-Slow: 1\r\n")
                handler.wfile.flush()
            except OSError:
                return

    server.respond = trickle
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert "did not answer in full within 1 s" in error
    assert reloader.failures == 1


def test_an_etag_that_never_changes_while_the_content_does_is_noticed_on_200(server, ca, tmp_path, bundle_dir, key):
    """The server ignores If-None-Match and sends the same ETag for new content: the
    poller compares the body's digest, never the ETag, on a 200."""
    server.publish(server.archive, etag='"always-the-same"')
    server.honour_etag = False
    reloader = poller(server, ca, tmp_path, key)
    publish_revision(server, bundle_dir, key, 2)
    server.etag = '"always-the-same"'
    assert reloader.reload() is True and reloader._holder.current.revision == 2
    before = metrics.BUNDLE_FETCHES.labels(outcome="unchanged")._value.get()
    assert reloader.reload() is False  # the same bytes again: not verified again
    assert metrics.BUNDLE_FETCHES.labels(outcome="unchanged")._value.get() == before + 1


def test_an_etag_that_never_changes_behind_304s_is_caught_by_the_periodic_full_fetch(server, ca, tmp_path,
                                                                                      bundle_dir, key):
    """The server answers 304 to its one ETag whatever it now holds: every
    `revalidate_every`-th poll asks without If-None-Match."""
    server.publish(server.archive, etag='"always-the-same"')
    reloader = poller(server, ca, tmp_path, key, revalidate_every=3)
    publish_revision(server, bundle_dir, key, 2)
    server.etag = '"always-the-same"'
    assert [reloader.reload() for _ in range(2)] == [False, False]  # 304, 304
    assert reloader._holder.current.revision == 1
    assert reloader.reload() is True and reloader._holder.current.revision == 2  # the third: in full
    assert "if-none-match" not in server.requests[-1]


def test_a_tls_error_keeps_the_last_good_bundle_and_refuses_a_start(server, ca, tmp_path, key):
    reloader = poller(server, ca, tmp_path, key)
    other = CertificateAuthority("another CA")
    reloader._fetcher = BundleFetcher(options(server, other, tmp_path / "other"))
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert "TLS with the bundle server failed: CERTIFICATE_VERIFY_FAILED" in error
    assert reloader._audit.events[-1].result == "unreachable"
    assert reloader._audit.events[-1].error_codes == ("bundle_tls",)
    with pytest.raises(BundleError, match="cannot fetch the bundle: TLS"):
        first_bundle(reloader._fetcher, {"ci-1": key.public_key()}, ArchiveLimits(), tmp_path / "none.tar.gz")


def test_an_outage_keeps_serving_backs_off_records_once_and_recovers(server, ca, tmp_path, bundle_dir, key):
    reloader = poller(server, ca, tmp_path, key)
    version = reloader._holder.current.version
    server.stop()
    unreachable = metrics.BUNDLE_FETCHES.labels(outcome="unreachable")._value.get()
    for _ in range(3):
        assert "the bundle server is unreachable" in refused_and_still_serving(reloader, version)
    assert reloader.failures == 3 and metrics.BUNDLE_FETCH_FAILURES._value.get() == 3
    assert metrics.BUNDLE_FETCHES.labels(outcome="unreachable")._value.get() == unreachable + 3
    assert [e.result for e in reloader._audit.events] == ["unreachable"]  # one record per outage
    schedule = PollSchedule(2.0, jitter=0.1, max_backoff_seconds=30.0)
    assert schedule.delay(0, lambda low, high: high) == pytest.approx(2.2)
    assert schedule.delay(3, lambda low, high: low) == pytest.approx(16 * 0.9)
    assert schedule.delay(10, lambda low, high: 1.0) == 30.0
    publish_revision(server, bundle_dir, key, 2)
    server.start()
    assert reloader.reload() is True and reloader.failures == 0 and reloader.last_error == ""
    assert metrics.BUNDLE_FETCH_FAILURES._value.get() == 0


def test_a_tampered_or_older_archive_is_refused_and_the_refusal_stays_visible(server, ca, tmp_path, bundle_dir, key):
    reloader = poller(server, ca, tmp_path, key)
    publish_revision(server, bundle_dir, key, 5)
    assert reloader.reload() is True
    version = reloader._holder.current.version
    buffer = io.BytesIO()
    # Revision 6, then one file changed after signing.
    publish_revision(server, bundle_dir, key, 6)
    with tarfile.open(fileobj=io.BytesIO(server.archive), mode="r:gz") as good, \
            tarfile.open(fileobj=buffer, mode="w:gz") as bad:
        for member in good.getmembers():
            data = good.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "extra.cedar":
                data = b"permit (principal, action, resource);\n"
                member.size = len(data)
            bad.addfile(member, io.BytesIO(data))
    server.publish(buffer.getvalue())
    assert "altered: `extra.cedar`" in refused_and_still_serving(reloader, version)
    publish_revision(server, bundle_dir, key, 4)
    assert "revision 4 is below the floor, 5" in refused_and_still_serving(reloader, version)
    assert reloader.reload() is False and "revision 4" in reloader.last_error  # still said, not re-verified


def test_a_bearer_token_is_sent_and_never_logged(server, ca, tmp_path, key, caplog):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    server.bearer = TOKEN
    reloader = poller(server, ca, tmp_path, key, bearer_token_file=str(token_file))
    token_file.write_text("rotated-token")  # read at every fetch: a rotation needs no restart
    with caplog.at_level(logging.DEBUG):
        error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert "answered HTTP 401" in error
    assert server.requests[-1]["authorization"] == "Bearer rotated-token"
    assert not any(TOKEN in r.getMessage() or "rotated-token" in r.getMessage() for r in caplog.records)
    token_file.write_text("two\ntokens")
    with pytest.raises(BundleFetchError, match="does not hold one bearer token") as caught:
        reloader._fetcher.fetch()
    assert "two" not in str(caught.value)


def test_mtls_a_client_certificate_is_presented(ca, tmp_path, bundle_dir, key):
    clients = CertificateAuthority("clients")
    server = BundleServer(ca, tmp_path / "mtls", client_ca=clients).start()
    try:
        server.publish(build_archive(signed(bundle_dir, key, 1)))
        cert, client_key = clients.issue(common_name="sidecar").write(tmp_path, "client")
        fetcher = BundleFetcher(options(server, ca, tmp_path, client_cert_file=str(cert),
                                        client_key_file=str(client_key)))
        assert fetcher.fetch().body == server.archive
        with pytest.raises(BundleFetchError) as caught:
            BundleFetcher(options(server, ca, tmp_path)).fetch()
        assert caught.value.reason in ("tls", "unreachable")
    finally:
        server.stop()


def test_the_poller_thread_polls_on_its_schedule(server, ca, tmp_path, bundle_dir, key):
    reloader = poller(server, ca, tmp_path, key)
    reloader._schedule = PollSchedule(0.05, jitter=0.0)
    publish_revision(server, bundle_dir, key, 2)
    reloader.start()
    try:
        deadline = time.monotonic() + 30
        while reloader.reloads == 0 and time.monotonic() < deadline:
            reloader.wait_for_attempt(reloader.attempts, timeout=5)
        assert reloader._holder.current.revision == 2
    finally:
        reloader.close()


def test_closing_the_poller_cancels_a_fetch_stuck_on_a_slow_server(server, ca, tmp_path, key):
    """A stopping sidecar does not wait for a slow server's deadline (300 s here: a close
    that waited for it would hang the test)."""
    import threading

    reloader = poller(server, ca, tmp_path, key, timeout_seconds=300.0)
    reloader._schedule = PollSchedule(0.01, jitter=0.0)
    answering = threading.Event()

    def stall(handler: Handler) -> None:
        answering.set()
        server.stopping.wait(600)

    server.respond = stall
    reloader.start()
    assert answering.wait(30)
    closing = threading.Thread(target=reloader.close)
    closing.start()
    closing.join(60)  # a hung close fails here, not after the fetch's 300 s
    assert not closing.is_alive()
    assert reloader._thread is not None and not reloader._thread.is_alive()
    assert reloader.failures == 0 and reloader._audit.events == []  # not an outage


@pytest.mark.parametrize("location", ["http://127.0.0.1:{port}/bundle.tar.gz", "https://127.0.0.1:1/bundle.tar.gz",
                                      "https://evil.example/bundle.tar.gz", "//evil.example/bundle.tar.gz"])
def test_a_redirect_to_another_scheme_port_or_host_is_refused(server, ca, tmp_path, key, location):
    reloader = poller(server, ca, tmp_path, key)
    server.respond = lambda h: h.redirect(location.format(port=server.port))
    assert "redirected to another origin" in refused_and_still_serving(reloader, reloader._holder.current.version)


@pytest.mark.parametrize("status", [404, 500, 503])
def test_an_error_status_keeps_the_last_good_bundle(server, ca, tmp_path, key, status):
    reloader = poller(server, ca, tmp_path, key)
    server.respond = lambda h: h.send(status, b"<html>nope</html>")
    error = refused_and_still_serving(reloader, reloader._holder.current.version)
    assert f"the bundle server answered HTTP {status}" in error and "nope" not in error


@pytest.mark.parametrize("etag", ['"a"\r\nX-Injected: 1', '"' + "a" * 300 + '"', "unquoted", '"caf\u00e9"'])
def test_an_etag_that_is_not_a_plain_entity_tag_is_never_sent_back(etag):
    from toolauthz.bundle.remote import _usable_etag

    assert _usable_etag(etag) == ""
    assert _usable_etag('W/"abc-123"') == 'W/"abc-123"'


def test_a_restart_during_an_outage_serves_the_cached_last_good_archive(server, ca, tmp_path, bundle_dir, key):
    keys = {"ci-1": key.public_key()}
    cache = tmp_path / "data" / "bundle-server.tar.gz"
    cache.parent.mkdir()
    fetcher = BundleFetcher(options(server, ca, tmp_path))
    first = first_bundle(fetcher, keys, ArchiveLimits(), cache)
    assert not cache.exists()  # kept once activated (build.py), not before
    first.keep(cache)
    reloader = RemoteBundleReloader(BundleHolder(first.bundle), fetcher, Fetched(server.archive, server.etag),
                                    keys=keys, schedule=PollSchedule(1.0), cache=cache)
    assert cache.read_bytes() == server.archive and cache.stat().st_mode & 0o777 == 0o600
    publish_revision(server, bundle_dir, key, 3)
    assert reloader.reload() is True and cache.read_bytes() == server.archive  # each activation is kept
    served = reloader._holder.current.version

    server.stop()
    start = first_bundle(fetcher, keys, ArchiveLimits(), cache)
    assert start.unreachable and start.bundle.version == served and start.bundle.revision == 3
    assert "serving the cached revision 3" in start.problem
    records = Records()
    restarted = RemoteBundleReloader(BundleHolder(start.bundle), fetcher, start.fetched, keys=keys,
                                     schedule=PollSchedule(1.0), audit=records,  # type: ignore[arg-type]
                                     start_problem=start.problem, start_unreachable=start.unreachable)
    assert restarted.last_error == start.problem and restarted.failures == 1
    assert records.events == []  # the start's one `bundle` record says so (build.py), not a second one


def test_at_start_an_older_or_tampered_archive_loses_to_the_cached_one(server, ca, tmp_path, bundle_dir, key):
    keys = {"ci-1": key.public_key()}
    cache = tmp_path / "bundle-server.tar.gz"
    fetcher = BundleFetcher(options(server, ca, tmp_path))
    publish_revision(server, bundle_dir, key, 5)
    first = first_bundle(fetcher, keys, ArchiveLimits(), cache)
    assert first.bundle.revision == 5
    first.keep(cache)
    publish_revision(server, bundle_dir, key, 4)  # the server rolled back
    start = first_bundle(fetcher, keys, ArchiveLimits(), cache)
    assert start.bundle.revision == 5 and not start.unreachable
    assert "revision 4 is below the floor, 5" in start.problem
    start.keep(cache)  # the refused archive is never kept
    cache.write_bytes(cache.read_bytes()[:-30])  # a damaged cache is not used: the server's bundle is
    start = first_bundle(fetcher, keys, ArchiveLimits(), cache)
    assert start.bundle.revision == 4 and start.problem == ""


def test_a_poll_holds_to_the_store_floor_and_a_sighup_judges_again_after_an_allowed_rollback(
        server, ca, tmp_path, bundle_dir, key):
    """The poller is held to the store's floor as a directory reload is (activation.py):
    below a floor another replica raised it decides nothing, an archive under the floor
    is refused and recorded in `_system`, and after `bundle allow-rollback` a SIGHUP
    (an unconditional poll) judges the same archive again and activates it."""
    import subprocess
    import sys
    from pathlib import Path

    from toolauthz.audit.records import SYSTEM_TENANT
    from toolauthz.errors import PreconditionError
    from toolauthz.store.open import open_store

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(store_url)
    keys = {"ci-1": key.public_key()}
    fetcher = BundleFetcher(options(server, ca, tmp_path))
    start = first_bundle(fetcher, keys, ArchiveLimits(), tmp_path / "kept.tar.gz")
    holder = BundleHolder(start.bundle)
    records = Records()
    reloader = RemoteBundleReloader(holder, fetcher, start.fetched, keys=keys, schedule=PollSchedule(1.0),
                                    audit=records, floor=store.bundle_floor)  # type: ignore[arg-type]
    try:
        store.bundle_floor.lift(5, "f" * 64, 1.0)  # another replica activated revision 5
        assert reloader.reload() is False  # a 304: nothing new, but the floor is looked at
        with pytest.raises(PreconditionError, match="bundle_below_floor"):
            holder.deciding  # noqa: B018 (the property refuses)
        publish_revision(server, bundle_dir, key, 3)
        assert "revision 3 is below the floor, 5" in refused_and_still_serving(reloader, start.bundle.version)
        assert reloader.reload() is False and "below the floor, 5" in reloader.last_error  # judged once
        assert [(e.result, e.tenant) for e in records.events] == [("refused", SYSTEM_TENANT)]

        toolauthz = Path(sys.executable).parent / "toolauthz"
        lowered = subprocess.run([str(toolauthz), "bundle", "allow-rollback", "--to", "3", "--reason",
                                  "revert", "--store", store_url], capture_output=True, text=True, timeout=60)
        assert lowered.returncode == 0, lowered.stderr
        assert reloader.reload(unconditional=True) is True
        assert holder.deciding.revision == 3 and store.bundle_floor.current().revision == 3
        assert [e.result for e in records.events] == ["refused", "loaded"]
    finally:
        store.close()
