"""The client is light: it imports no policy engine, and reads output schemas itself,
giving the same schemas as the sidecar's catalog."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from toolauthz.bundle.catalog import load_catalog
from toolauthz.client import ToolSet, load_output_schemas
from toolauthz.errors import BundleError, Problem

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = "https://json-schema.org/draft/2020-12/schema"
INPUT = {"$schema": SCHEMA, "type": "object", "properties": {"x": {"type": "string"}}}

# Runs in a fresh interpreter in which the policy engine and the sidecar's own layers
# cannot be imported at all: any import of them, however indirect, fails the script.
_BLOCKED_SCRIPT = textwrap.dedent("""
    import sys

    BLOCKED = ("cedarpy", "toolauthz.bundle", "toolauthz.engine", "toolauthz.store", "toolauthz.server")

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked in this test: {name}")
            return None

    sys.meta_path.insert(0, Blocker())

    import toolauthz.client
    from toolauthz.client import ToolSet, load_output_schemas

    schemas = load_output_schemas("policies")
    tools = ToolSet(output_schemas=schemas)
    tool = tools.register("issue_refund", lambda args, call: None)
    assert tool.validator is not None, "issue_refund has an output schema"
    loaded = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
    assert not loaded, loaded
    print("ok", ",".join(sorted(schemas)))
""")


def test_the_client_imports_without_the_policy_engine() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _BLOCKED_SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ") and "issue_refund" in done.stdout


def _catalog_schemas(bundle_dir: pathlib.Path) -> dict[str, dict[str, object]]:
    problems: list[Problem] = []
    tools = load_catalog(bundle_dir / "tools", problems)
    assert problems == []
    return {name: tool.output_schema for name, tool in tools.items() if tool.output_schema is not None}


def test_the_same_schemas_as_the_catalog_for_the_shipped_bundle() -> None:
    schemas = load_output_schemas(ROOT / "policies")
    assert schemas  # the shipped bundle declares output schemas: the comparison means something
    assert schemas == _catalog_schemas(ROOT / "policies")


def _tool_file(name: str, output_schema: object = None) -> str:
    # JSON is YAML: each value on one line, in flow style.
    lines = [f"name: {name}", "side_effect: read", f"input_schema: {json.dumps(INPUT)}"]
    if output_schema is not None:
        lines.append(f"output_schema: {json.dumps(output_schema)}")
    return "\n".join(lines) + "\n"


def test_the_same_schemas_as_the_catalog_for_yaml_json_and_no_schema(tmp_path: pathlib.Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    output = {"$schema": SCHEMA, "type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
    (tools / "a.yaml").write_text(_tool_file("alpha", output))
    (tools / "b.yml").write_text(_tool_file("beta"))
    gamma = {"name": "gamma", "side_effect": "read", "input_schema": INPUT,
             "output_schema": {"$schema": SCHEMA, "type": "array"}}
    (tools / "c.json").write_text(json.dumps(gamma))
    (tools / "notes.txt").write_text("not a tool")
    schemas = load_output_schemas(tmp_path)
    assert set(schemas) == {"alpha", "gamma"}
    assert schemas == _catalog_schemas(tmp_path)


@pytest.mark.parametrize(("text", "pointer", "words"), [
    ("name: [unclosed\n", "", "cannot parse YAML"),
    ("- a list\n", "", "must hold a mapping"),
    ("side_effect: read\n", "/name", "must name its tool"),
    (_tool_file("bad", "a string"), "/output_schema", "must be a mapping"),
    (_tool_file("bad", {"type": "object"}), "/output_schema/$schema", "must declare"),
    (_tool_file("bad", {"$schema": SCHEMA, "type": 5}), "/output_schema/type", "invalid JSON Schema"),
])
def test_a_malformed_tool_file_fails_naming_the_file(tmp_path: pathlib.Path, text: str, pointer: str,
                                                     words: str) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "broken.yaml").write_text(text)
    with pytest.raises(BundleError) as info:
        load_output_schemas(tmp_path)
    [problem] = info.value.problems
    assert problem.file == "tools/broken.yaml" and problem.pointer == pointer and words in problem.message


def test_a_duplicate_tool_name_and_a_missing_directory_fail(tmp_path: pathlib.Path) -> None:
    with pytest.raises(BundleError, match="no `tools/` directory"):
        load_output_schemas(tmp_path)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "a.yaml").write_text(_tool_file("same"))
    (tmp_path / "tools" / "b.yaml").write_text(_tool_file("same"))
    with pytest.raises(BundleError, match=r"tools/b\.yaml: at `/name`: duplicate tool name `same` \(also in tools/a"):
        load_output_schemas(tmp_path)


def test_a_toolset_checks_outputs_against_the_schemas_read(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tools").mkdir()
    output = {"$schema": SCHEMA, "type": "object", "required": ["id"]}
    (tmp_path / "tools" / "a.yaml").write_text(_tool_file("alpha", output))
    tool = ToolSet(output_schemas=load_output_schemas(tmp_path)).register("alpha", lambda args, call: None)
    assert tool.output_schema == output and tool.validator is not None
