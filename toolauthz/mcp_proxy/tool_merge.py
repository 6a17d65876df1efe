"""Importing an upstream tool again into a tool file a person has edited.

The importer owns what the server says: `description`, `mcp` (the pins), and the
schemas when the server changed them (the advertised input schema's digest differs from
`mcp.input_schema_sha256`; a schema a person made stricter for an unchanged tool is
kept). Everything else is the person's: `side_effect` (a changed suggestion is printed,
not applied), `resource`, `limits`, `audit`, any other key, the key order and every
comment. The file is read and written with ruamel.yaml's round trip, which keeps them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

__all__ = ["Merged", "merge_tool_file"]


@dataclass(frozen=True)
class Merged:
    text: str
    notes: tuple[str, ...]  # what a person should look at (a changed side_effect suggestion)


def _round_trip() -> YAML:
    handler = YAML(typ="rt")
    handler.preserve_quotes = True
    handler.width = 100
    return handler


def merge_tool_file(existing: str, draft_text: str) -> Merged | None:
    """The existing file with the draft's server-owned parts; None when the existing file
    is not a YAML mapping (then it is left alone)."""
    handler = _round_trip()
    try:
        document = handler.load(existing)
    except YAMLError:
        return None
    if not isinstance(document, dict):
        return None
    draft: dict[str, Any] = yaml.safe_load(draft_text)
    notes: list[str] = []
    pinned = document.get("mcp")
    pinned_digest = pinned.get("input_schema_sha256") if isinstance(pinned, dict) else None
    server_changed_schema = pinned_digest != draft["mcp"]["input_schema_sha256"]
    document["description"] = draft["description"]
    if server_changed_schema or "input_schema" not in document:
        document["input_schema"] = draft["input_schema"]
    if "output_schema" in draft and (server_changed_schema or "output_schema" not in document):
        document["output_schema"] = draft["output_schema"]
    if isinstance(document.get("mcp"), dict):
        for key, value in draft["mcp"].items():
            document["mcp"][key] = value
    else:
        document["mcp"] = draft["mcp"]
    if "side_effect" not in document:
        document["side_effect"] = draft["side_effect"]
    elif document["side_effect"] != draft["side_effect"]:
        notes.append(f"side_effect is {document['side_effect']}; the server's annotations now suggest "
                     f"{draft['side_effect']} (kept: a person decides)")
    out = io.StringIO()
    handler.dump(document, out)
    return Merged(out.getvalue(), tuple(notes))
