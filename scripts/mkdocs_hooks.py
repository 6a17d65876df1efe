"""mkdocs hooks for the docs site (mkdocs.yml): the repository's README.md is the site's
front page, and a link from a page to a repository file outside docs/ (an example, the
deploy folder) is checked here, because mkdocs only knows the files under docs/.

A link whose file is missing is a warning, so `mkdocs build --strict` fails on it; a link
whose file exists becomes the file's repository path in code, since the site has no copy
of it to point to.
"""

from __future__ import annotations

import logging
import pathlib
import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.plugins.toolauthz")
LINK = re.compile(r"!?\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FRONT_PAGE = "index.md"


def _root(config: MkDocsConfig) -> pathlib.Path:
    return pathlib.Path(config.docs_dir).parent


def on_files(files: Files, config: MkDocsConfig) -> Files:
    readme = (_root(config) / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, FRONT_PAGE, content=readme))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    root = _root(config).resolve()
    docs = pathlib.Path(config.docs_dir).resolve()
    front = page.file.src_uri == FRONT_PAGE
    # README.md (the front page) links from the repository root: `docs/x.md` is `x.md` on the site.
    page_dir = root if front else (docs / page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
            return match.group(0)
        resolved = (page_dir / target.split("#", 1)[0]).resolve()
        if resolved.is_relative_to(docs):
            if front:
                site_target = target.removeprefix("docs/")
                return match.group(0).replace(f"]({target})", f"]({site_target})")
            return match.group(0)
        if not resolved.is_relative_to(root) or not resolved.exists():
            log.warning("%s links to `%s`, which is not in the repository", page.file.src_uri, target)
            return match.group(0)
        where = resolved.relative_to(root).as_posix()
        text = match.group("text")
        return text if text.strip("`") == where else f"{text} (`{where}`)"

    return LINK.sub(rewrite, markdown)
