"""The configuration reference and the JSON Schema, both read from the settings models.

`docs/configuration.md` is `render_reference()`'s output (`toolauthz config reference`);
tests/test_config_reference.py fails when the page and the models differ, and when a key
has no description. A key's description is the string literal under its field.
"""

from __future__ import annotations

import enum
import json
import pathlib
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from toolauthz.server.config.settings import Settings

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_HEADER = """\
# Configuration reference

<!-- Generated from the settings models (toolauthz/server/config/) by
     `toolauthz config reference > docs/configuration.md`; tests/test_config_reference.py
     fails when this page and the models differ. Edit the models, not this page. -->

`toolauthz serve --config FILE` reads one YAML file. A key not listed here is refused
(with a suggestion when it is close to a known one), and so is a value of the wrong type
or outside its range. Without `--config`, every key has its default and development keys
are generated on first start; with a file, `generate_missing_keys` is `false` unless the
file says otherwise. These environment variables override the file: {environment}.

- `toolauthz config check FILE` validates a file without serving (exit 0 or 1, the errors
  on standard error).
- `toolauthz config schema` prints the JSON Schema of the file, for editors (for example
  `# yaml-language-server: $schema=toolauthz.schema.json` at the top of the file).

A key written `a.b` is `b` inside the section `a`; `a[].b` is `b` in each entry of the
list `a`.
"""


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    meaning: str


def keys(model: type[BaseModel] = Settings, prefix: str = "") -> Iterator[Key]:
    """Every key of `model`, depth first, a section before its own keys."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _section_of(field.annotation)
        # A section's meaning is its field's description, else its model's docstring.
        meaning = field.description or (section[0].__doc__ or "" if section is not None else "")
        yield Key(path, _type_of(field), _default_of(field, name), " ".join(meaning.split()))
        if section is not None:
            inner, is_list = section
            yield from keys(inner, f"{path}[]." if is_list else f"{path}.")


def undescribed() -> list[str]:
    return [key.path for key in keys() if not key.meaning]


def render_reference(environment: dict[str, str]) -> str:
    variables = ", ".join(f"`{env}` (`{key}`)" for env, key in environment.items())
    lines = [_HEADER.format(environment=variables), "| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for key in keys():
        lines.append(f"| `{key.path}` | {_cell(key.type)} | {_cell(key.default)} | {_cell(key.meaning)} |")
    return "\n".join(lines) + "\n"


def json_schema() -> dict[str, Any]:
    schema = Settings.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, "$id": "https://toolauthz.dev/schemas/config.json",
            **schema, "title": "toolauthz configuration"}


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section_of(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds (once, optionally, or as a list), else None."""
    for candidate, is_list in _unwrapped(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate, is_list
    return None


def _unwrapped(annotation: Any, is_list: bool = False) -> Iterator[tuple[Any, bool]]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _unwrapped(arg, is_list)
    elif origin is tuple:
        yield from _unwrapped(typing.get_args(annotation)[0], True)
    elif origin is typing.Annotated:
        yield from _unwrapped(typing.get_args(annotation)[0], is_list)
    else:
        yield annotation, is_list


def _type_of(field: FieldInfo) -> str:
    text = _type_name(field.annotation)
    limits = [_limit(item) for item in field.metadata]
    shown = ", ".join(limit for limit in limits if limit)
    return f"{text} ({shown})" if shown else text


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " or ".join(f"`{arg}`" for arg in args)
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if origin is typing.Annotated:
        inner = _type_name(args[0])
        limits = ", ".join(limit for limit in (_limit(item) for item in args[1:]) if limit)
        return f"{inner} ({limits})" if limits else inner
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " or ".join(f"`{member.value}`" for member in annotation)
    if annotation is pathlib.Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _limit(item: Any) -> str:
    if isinstance(item, annotated_types.Ge):
        return f"at least {item.ge}"
    if isinstance(item, annotated_types.Gt):
        return f"above {item.gt}"
    if isinstance(item, annotated_types.Le):
        return f"at most {item.le}"
    if isinstance(item, annotated_types.Lt):
        return f"below {item.lt}"
    if isinstance(item, annotated_types.MinLen):
        return f"at least {item.min_length} long"
    if isinstance(item, annotated_types.MaxLen):
        return f"at most {item.max_length} long"
    pattern = getattr(item, "pattern", None)
    if isinstance(pattern, str):
        return f"matching `{pattern}`"
    return ""


def _default_of(field: FieldInfo, name: str) -> str:
    default = field.default
    if default is PydanticUndefined:
        return "required"
    if isinstance(default, BaseModel):
        return "(its keys' defaults)"
    if default is None:
        return "none"
    if isinstance(default, pathlib.Path):
        return f"`{default}`"
    if name == "mode" and isinstance(default, int):  # a file mode reads best in octal
        return f"`{default:#o}`"
    if isinstance(default, tuple):
        default = list(default)
    if default == "":
        return '`""`'
    return f"`{json.dumps(default)}`"
