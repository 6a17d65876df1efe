"""`toolauthz catalog import-mcp`: the annotation table, closed input schemas, the
resource hint from the tool's own schema, and re-imports that merge into what a person
wrote."""

from __future__ import annotations

import io
import itertools
import shutil
import sys

import mcp_types as types
import pytest
import yaml
from mcp_support import EXAMPLE

from examples.mcp_gateway.upstream import TOOLS
from toolauthz.mcp_proxy.importer import catalog_name, draft_for, resource_hint, side_effect_of, write_drafts
from toolauthz.mcp_proxy.pins import load_pins, schema_sha256

HINTS = (True, False, None)


def expected_side_effect(read_only: bool | None, destructive: bool | None, open_world: bool | None) -> str:
    """The README's table, row by row."""
    rows = [((True, "any", "any"), "read"), ((False, True, "any"), "delete"),
            ((False, False, True), "communicate"), ((False, False, False), "create")]
    given = (read_only is True, destructive is not False, open_world is not False)
    for (r, d, o), side_effect in rows:
        if r == given[0] and d in ("any", given[1]) and o in ("any", given[2]):
            return side_effect
    raise AssertionError("the table covers every combination")


@pytest.mark.parametrize("read_only,destructive,open_world", list(itertools.product(HINTS, HINTS, HINTS)))
def test_each_hint_combination_maps_by_the_table(read_only, destructive, open_world):
    hints = types.ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive, open_world_hint=open_world)
    assert side_effect_of(hints)[0] == expected_side_effect(read_only, destructive, open_world)


def test_the_conservative_defaults():
    assert side_effect_of(None)[0] == "delete"  # no annotations: MCP presumes it may be destructive
    send_sms = types.ToolAnnotations(open_world_hint=True)
    assert side_effect_of(send_sms)[0] == "delete"  # openWorldHint alone does not say it is not destructive
    draft = draft_for(types.Tool(name="send-sms", input_schema={"type": "object"}, annotations=send_sms)).text
    assert "side_effect: delete" in draft and "no destructiveHint" in draft


def test_names_keep_mcp_tool_names_and_replace_anything_else():
    assert catalog_name("Get-Weather.v2") == "Get-Weather.v2"  # MCP's characters are catalog names as they are
    assert catalog_name("2fa") == "2fa"
    assert catalog_name("send sms\u200b\n") == "send_sms"  # a space, a zero-width and a control character
    assert catalog_name("\u0430pi") == "pi"  # a Cyrillic look-alike is never kept
    assert catalog_name("x" * 200) == "x" * 128
    assert draft_for(types.Tool(name="get-weather", input_schema={"type": "object"}), upstream="crm",
                     prefix="crm__").name == "crm__get-weather"


def schema_of(draft_text: str) -> dict:
    return yaml.safe_load(draft_text)["input_schema"]


def test_additional_properties_closed_only_where_the_upstream_schema_allows_it():
    plain = {"type": "object", "properties": {"q": {"type": "string"}}}
    assert schema_of(draft_for(types.Tool(name="a", input_schema=plain)).text)["additionalProperties"] is False
    assert "additionalProperties" not in plain  # the upstream's schema object is not changed
    opened = {**plain, "additionalProperties": True}
    text = draft_for(types.Tool(name="b", input_schema=opened)).text
    assert schema_of(text)["additionalProperties"] is True and "allows additional properties" in text
    composed = {"type": "object", "allOf": [{"properties": {"q": {}}}]}
    text = draft_for(types.Tool(name="c", input_schema=composed)).text
    assert "additionalProperties" not in schema_of(text) and "not a plain object schema" in text
    # The pin is the schema as advertised, so closing the catalog's copy keeps it valid.
    assert yaml.safe_load(draft_for(types.Tool(name="a", input_schema=plain)).text)["mcp"][
        "input_schema_sha256"] == schema_sha256(plain)


def test_the_resource_hint_comes_from_the_tools_own_schema():
    pinned = {"type": "object", "required": ["customer_id"],
              "properties": {"customer_id": {"type": "string", "pattern": "^c[0-9]+$"}}}
    assert resource_hint(pinned).startswith("# resource: {type: Customer, id: /customer_id}")
    assert "pin the id first" not in resource_hint(pinned)
    loose = {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}
    assert "{type: Order, id: /order_id}" in resource_hint(loose) and "pin the id first" in resource_hint(loose)
    none = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
    assert "no required `<thing>_id`" in resource_hint(none)
    assert "Note" not in draft_for(types.Tool(name="send", input_schema=none)).text


def test_drafts_load_and_are_pinned_to_the_upstream(tmp_path):
    from toolauthz.bundle import load_bundle
    from toolauthz.cli.main import main

    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    shutil.rmtree(bundle / "tools")
    assert write_drafts(bundle, TOOLS, sys.stdout, upstream="notes", prefix="notes__") == 0
    assert sorted(p.name for p in (bundle / "tools").iterdir()) == [
        "notes__delete_note.yaml", "notes__export_all_notes.yaml", "notes__read_note.yaml"]
    read = (bundle / "tools" / "notes__read_note.yaml").read_text()
    assert "side_effect: read" in read and "# resource: {type: Note, id: /note_id}" in read
    delete = (bundle / "tools" / "notes__delete_note.yaml").read_text()
    assert "side_effect: delete" in delete and "idempotentHint: true" in delete
    (bundle / "notes.cedar").write_text("")  # the example's policies name the unprefixed tools
    (bundle / "approvals.cedar").write_text("")
    assert sorted(load_bundle(bundle).tools) == ["notes__delete_note", "notes__export_all_notes", "notes__read_note"]
    assert main(["check", str(bundle)]) == 0
    pins = load_pins(bundle)
    assert {(p.upstream, p.upstream_name) for p in pins.values()} == {
        ("notes", t.name) for t in TOOLS}
    assert all(pins["notes__" + t.name].input_schema_sha256 == schema_sha256(t.input_schema) for t in TOOLS)


PERSON_EDITS = """# Reviewed by Ada: deleting a note is an update in our model.
resource: {type: Note, id: /note_id}  # what the policies decide on
limits: {max_input_bytes: 512}
audit:
  record: [/note_id]
"""


def test_importing_again_merges_and_keeps_what_a_person_wrote(tmp_path):
    bundle = tmp_path / "bundle"
    original = TOOLS[1]  # delete_note
    write_drafts(bundle, [original], io.StringIO())
    path = bundle / "tools" / "delete_note.yaml"
    edited = path.read_text().replace("side_effect: delete", "side_effect: update") + PERSON_EDITS
    edited = edited.replace("pattern: ^[an][0-9]{1,6}$", "pattern: ^[an][0-9]{1,6}$\n      maxLength: 7")
    path.write_text(edited)
    assert "maxLength: 7" in edited

    # The server rewords the description and now says the tool is not destructive.
    reworded = original.model_copy(update={"description": "Delete one note.", "annotations": types.ToolAnnotations(
        destructive_hint=False, open_world_hint=False)})
    out = io.StringIO()
    assert write_drafts(bundle, [reworded], out) == 0
    merged = path.read_text()
    document = yaml.safe_load(merged)
    assert document["description"] == "Delete one note."
    assert document["side_effect"] == "update" and "now suggest create (kept" in out.getvalue()
    assert document["resource"] == {"type": "Note", "id": "/note_id"}
    assert document["limits"] == {"max_input_bytes": 512} and document["audit"] == {"record": ["/note_id"]}
    assert "# Reviewed by Ada" in merged and "# what the policies decide on" in merged
    assert document["input_schema"]["properties"]["note_id"]["maxLength"] == 7  # schema unchanged upstream: kept
    assert "-description: Delete one note for good." in out.getvalue()

    # The server changes the input schema: the schema and its pin are updated, the rest kept.
    changed = reworded.model_copy(deep=True)
    changed.input_schema["properties"]["note_id"] = {"type": "string", "pattern": "^n[0-9]{1,8}$"}
    write_drafts(bundle, [changed], io.StringIO())
    document = yaml.safe_load(path.read_text())
    assert document["input_schema"]["properties"]["note_id"] == {"type": "string", "pattern": "^n[0-9]{1,8}$"}
    assert document["mcp"]["input_schema_sha256"] == schema_sha256(changed.input_schema)
    assert document["resource"] == {"type": "Note", "id": "/note_id"} and "# Reviewed by Ada" in path.read_text()
    # Unchanged: nothing written.
    again = io.StringIO()
    write_drafts(bundle, [changed], again)
    assert "unchanged: tools/delete_note.yaml" in again.getvalue()


def test_force_overwrites_and_a_broken_file_is_kept(tmp_path):
    bundle = tmp_path / "bundle"
    write_drafts(bundle, [TOOLS[0]], io.StringIO())
    path = bundle / "tools" / "read_note.yaml"
    path.write_text(path.read_text() + PERSON_EDITS)
    write_drafts(bundle, [TOOLS[0]], io.StringIO(), force=True)
    assert path.read_text() == draft_for(TOOLS[0]).text
    path.write_text("- not a mapping\n")
    assert write_drafts(bundle, [TOOLS[0]], io.StringIO()) == 1
    assert path.read_text() == "- not a mapping\n"
