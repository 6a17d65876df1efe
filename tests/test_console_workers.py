"""The console under `serve --workers N`: every worker serves it on the one port, and a
session made on one worker is good on every other (one secret, in the data directory)."""

from __future__ import annotations

import http.client
import re
import signal
import sys

import pytest
from test_workers import free_port, pids_holding_connections, workers_factory  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT and /proc are Linux")


def test_every_worker_serves_the_console_and_honours_one_session(workers_factory, bundle_dir, tmp_path):  # noqa: F811
    port, console_port = free_port(), free_port()
    config = tmp_path / "toolauthz.yaml"
    config.write_text(f"bundle: {bundle_dir}\nlisten: 127.0.0.1:{port}\ndata_dir: {tmp_path / 'data'}\n"
                      f"generate_missing_keys: true\nconsole_listen: 127.0.0.1:{console_port}\n")
    workers = workers_factory("--config", str(config), "--workers", "2")
    pids = workers.wait_serving()
    assert workers.wait_line("toolauthz console on") == f"toolauthz console on http://127.0.0.1:{console_port}/"

    first = http.client.HTTPConnection("127.0.0.1", console_port, timeout=30)
    first.request("GET", "/signin")
    answer = first.getresponse()
    page, cookie = answer.read().decode(), answer.getheader("set-cookie").split(";")[0]
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    first.request("POST", "/signin", body=f"csrf_token={token}&principal=bob&tenant=acme",
                  headers={"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded"})
    signed = first.getresponse()
    signed.read()
    assert signed.status == 303
    session = signed.getheader("set-cookie").split(";")[0]
    # Connections held open, so the kernel spreads them over the workers; each answers
    # the session that one of them signed.
    connections = [http.client.HTTPConnection("127.0.0.1", console_port, timeout=30) for _ in range(16)]
    try:
        for connection in connections:
            connection.request("GET", "/inbox", headers={"Cookie": session})
            inbox = connection.getresponse()
            assert inbox.status == 200 and 'data-testid="signed-in-as">User::&#34;bob&#34;<' in inbox.read().decode()
        assert pids_holding_connections(console_port, pids) == set(pids)
    finally:
        for connection in [first, *connections]:
            connection.close()
    workers.proc.send_signal(signal.SIGTERM)
    assert workers.wait() == 0, "\n".join(workers.err)
