"""Schemathesis, from outside, against docs/openapi.yaml and a live sidecar: the installed
`toolauthz serve` with the example bundle and its HTTP listener on port 0, and the
`schemathesis` command in a subprocess, as a user runs them. Its default checks (no server
error, status codes and response bodies and headers as the document says, negative data
refused, a method a path does not serve answered 405 with `Allow`) all run; the two
exceptions tests/schemathesis.toml makes say why. Bounded by `--max-examples` and a
fixed seed, so that a run takes about a minute on two cores and a failure replays."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import EXAMPLE_BUNDLE, ROOT

BIN = os.path.dirname(sys.executable)
MAX_EXAMPLES = 20
SEED = os.environ.get("TOOLAUTHZ_SCHEMATHESIS_SEED", "40")
HTTP_PORT = re.compile(r"HTTP on 127\.0\.0\.1:(\d+)")


@pytest.fixture
def http_port(tmp_path) -> Iterator[int]:
    """A sidecar serving the example bundle, its HTTP API on a free port."""
    data = tmp_path / "data"
    subprocess.run([f"{BIN}/toolauthz", "keys", "generate", "--data-dir", str(data)], check=True,
                   capture_output=True, timeout=60)
    config = tmp_path / "config.yaml"
    config.write_text("http_listen: 127.0.0.1:0\n", encoding="utf-8")
    proc = subprocess.Popen([f"{BIN}/toolauthz", "serve", "--bundle", str(EXAMPLE_BUNDLE), "--listen", "127.0.0.1:0",
                             "--data-dir", str(data), "--config", str(config), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        port = None
        for line in proc.stdout:  # the banner names the port; EOF if the sidecar dies
            if (found := HTTP_PORT.search(line)) is not None:
                port = int(found.group(1))
                break
        assert port is not None, f"the sidecar exited with {proc.wait(timeout=30)} before serving HTTP"
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_schemathesis_finds_no_disagreement_between_the_document_and_the_server(http_port, tmp_path):
    run = subprocess.run(
        [f"{BIN}/schemathesis", "--no-color", "--config-file", str(ROOT / "tests" / "schemathesis.toml"), "run",
         str(ROOT / "docs" / "openapi.yaml"), "--url", f"http://127.0.0.1:{http_port}",
         "--max-examples", str(MAX_EXAMPLES), "--seed", SEED, "--generation-database", ":memory:"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = run.stdout[-20000:]
    assert run.returncode == 0, report
    assert re.search(r"\b(\d+) generated, \1 passed", report), report
