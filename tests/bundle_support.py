"""Signed bundles and the real `toolauthz serve` (the installed console script), for the
tests of issue 37's attacks."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.conftest import ROOT
from toolauthz.bundle.signature import SIGNATURE_FILE, sign_bundle

TOOLAUTHZ = str(pathlib.Path(sys.executable).with_name("toolauthz"))
LINE_TIMEOUT = 60  # a hung process fails the test instead of hanging it


def sign(bundle: pathlib.Path, key: Ed25519PrivateKey, revision: int) -> None:
    (bundle / SIGNATURE_FILE).write_bytes(sign_bundle(bundle, key, "ci-1", revision))


def public_key_file(tmp_path: pathlib.Path, key: Ed25519PrivateKey) -> pathlib.Path:
    path = tmp_path / "bundle-key.pub"
    path.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return path


class Served:
    """`toolauthz serve` (the installed console script), its output read line by line."""

    def __init__(self, config: pathlib.Path, env: dict[str, str] | None = None):
        # One worker: the process that checks the bundle at start is the one that serves.
        self.proc = subprocess.Popen([TOOLAUTHZ, "serve", "--config", str(config), "--workers", "1"], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def await_line(self, text: str) -> str:
        while True:
            line = self.lines.get(timeout=LINE_TIMEOUT)
            self.seen.append(line)
            assert line, f"the sidecar ended (exit {self.proc.wait()}) before `{text}`:\n{''.join(self.seen)}"
            if text in line:
                return line

    def port(self) -> int:
        line = self.await_line("serving")
        return int(line.split(" on ")[1].split(",")[0].rsplit(":", 1)[1])

    def output_until_exit(self) -> tuple[int, str]:
        code = self.proc.wait(timeout=LINE_TIMEOUT)
        while (line := self.lines.get(timeout=LINE_TIMEOUT)) != "":
            self.seen.append(line)
        return code, "".join(self.seen)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def served_processes() -> Iterator:
    """A fixture's body: `start(config, env)` runs a `Served`; every one is stopped at the end."""
    started: list[Served] = []

    def start(config: pathlib.Path, env: dict[str, str] | None = None) -> Served:
        started.append(Served(config, env))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def write_config(tmp_path: pathlib.Path, bundle: pathlib.Path, public: pathlib.Path, **extra: object) -> pathlib.Path:
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"bundle": str(bundle), "data_dir": str(tmp_path / "data"),
                                  "listen": "127.0.0.1:0", "generate_missing_keys": True,
                                  "reload_poll_seconds": 0,
                                  "bundle_verification": {"keys": [{"kid": "ci-1", "file": str(public)}]},
                                  **extra}))
    return config


