"""Suite YAML files read with the line of every key and item, and the checks every part
of a suite shares (`SuiteFile`): problems are collected as (file, line, message)."""

from __future__ import annotations

import difflib
import pathlib
from typing import Any

import yaml

from toolauthz.bundle.suggest import did_you_mean
from toolauthz.model import Principal

PRINCIPAL_KEYS: tuple[set[str], set[str]] = ({"type", "id"}, set())


class YamlMap(dict[Any, Any]):
    line: int = 0  # the mapping's line
    lines: dict[Any, int] = {}  # each key's line, set per instance by the loader

    def at(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class YamlSeq(list[Any]):
    line: int = 0  # the sequence's line
    lines: list[int] = []  # each item's line, set per instance by the loader

    def at(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> YamlMap:
    own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)  # `<<: *anchor` pairs come first; the mapping's own keys override them
    out, explicit = YamlMap(), set()
    out.line, out.lines = node.start_mark.line + 1, {}
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (dict, list)) or key in explicit:
            problem = "a mapping key must be a scalar" if isinstance(key, (dict, list)) else f"duplicate key `{key}`"
            raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
        if i >= len(node.value) - own:
            explicit.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> YamlSeq:
    out = YamlSeq(loader.construct_object(child, deep=True) for child in node.value)
    out.line, out.lines = node.start_mark.line + 1, [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_seq)


class SuiteFile:
    """One YAML file being read; collects its problems as (file, line, message)."""

    def __init__(self, root: pathlib.Path, path: pathlib.Path, problems: list):
        self.rel, self.problems, self.data = path.relative_to(root).as_posix(), problems, None
        try:
            self.data = yaml.load(path.read_text(encoding="utf-8"), Loader=_LineLoader)
            if self.data is None:
                self.error(0, "the file is empty")
        except (OSError, UnicodeDecodeError) as exc:
            self.error(0, f"cannot read file: {exc}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            self.error(mark.line + 1 if mark else 0, f"invalid YAML: {getattr(exc, 'problem', None) or exc}")

    def error(self, line: int, message: str) -> None:
        self.problems.append((self.rel, line, message))

    def mapping(self, value, line: int, what: str, keys: tuple[set, set] | None = None) -> bool:
        """Is `value` a mapping? Also reports missing and unknown `keys` (required, optional)."""
        if not isinstance(value, YamlMap):
            self.error(line, f"{what} must be a mapping")
            return False
        required, optional = keys if keys is not None else (set(), None)
        if optional is None:
            return True
        for key in value:
            if key not in required | optional:
                close = difflib.get_close_matches(str(key), sorted(required | optional), n=1)
                hint = f"did you mean `{close[0]}`?" if close else \
                    "expected one of " + ", ".join(f"`{k}`" for k in sorted(required | optional))
                self.error(value.at(key), f"unknown key `{key}` in {what}; {hint}")
        for key in sorted(required - set(value)):
            self.error(value.line, f"{what} is missing `{key}`")
        return True

    def string(self, m: YamlMap, key: str, what: str) -> str | None:
        value = m.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            self.error(m.at(key), f"`{key}` of {what} must be a non-empty string")
            return None
        return value

    def principal(self, value, line: int, what: str) -> Principal | None:
        if not self.mapping(value, line, what, PRINCIPAL_KEYS):
            return None
        ptype, pid = self.string(value, "type", what), self.string(value, "id", what)
        return Principal(ptype, pid) if ptype and pid else None

    def entity_list(self, value, line: int, what: str) -> tuple[dict, ...] | None:
        if not isinstance(value, YamlSeq) or not all(isinstance(e, YamlMap) for e in value):
            self.error(line, f"{what} must be a list of Cedar entities (`uid`, `attrs`, `parents`)")
            return None
        return tuple(value)

    def named_principal(self, value: Any, line: int, what: str, principals: dict[str, Principal]) -> Principal | None:
        """A principal name of `principals`, or an inline `{type, id}`."""
        if isinstance(value, str):
            if value not in principals:
                self.error(line, f"unknown principal `{value}`{did_you_mean(value, principals)}")
            return principals.get(value)
        return self.principal(value, line, f"`principal` of {what}") if value is not None else None

    def entity_refs(self, refs: Any, line: int, what: str, entity_sets: dict) -> list[dict]:
        """`entities:` of a case or approver: entity set names and inline lists, merged;
        an entity listed twice is kept once."""
        if not isinstance(refs, YamlSeq):
            self.error(line, f"`entities` of {what} must be a list of entity set names and entity lists")
            return []
        entities: list[dict] = []
        for i, ref in enumerate(refs):
            if isinstance(ref, str) and ref not in entity_sets:
                self.error(refs.at(i), f"unknown entity set `{ref}`{did_you_mean(ref, entity_sets)}")
            found = entity_sets.get(ref, ()) if isinstance(ref, str) else self.entity_list(
                ref if isinstance(ref, YamlSeq) else YamlSeq([ref]), refs.at(i),
                f"an inline entry of `entities` of {what}")
            entities.extend(e for e in found or () if e not in entities)
        return entities

    def define(self, section, line: int, kind: str, table: dict, where: dict) -> None:
        """Add the named principals or entity sets of `section` to `table`."""
        if not self.mapping(section, line, f"`{kind}`"):
            return
        label = "principal" if kind == "principals" else "entity set"
        for name, value in section.items():
            key, what = (kind, str(name)), f"{label} `{name}`"
            if key in where:
                self.error(section.at(name), f"{what} is already defined in {where[key]}")
                continue
            where[key] = f"{self.rel}:{section.at(name)}"
            parse = self.principal if kind == "principals" else self.entity_list
            parsed = parse(value, section.at(name), what)
            if parsed is not None:
                table[str(name)] = parsed
