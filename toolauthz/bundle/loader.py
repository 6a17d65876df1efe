"""Loads a bundle directory into immutable, pre-parsed objects, or refuses it whole.

Layout:
    bundle.yaml            optional: {principal_types: [User], runtime_groups: ['Group::"oncall"']}
    schema.cedarschema     entity types (no namespace); actions are generated
    *.cedar                policies
    entities.json          optional static entities (groups, ...)
    tools/*.yaml|json      the tool catalog
Everything is parsed here, once per load, never per request, from a `BundleSnapshot`
(bundle/snapshot.py): the bytes read once, which a signature check covered when the
bundle is signed. Nothing here reads the disk.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cedarpy
import yaml

from toolauthz.bundle.catalog import ENTITY_TYPE, Tool, load_catalog
from toolauthz.bundle.cedar_schema import (
    APPROVE_ACTION,
    CedarType,
    action_declarations,
    approval_declarations,
    tool_context_type,
)
from toolauthz.bundle.context_reads import context_reads, narrowed
from toolauthz.bundle.entity_graph import UID, StaticGraph, references
from toolauthz.bundle.policies import (
    PolicyInfo,
    SourcePolicy,
    approval_group_problems,
    build_infos,
    locate,
    parse_file,
    policy_set,
    quoted_at,
    scope_actions,
    split_policies,
)
from toolauthz.bundle.snapshot import BundleSnapshot, read_snapshot
from toolauthz.bundle.suggest import Names, did_you_mean, names_of, with_excerpts
from toolauthz.display.hints import DisplayHint
from toolauthz.errors import BundleError, Problem

SCHEMA_FILE = "schema.cedarschema"
_ENTITY_DECL = re.compile(r"^\s*entity\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)", re.M)


@dataclass(frozen=True)
class ToolSlice:
    """What one tool's decision needs, prepared at load time."""

    tool: Tool
    # The context sent to Cedar: the declared one, narrowed to what the slice's policies
    # can read (context_reads.py).
    context_type: CedarType
    enforcing: cedarpy.PolicySet | None  # None: no policy can apply, so the answer is deny
    shadow: cedarpy.PolicySet | None  # enforcing + @shadow policies, when there are any
    # The static entities the slice's policies name, and all they lead to (entity_graph.py).
    policy_reach: frozenset[UID] = frozenset()


@dataclass(frozen=True)
class Bundle:
    directory: pathlib.Path  # where it came from, as configured (a name: never read again)
    version: str  # the snapshot's digest, short
    loaded_at: float
    principal_types: tuple[str, ...]
    tools: dict[str, ToolSlice]
    policies: dict[str, PolicyInfo]
    schema_text: str
    schema: cedarpy.Schema = field(repr=False)
    static_graph: StaticGraph = field(repr=False)  # entities.json
    approve: cedarpy.PolicySet | None = field(repr=False, default=None)  # who may approve
    approve_reach: frozenset[UID] = field(repr=False, default=frozenset())  # as ToolSlice.policy_reach
    # The entity types without the generated tool actions: what per-request entities are
    # validated against, so that their cost does not grow with the number of tools.
    entity_schema: cedarpy.Schema | None = field(repr=False, default=None)
    # The static entities a request reaches plus the entities the sidecar synthesizes for
    # its principal and resource, by (tenant, anchors, reach): most calls of a session
    # repeat them. engine.trusted_entities fills and bounds it.
    anchored_entities: dict[tuple[str, tuple[UID, ...], frozenset[UID]], cedarpy.Entities] = field(
        repr=False, compare=False, default_factory=dict)
    # Static entities that the runtime's entities may name as a parent (bundle.yaml
    # `runtime_groups`): groups whose members come from the caller's identity provider.
    runtime_groups: frozenset[UID] = field(repr=False, default=frozenset())
    # The revision its signature gives (bundle/signature.py), when it was verified.
    revision: int | None = None
    # The bytes it was parsed from: what the gateway's catalog is served from (GetCatalog).
    snapshot: BundleSnapshot | None = field(repr=False, compare=False, default=None)
    signer: str | None = None  # the key id of the signature verified, when it was

    @property
    def digest(self) -> str:
        """SHA-256 of the snapshot it was parsed from (every file, its signature included)."""
        return self.snapshot.digest if self.snapshot is not None else ""

    def display_of(self, tool: str) -> Mapping[str, DisplayHint]:
        """The tool's display hints (none for a tool this bundle does not have)."""
        sliced = self.tools.get(tool)
        return sliced.tool.display if sliced is not None else {}

    def usage_hints_of(self, tool: str) -> dict[str, DisplayHint | None]:
        """By meter of the tool, the display hint of the argument it sums (None: a count,
        or an argument without one), so that a meter of amounts reads like the amount."""
        sliced = self.tools.get(tool)
        if sliced is None:
            return {}
        display = sliced.tool.display
        return {m.name: display.get(m.sum) if m.sum is not None else None for m in sliced.tool.meters}


def load_bundle(source: str | pathlib.Path | BundleSnapshot) -> Bundle:
    """The bundle of a snapshot, or of a directory read into one (bundle/snapshot.py), or
    BundleError naming every problem. Its version is the digest of the bytes parsed."""
    snapshot = source if isinstance(source, BundleSnapshot) else read_snapshot(source)
    return _load(snapshot)


def _load(files: BundleSnapshot) -> Bundle:
    root = pathlib.Path(files.source)
    problems: list[Problem] = []

    principal_types = _read_manifest(files, problems)
    if not any(name.startswith("tools/") for name in files):
        problems.append(Problem(str(root / "tools"), "the bundle has no `tools/` directory"))
    tools = load_catalog(files.tool_files(), problems)
    user_schema = _read_text(files, SCHEMA_FILE, problems) or ""
    declared = {name.strip() for m in _ENTITY_DECL.finditer(user_schema) for name in m.group(1).split(",")}
    names = names_of(user_schema, ("Tenant", "Tool", "Approval"), tools)
    sources = {SCHEMA_FILE: user_schema}
    if "Approval" in declared:
        problems.append(Problem(SCHEMA_FILE, "`Approval` is generated by toolauthz; do not declare it"))
    prelude = "".join(f"entity {t};\n" for t in ("Tenant", "Tool") if t not in declared)
    prelude += approval_declarations(principal_types)
    for t in principal_types:
        if t not in declared:
            problems.append(Problem("bundle.yaml", f"principal type `{t}` is not declared in {SCHEMA_FILE}"))
    # A request's principal and resource are inside its tenant; a tenant cannot be either.
    if "Tenant" in principal_types:
        problems.append(Problem("bundle.yaml", "`Tenant` cannot be a principal type", pointer="/principal_types"))
    for tool in tools.values():
        if tool.resource_type == "Tenant":
            problems.append(Problem(tool.source, "`Tenant` cannot be a resource type", pointer="/resource/type"))
        if tool.resource_type not in declared and tool.resource_type != "Tool":
            problems.append(Problem(
                tool.source, f"resource type `{tool.resource_type}` is not declared in {SCHEMA_FILE}"
                + did_you_mean(tool.resource_type, declared), pointer="/resource/type"))
        for kind in sorted(set(tool.audit_entities) - declared):  # a typo would record nothing, silently
            problems.append(Problem(tool.source, f"audit.record_entities names `{kind}`, which is not declared in "
                                                 f"{SCHEMA_FILE}{did_you_mean(kind, declared)}",
                                    pointer=f"/audit/record_entities/{kind}"))
    schema_head = user_schema + "\n// generated by toolauthz from the tool catalog\n" + prelude
    schema_text = schema_head + action_declarations(tools, list(principal_types))
    schema = _parse_schema(schema_text, user_schema, problems) if not problems else None

    infos: list[PolicyInfo] = []
    seen: dict[str, str] = {}
    to_validate: list[tuple[str, SourcePolicy, dict[str, Any]]] = []
    cedar_files = sorted(name for name in files if "/" not in name and name.endswith(".cedar"))
    if not cedar_files:
        problems.append(Problem(str(root), "the bundle has no `*.cedar` policy files"))
    for rel in cedar_files:
        source = _read_text(files, rel, problems)
        if source is None:
            continue
        sources[rel] = source
        parsed = parse_file(rel, source, problems)
        file_infos = build_infos(rel, parsed, problems, seen)
        _check_actions(file_infos, source, names, problems)
        if schema is not None and len(parsed) == len(split_policies(source)):
            to_validate += [(rel, policy, est) for policy, est in parsed]
        infos.extend(file_infos)
    problems.extend(approval_group_problems(infos, APPROVE_ACTION, sources))
    if to_validate and schema is not None:  # to_validate is empty when schema is None
        _validate(to_validate, schema, lambda named: schema_head + action_declarations(named, list(principal_types)),
                  tools, names, problems)

    entity_schema = cedarpy.Schema.from_str(user_schema + "\n" + prelude) if schema is not None else None
    graph = _load_entities(files, schema, entity_schema, problems)
    runtime_groups = _read_runtime_groups(files, graph, problems)
    if problems or schema is None:  # no schema means a problem was recorded
        raise BundleError(with_excerpts(problems, sources))
    # (position, policy) by action named; None: the policies that name no action.
    by_action: dict[str | None, list[tuple[int, PolicyInfo]]] = {}
    for position, info in enumerate(infos):
        for action in info.actions if info.actions is not None else [None]:
            by_action.setdefault(action, []).append((position, info))
    slices = {name: _slice(tool, by_action, graph) for name, tool in tools.items()}
    approvers = [i for i in infos if not i.shadow and (i.actions is None or APPROVE_ACTION in i.actions)]
    return Bundle(root, files.version, time.time(), tuple(principal_types), slices,
                  {i.policy_id: i for i in infos}, schema_text, schema, graph,
                  policy_set(approvers) if approvers else None, _reach(graph, approvers), entity_schema,
                  runtime_groups=runtime_groups, snapshot=files)


def _read_manifest(files: BundleSnapshot, problems: list[Problem]) -> list[str]:
    if "bundle.yaml" not in files:
        return ["User"]
    try:
        data = yaml.safe_load(files.text("bundle.yaml")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problems.append(Problem("bundle.yaml", f"cannot read: {exc}"))
        return ["User"]
    types = data.get("principal_types", ["User"]) if isinstance(data, dict) else None
    if not isinstance(types, list) or not types or \
            not all(isinstance(t, str) and ENTITY_TYPE.fullmatch(t) for t in types):
        problems.append(Problem("bundle.yaml", "`principal_types` must be a non-empty list of entity type names",
                                pointer="/principal_types"))
        return ["User"]
    return types


RUNTIME_GROUP = re.compile(r'([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)::"([^"\\]*)"')


def _read_runtime_groups(files: BundleSnapshot, graph: StaticGraph, problems: list[Problem]) -> frozenset[UID]:
    """bundle.yaml `runtime_groups`: a list of `Type::"id"`, each a static entity (not a
    tenant) that the runtime's entities may name as a parent. A name that is no static
    entity is refused: such a group is open to the runtime already, so the entry could
    only be a typo."""
    try:
        data = yaml.safe_load(files.text("bundle.yaml")) if "bundle.yaml" in files else None
    except (UnicodeDecodeError, yaml.YAMLError):
        return frozenset()  # _read_manifest reports it
    entries = data.get("runtime_groups", []) if isinstance(data, dict) else []
    if not isinstance(entries, list):
        problems.append(Problem("bundle.yaml", "`runtime_groups` must be a list of entities, "
                                'e.g. [\'Group::"oncall"\']', pointer="/runtime_groups"))
        return frozenset()
    groups = set()
    for index, entry in enumerate(entries):
        found = RUNTIME_GROUP.fullmatch(entry) if isinstance(entry, str) else None
        where = f"/runtime_groups/{index}"
        if found is None:
            problems.append(Problem("bundle.yaml", "an entry of `runtime_groups` must be an entity "
                                    'like Group::"oncall"', pointer=where))
        elif found.group(1) == "Tenant":
            problems.append(Problem("bundle.yaml", "a tenant cannot be a runtime group", pointer=where))
        elif (found.group(1), found.group(2)) not in graph:
            known = (f'{uid[0]}::"{uid[1]}"' for uid in graph.uids)
            problems.append(Problem("bundle.yaml", f"`{entry}` is not an entity of entities.json; a group the bundle "
                                    f"does not define needs no opening{did_you_mean(entry, known)}", pointer=where))
        else:
            groups.add((found.group(1), found.group(2)))
    return frozenset(groups)


def _read_text(files: BundleSnapshot, rel: str, problems: list[Problem]) -> str | None:
    try:
        return files.text(rel)
    except KeyError:
        problems.append(Problem(rel, "file is missing"))
    except UnicodeDecodeError as exc:
        problems.append(Problem(rel, f"cannot read file: {exc}"))
    return None


def _parse_schema(text: str, user_schema: str, problems: list[Problem]) -> cedarpy.Schema | None:
    try:
        return cedarpy.Schema.from_str(text)
    except ValueError as exc:
        located = split_policies(user_schema)  # the same scanner splits schema declarations
        line, col = 0, 0
        for decl in located:
            line, col = locate(decl, str(exc))
            if (line, col) != (decl.line, decl.col):
                break
        else:
            line, col = 0, 0
        problems.append(Problem(SCHEMA_FILE, f"invalid schema: {exc}", line, col))
        return None


def _check_actions(infos: list[PolicyInfo], source: str, names: Names, problems: list[Problem]) -> None:
    for info in infos:
        for action in sorted(info.actions or ()):
            if action != APPROVE_ACTION and not (action.startswith("tool:") and action[5:] in names.tools):
                line, col = quoted_at(source, info.line, action)
                problems.append(Problem(
                    info.file, f"policy `{info.policy_id}` names action `{action}` but no such tool is catalogued"
                    + did_you_mean(action, names.actions), line, col))


def _validate(policies: list[tuple[str, SourcePolicy, dict[str, Any]]], schema: cedarpy.Schema,
              schema_for: Callable[[dict[str, Tool]], str], tools: dict[str, Tool], names: Names,
              problems: list[Problem]) -> None:
    """Cedar's validation of every policy, in groups by the actions their scopes name,
    each group against a schema that declares only those tool actions (`schema_for`).
    The validator checks each policy against every action the schema declares, so one
    schema of every tool would make a bundle's load grow with tools x policies (37 s at
    1,000 tools and 10,000 policies: docs/performance.md). A policy's scope admits only
    its own actions, so it meets the same request types either way; a policy whose scope
    names no action, or an action that is no catalogued tool, meets the whole schema."""
    groups: dict[frozenset[str] | None, list[tuple[str, SourcePolicy, dict[str, Any]]]] = {}
    for item in policies:
        actions = scope_actions(item[2])
        if actions is not None and not all(a == APPROVE_ACTION or (a.startswith("tool:") and a[5:] in tools)
                                           for a in actions):
            actions = None
        groups.setdefault(actions, []).append(item)
    for actions, group in groups.items():
        against = schema
        if actions is not None:
            named = {a[5:]: tools[a[5:]] for a in sorted(actions) if a != APPROVE_ACTION}
            try:
                against = cedarpy.Schema.from_str(schema_for(named))
            except ValueError:  # a part of a schema that parsed: not expected, but never fatal
                against = schema
        result = cedarpy.validate_policies("\n".join(policy.text for _, policy, _ in group), against)
        for error in result.errors:
            index = int(error.policy_id[6:]) if error.policy_id.startswith("policy") else 0
            rel, policy, _ = group[min(index, len(group) - 1)]
            message = re.sub(r"^for policy `policy\d+`, ", "", error.error)
            line, col = locate(policy, message)
            problems.append(Problem(rel, message + names.for_cedar_message(message), line, col))


def _load_entities(files: BundleSnapshot, schema: cedarpy.Schema | None, entity_schema: cedarpy.Schema | None,
                   problems: list[Problem]) -> StaticGraph:
    text = "[]"
    if "entities.json" in files:
        text = _read_text(files, "entities.json", problems) or "[]"
    try:
        graph = StaticGraph(json.loads(text))
        if schema is not None:
            cedarpy.Entities.from_json_str(text, schema=schema)  # validated against the whole schema
            # Requests parse parts of it with `entity_schema` (engine.trusted_entities):
            # the same check, without the generated tool actions.
            cedarpy.Entities.from_json_str(text, schema=entity_schema)
        return graph
    except (ValueError, KeyError, TypeError) as exc:
        problems.append(Problem("entities.json", f"invalid entities: {exc}"))
        return StaticGraph([])


def _reach(graph: StaticGraph, infos: list[PolicyInfo]) -> frozenset[UID]:
    """The static entities these policies name (scopes and literals), with all they lead to."""
    return graph.closure(uid for info in infos for uid in references(info.est))


def _slice(tool: Tool, by_action: dict[str | None, list[tuple[int, PolicyInfo]]], graph: StaticGraph) -> ToolSlice:
    # Back in the bundle's order: a slice lists its policies as the bundle's files do,
    # whichever index entry (unscoped or this tool's action) each came from.
    applicable = [info for _, info in sorted(by_action.get(None, []) + by_action.get(f"tool:{tool.name}", []),
                                             key=lambda item: item[0])]
    enforcing = [i for i in applicable if not i.shadow]
    shadow = [i for i in applicable if i.shadow]
    return ToolSlice(
        tool=tool,
        context_type=narrowed(tool_context_type(tool), context_reads(i.est for i in applicable)),
        enforcing=policy_set(enforcing) if enforcing else None,
        shadow=policy_set(applicable) if shadow else None,
        policy_reach=_reach(graph, applicable),
    )

