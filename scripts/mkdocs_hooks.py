"""mkdocs hooks for the docs site (mkdocs.yml): the repository's README.md is the site's
front page; the HTTP reference page is rendered from docs/openapi.yaml at build time (so
it cannot go stale); and a link from a page to a repository file outside docs/ (an
example, the deploy folder) is checked here, because mkdocs only knows the files under docs/.

A link whose file is missing is a warning, so `mkdocs build --strict` fails on it; a link
whose file exists becomes the file's repository path in code, since the site has no copy
of it to point to.
"""

from __future__ import annotations

import logging
import pathlib
import re
from typing import Any

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.plugins.toolauthz")
LINK = re.compile(r"!?\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
FRONT_PAGE = "index.md"
HTTP_PAGE = "http-reference.md"


def _root(config: MkDocsConfig) -> pathlib.Path:
    return pathlib.Path(config.docs_dir).parent


def on_files(files: Files, config: MkDocsConfig) -> Files:
    readme = (_root(config) / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, FRONT_PAGE, content=readme))
    openapi = yaml.safe_load((pathlib.Path(config.docs_dir) / "openapi.yaml").read_text(encoding="utf-8"))
    files.append(File.generated(config, HTTP_PAGE, content=render_openapi(openapi)))
    return files


def _cell(text: object) -> str:
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if ref := schema.get("$ref"):
        name = ref.rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items'))}"
    if variants := schema.get("oneOf") or schema.get("anyOf"):
        return " or ".join(_schema_name(v) for v in variants)
    return f"`{schema.get('type', 'any JSON value')}`"


def _body_schema(part: dict[str, Any] | None) -> dict[str, Any] | None:
    return ((part or {}).get("content") or {}).get("application/json", {}).get("schema")


def render_openapi(openapi: dict[str, Any]) -> str:
    """docs/openapi.yaml as a page: the endpoints, then every schema's properties."""
    info = openapi["info"]
    out = [f"# HTTP reference\n\n{info.get('summary', '')} Rendered from [openapi.yaml](openapi.yaml) "
           f"(version {info['version']}) when the site is built; [the HTTP/JSON API](http-api.md) explains it.\n\n",
           "| method | path | request | answer | summary |\n|---|---|---|---|---|\n"]
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or method.startswith("x-"):
                continue
            answer = _body_schema(operation.get("responses", {}).get("200"))
            out.append(f"| {method.upper()} | `{path}` | {_schema_name(_body_schema(operation.get('requestBody')))} | "
                       f"{_schema_name(answer)} | {_cell(operation.get('summary', ''))} |\n")
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and operation.get("description"):
                out.append(f"\n## {method.upper()} `{path}`\n\n{operation['description'].strip()}\n")
    out.append("\n## Schemas\n")
    for name, schema in openapi.get("components", {}).get("schemas", {}).items():
        out.append(f"\n### {name}\n\n")
        if schema.get("description"):
            out.append(f"{_cell(schema['description'])}\n\n")
        properties = schema.get("properties") or {}
        if not properties:
            out.append(f"{_schema_name(schema)}\n")
            continue
        required = set(schema.get("required", []))
        out.append("| property | type | required | meaning |\n|---|---|---|---|\n")
        for prop, described in properties.items():
            out.append(f"| `{prop}` | {_schema_name(described)} | {'yes' if prop in required else ''} | "
                       f"{_cell(described.get('description', ''))} |\n")
    return "".join(out)


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
