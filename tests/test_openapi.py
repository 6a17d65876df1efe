"""docs/openapi.yaml: a valid OpenAPI 3.1 document (openapi-spec-validator), and lint rules
that catch what a validator lets through: a YAML slip that turns prose into a property
name, an operation without an id or an error response, a schema nobody uses, a missing
security scheme."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from conftest import ROOT
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

SPEC_PATH = ROOT / "docs" / "openapi.yaml"
PROPERTY_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # the API's JSON members are snake_case
METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))


def walk(node: Any, path: str = "#") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}/{i}")


def test_the_document_is_valid_openapi_3_1(spec):
    assert spec["openapi"].startswith("3.1.")
    validate(spec)


def test_the_validator_refuses_a_broken_document(spec):
    broken = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
    broken["paths"]["/v1/authorize"]["post"]["responses"] = "none"
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_every_property_name_is_a_member_name_not_prose(spec):
    for path, node in walk(spec):
        if path.endswith("/properties") and isinstance(node, dict):
            bad = [name for name in node if not PROPERTY_NAME.match(name)]
            assert not bad, f"{path}: property names {bad} (a YAML slip? quote a description holding `, ` or `: `)"


SCHEMA_KEYWORDS = {
    "type", "description", "properties", "required", "additionalProperties", "items", "enum", "const", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
    "maxItems", "uniqueItems", "oneOf", "anyOf", "allOf", "not", "$ref", "default", "examples", "example", "title",
    "nullable", "readOnly", "writeOnly", "deprecated", "contentEncoding", "contentMediaType", "propertyNames",
    "minProperties", "maxProperties", "patternProperties", "discriminator"}


def schemas(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object: the components' and those nested in them or in operations."""
    for path, node in walk(spec):
        parent = path.rsplit("/", 2)
        if not isinstance(node, dict):
            continue
        if (len(parent) == 3 and parent[1] in ("schemas", "properties")) or path.endswith(("/schema", "/items")):
            yield path, node


def test_every_schema_holds_only_schema_keywords(spec):
    checked = 0
    for path, node in schemas(spec):
        unknown = set(node) - SCHEMA_KEYWORDS
        assert not unknown, f"{path}: {unknown} is no schema keyword (a YAML slip? quote text holding `, ` or `: `)"
        checked += 1
    assert checked > 30


def test_the_keyword_lint_catches_the_slip_it_was_written_for():
    slipped = yaml.safe_load("type: {type: string, description: A type, e.g. User.}")
    assert set(slipped["type"]) - SCHEMA_KEYWORDS == {"e.g. User."}


def test_every_operation_has_an_id_a_summary_and_its_errors(spec):
    ids = []
    for route, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            ids.append(operation["operationId"])
            assert operation.get("summary"), (route, method)
            statuses = set(operation["responses"])
            assert any(s.startswith("2") for s in statuses), (route, method)
            if method == "post":  # a body can be refused
                assert "400" in statuses or "default" in statuses, (route, method)
    assert len(ids) == len(set(ids))


def test_every_component_is_used_and_every_reference_resolves(spec):
    text = SPEC_PATH.read_text(encoding="utf-8")
    for kind, components in spec["components"].items():
        if kind == "securitySchemes":
            continue
        for name in components:
            assert f"#/components/{kind}/{name}" in text, f"components/{kind}/{name} is never used"
    for _path, node in walk(spec):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            target: Any = spec
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]


def test_the_security_is_mutual_tls_or_none(spec):
    assert spec["components"]["securitySchemes"] == {"mutualTLS": {
        "type": "mutualTLS", "description": spec["components"]["securitySchemes"]["mutualTLS"]["description"]}}
    assert spec["security"] == [{"mutualTLS": []}, {}]
