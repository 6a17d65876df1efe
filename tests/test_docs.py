"""Docs that run: every fenced Python and shell block of README.md, docs/*.md and
examples/*/README.md runs as written, or is marked as an excerpt.

The rule, for whoever adds a block:
- A ```python, ```py, ```sh, ```bash or ```shell block RUNS: this test starts a sidecar
  (the example bundle `policies/`, fresh data, development keys) and executes the block
  from the repository root, Python with this interpreter, shell with `bash -euo pipefail`
  and `.venv/bin` first on PATH. Addresses in the block are replaced by the sidecar's
  own: 127.0.0.1:50051 and 127.0.0.1:50061 (gRPC), 127.0.0.1:8080 (the HTTP API). A block
  passes when it exits 0 within BLOCK_TIMEOUT seconds.
- A block that cannot run as written (it serves until stopped, needs your session, a
  cluster or a database you own, or is a synopsis of options) is an EXCERPT: put
      <!-- excerpt: what it leaves out, and where the whole thing runs -->
  on the line right before its opening fence. The reason is required.
Other blocks (```yaml, ```text, plain ```) are not run.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from conftest import ROOT

RUN_LANGUAGES = {"python", "py", "sh", "bash", "shell"}
EXCERPT = re.compile(r"<!--\s*excerpt:\s*(?P<reason>\S.*?)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[A-Za-z0-9_+-]*)\s*$")
BLOCK_TIMEOUT = 180
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "examples").glob("*/README.md"))]


@dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    excerpt: str | None  # the marker's reason, or None: the block runs

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: pathlib.Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{path.relative_to(ROOT)}:{i + 1}: a fence that never closes"
        language = opening.group("info").lower()
        if language in RUN_LANGUAGES:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = EXCERPT.search(before)
            indent = len(opening.group("indent"))
            code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
            yield Block(path, i + 1, language, code, marker.group("reason") if marker else None)
        i = end + 1


ALL_BLOCKS = [block for document in DOCUMENTS for block in blocks(document)]
RUNNABLE = [block for block in ALL_BLOCKS if block.excerpt is None]


def how_to_fix(block: Block, why: str) -> str:
    return (f"{block.where}: this ```{block.language} block does not run as written ({why}).\n"
            f"Either make it run (tests/test_docs.py runs it from the repository root against a sidecar it "
            f"starts on the example bundle; 127.0.0.1:50051/50061 and 127.0.0.1:8080 become that sidecar's "
            f"gRPC and HTTP addresses), or mark it as an excerpt by putting\n"
            f"    <!-- excerpt: what it leaves out, and where the whole thing runs -->\n"
            f"on the line right before its opening fence.")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("docs-sidecar")
    config = data / "toolauthz.yaml"
    config.write_text(json.dumps({"bundle": str(ROOT / "policies"), "data_dir": str(data / "data"),
                                  "listen": "127.0.0.1:0", "http_listen": "127.0.0.1:0",
                                  "generate_missing_keys": True, "reload_poll_seconds": 0}))
    proc = subprocess.Popen([sys.executable, "-m", "toolauthz.cli", "serve", "--config", str(config), "--workers", "1",
                             "--log-format", "json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            banner = json.loads(line)
            if banner["message"].startswith("toolauthz serving bundle"):
                break
        else:
            pytest.fail(f"the sidecar did not start (exit {proc.wait()})")
        yield {"127.0.0.1:50051": banner["listen"][0], "127.0.0.1:50061": banner["listen"][0],
               "127.0.0.1:8080": banner["http_listen"][0]}
    finally:
        proc.terminate()
        proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()


def test_every_excerpt_says_what_it_leaves_out():
    assert ALL_BLOCKS and RUNNABLE
    for block in ALL_BLOCKS:
        if block.excerpt is not None:
            assert len(block.excerpt.split()) >= 3, f"{block.where}: say what the excerpt leaves out"


def test_the_markers_are_found_only_right_before_a_fence(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- excerpt: a synopsis of every option -->\n\n```sh\ntoolauthz --help\n```\n"
                    "<!-- excerpt: far away -->\n\ntext\n\n```python\nprint(1)\n```\n```yaml\na: 1\n```\n")
    found = [(b.language, b.excerpt) for b in blocks(page)]
    assert found == [("sh", "a synopsis of every option"), ("python", None)]


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_the_block_runs_as_written(block: Block, sidecar: dict[str, str], tmp_path):
    code = block.code
    for written, actual in sidecar.items():
        code = code.replace(written, actual)
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    if block.language in ("python", "py"):
        command = [sys.executable, "-c", code]
    else:
        command = ["bash", "-euo", "pipefail", "-c", code]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(how_to_fix(block, f"still running after {BLOCK_TIMEOUT} s"))
    assert done.returncode == 0, how_to_fix(block, f"exit {done.returncode}") + \
        f"\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
