"""The docs as a site: mkdocs.yml builds with --strict (a broken link, anchor or a page
left out of the nav fails), offline, with README.md as its front page; the reference
pages generated from the code are fresh (scripts/gen_docs.py); the README stays a front
page whose quickstart is the two commands it has always been."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

MKDOCS = ROOT / ".venv" / "bin" / "mkdocs"
BUILD_TIMEOUT = 300
QUICKSTART = ("```sh\n"
              "scripts/serve.sh    # sets up .venv, serves the example bundle on 127.0.0.1:50051 "
              "(data in .toolauthz/)\n"
              "scripts/test.sh     # sets up .venv, runs the whole test suite\n"
              "```\n")


def _build(project: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    # No network: a plugin or theme that fetched at build time would fail here, not pass slowly.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1", "HTTP_PROXY": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(project / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=project, env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT)


def _copy_of_the_docs(where: pathlib.Path) -> pathlib.Path:
    """What the site is built from, in a scratch directory, with the repository files the
    pages link to (examples/, deploy/)."""
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, where / name)
    for folder in ("docs", "examples", "deploy"):
        shutil.copytree(ROOT / folder, where / folder, ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    (where / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "mkdocs_hooks.py", where / "scripts" / "mkdocs_hooks.py")
    return where


def test_the_site_builds_strict_with_the_readme_as_front_page(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-5000:]
    front = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "scripts/serve.sh" in front and 'href="contract/"' in front
    http = (tmp_path / "site" / "http-reference" / "index.html").read_text(encoding="utf-8")
    assert "/v1/authorize-batch" in http and 'id="authorizerequest"' in http  # rendered from docs/openapi.yaml


@pytest.mark.parametrize("mistake, said", [
    ("[a](contract.md#no-such-section)", "does not contain an anchor '#no-such-section'"),
    ("[a](no-such-page.md)", "'no-such-page.md', but the target is not found"),
    ("[a](../examples/no-such-example/README.md)", "not in the repository"),
])
def test_a_broken_link_or_anchor_fails_the_build(tmp_path, mistake, said):
    project = _copy_of_the_docs(tmp_path)
    with (project / "docs" / "ports.md").open("a", encoding="utf-8") as page:
        page.write(f"\n{mistake}\n")
    done = _build(project, tmp_path / "site")
    assert done.returncode != 0 and said in done.stderr, done.stderr[-3000:]


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    project = _copy_of_the_docs(tmp_path)
    (project / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    done = _build(project, tmp_path / "site")
    assert done.returncode != 0 and "orphan.md" in done.stderr, done.stderr[-3000:]


def test_the_site_uses_no_plugin_that_fetches():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    # The file holds a !!python tag (pymdownx's slugify), so read only what this test needs.
    config = yaml.load(text, Loader=yaml.BaseLoader)  # BaseLoader builds no objects
    assert config["plugins"] == ["search"]
    assert config["theme"]["font"] == "false"


def test_the_generated_reference_pages_are_fresh():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_cli_reference_has_every_command():
    page = (ROOT / "docs" / "cli-reference.md").read_text(encoding="utf-8")
    for command in ("serve", "authorize", "config check", "audit verify", "store prune", "policy impact",
                    "hook claude-code", "version"):
        assert f"## `toolauthz {command}`" in page


def test_the_readme_is_a_front_page_with_the_quickstart_unchanged():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    assert QUICKSTART in readme


# One port per listener across every example (docs/ports.md): a setting and the port its
# examples give it. Two listeners sharing a port in the docs is how a newcomer's second
# example fails to start beside the first.
PORT_PLAN = {"console_listen": {"8700"}, "--console-listen": {"8700"}, "http_listen": {"8080"},
             "metrics_listen": {"9464", "9090"}, "approvals_listen": {"50052"}}
SETTING_WITH_ADDRESS = re.compile(r"(?P<setting>--console-listen|console_listen|http_listen|metrics_listen|"
                                  r"approvals_listen)\b[^\n]*?\b(?:127\.0\.0\.1|0\.0\.0\.0|localhost):(?P<port>\d+)")
EXAMPLE_SUFFIXES = {".md", ".yaml", ".yml", ".py", ".sh", ".ts", ".json"}


def _example_files() -> list[pathlib.Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("examples", "deploy", "scripts"):
        found += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.suffix in EXAMPLE_SUFFIXES and "node_modules" not in p.parts]
    return [p for p in found if p.name != "performance.md"]


def test_every_example_uses_the_port_plan():
    wrong = []
    for path in _example_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in SETTING_WITH_ADDRESS.finditer(line):
                if match.group("port") not in PORT_PLAN[match.group("setting")]:
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert not wrong, "ports outside docs/ports.md's plan:\n" + "\n".join(wrong)
    plan = (ROOT / "docs" / "ports.md").read_text(encoding="utf-8")
    for ports in PORT_PLAN.values():
        assert all(f"| {port} |" in plan for port in ports)


def test_the_port_check_finds_a_collision():
    assert SETTING_WITH_ADDRESS.search("toolauthz serve --console-listen 127.0.0.1:8080").group("port") == "8080"
    assert SETTING_WITH_ADDRESS.search("console_listen: 127.0.0.1:8700      # HOST:PORT").group("port") == "8700"


def test_the_performance_page_is_current_and_dated():
    lines = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 600
    for number, line in enumerate(lines):
        if line.startswith("|---"):
            before = " ".join(lines[max(0, number - 16):number])
            dated = re.search(r"commit [0-9a-f]{7}", before, re.IGNORECASE)
            assert dated, f"docs/performance.md:{number + 1}: a table without its commit and machine"


def test_every_excerpt_names_what_checks_it():
    """An excerpt is not run by tests/test_docs.py; its reason names the test, example or
    script that runs the whole thing, and that file exists."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_docs import ALL_BLOCKS

    named = re.compile(r"\b(?:tests|examples|clients|scripts|bench|deploy)/[\w./*-]*\w")  # a glob may name several
    unchecked = []
    for block in ALL_BLOCKS:
        if block.excerpt is None:
            continue
        if not any(any(ROOT.glob(found)) for found in named.findall(block.excerpt)):
            unchecked.append(f"{block.where}: {block.excerpt}")
    assert not unchecked, "excerpts that name nothing checking them:\n" + "\n".join(unchecked)
