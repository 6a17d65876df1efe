"""Tool names take MCP's characters (A-Z a-z 0-9 _ - ., 1 to 128; toolauthz.model.TOOL_NAME)
everywhere a name is checked: the catalog, Cedar's `tool:<name>` actions, the engine, the
audit trail and its filter. Names that would look alike (a control, zero-width or
non-ASCII character, or a twin that differs only in case) are refused or never match
(security.md category 19)."""

from __future__ import annotations

import json
import pathlib

import pytest
from conftest import make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.errors import BundleError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

WEATHER = "Get-Weather.v2"
TOOL_FILE = """name: {name}
description: The weather of a city.
side_effect: read
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties: {{city: {{type: string, maxLength: 40}}}}
  required: [city]
  additionalProperties: false
"""


def add_tool(bundle_dir: pathlib.Path, name: str, file_name: str | None = None) -> None:
    (bundle_dir / "tools" / f"{file_name or 'weather'}.yaml").write_text(TOOL_FILE.format(name=json.dumps(name)))


def test_mcp_tool_names_load_and_are_decided_by_their_cedar_action(bundle_dir, request):
    add_tool(bundle_dir, WEATHER)
    (bundle_dir / "weather.cedar").write_text(f'@id("weather")\npermit (principal, action == '
                                              f'Action::"tool:{WEATHER}", resource);\n')
    assert WEATHER in load_bundle(bundle_dir).tools
    sidecar = request.getfixturevalue("sidecar")
    stub = request.getfixturevalue("stub")
    allowed = stub.Authorize(make_request(WEATHER, {"city": "Oslo"}, call_id="toolu_1"))
    assert allowed.decision == pb.ALLOW and allowed.token
    for n, other in enumerate(["get-weather.v2", "Get-Weather.v2\n", "Get-Weather.v2\u200b", "Get\u2010Weather.v2"]):
        refused = stub.Authorize(make_request(other, {"city": "Oslo"}, call_id=f"toolu_x{n}"))
        assert refused.decision == pb.DENY and [e.code for e in refused.errors] == ["unknown_tool"], repr(other)
    found = [r.event for r in sidecar.audit_log.query(AuditQuery(tool=WEATHER), limit=10)]
    assert [(e.tool, e.result) for e in found] == [(WEATHER, "ALLOW")]  # the look-alikes are other names


@pytest.mark.parametrize("name", ["get_weather", "get-weather", "weather.v2", "W", "2fa", "_private", "a" * 128,
                                  "-leading", "."])
def test_every_mcp_tool_name_is_a_catalog_name(bundle_dir, name):
    add_tool(bundle_dir, name)
    assert name in load_bundle(bundle_dir).tools


@pytest.mark.parametrize("name", ["", "a" * 129, "get weather", "get/weather", "read\n", "read\r", "read\x00",
                                  "read\u200b", "r\u0435ad", "caf\u00e9", "tool:x", "a\tb"])
def test_other_names_are_refused(bundle_dir, name):
    add_tool(bundle_dir, name)
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert any("tool name must be 1-128 of A-Z a-z 0-9 _ - ." in str(p) for p in refused.value.problems)


def test_names_that_differ_only_in_case_are_refused(bundle_dir):
    add_tool(bundle_dir, "get-weather", "a")
    add_tool(bundle_dir, "Get-Weather", "b")
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert [p.message for p in refused.value.problems] == [
        "tool name `Get-Weather` differs from `get-weather` (in tools/a.yaml) only in case"]


def test_an_mcp_upstream_name_takes_the_same_characters(bundle_dir):
    path = bundle_dir / "tools" / "weather.yaml"
    add_tool(bundle_dir, WEATHER)
    path.write_text(path.read_text() + "mcp: {name: get-weather.v2}\n")
    assert WEATHER in load_bundle(bundle_dir).tools
    path.write_text(TOOL_FILE.format(name=json.dumps(WEATHER)) + 'mcp: {name: "get weather\\u200b"}\n')
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert [p.pointer for p in refused.value.problems] == ["/mcp/name"]
