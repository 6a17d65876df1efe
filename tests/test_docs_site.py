"""The docs as a site: mkdocs.yml builds with --strict (a broken link, anchor or a page
left out of the nav fails), offline, with README.md as its front page; the reference
pages generated from the code are fresh (scripts/gen_docs.py); the README stays a front
page whose quickstart is the two commands it has always been."""

from __future__ import annotations

import os
import pathlib
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
