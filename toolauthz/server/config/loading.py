"""Reading the settings: one YAML file, then TOOLAUTHZ_* environment variables, then
the command line's options, validated together.

A refusal names each mistake once: the key (with a did-you-mean for an unknown one that
is close to a known key) and what is wrong with it. Pydantic adds echoes of one mistake
(a list whose only entry was refused is also too short; a misspelled required key is also
missing); those are left out.
"""

from __future__ import annotations

import os
import pathlib
import typing
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from toolauthz.bundle.suggest import closest, did_you_mean
from toolauthz.display.escape import shown
from toolauthz.errors import ToolAuthzError
from toolauthz.server.config.settings import Settings

ENVIRONMENT = {"TOOLAUTHZ_LOG_LEVEL": "log_level",
               "TOOLAUTHZ_BUNDLE": "bundle", "TOOLAUTHZ_LISTEN": "listen", "TOOLAUTHZ_DATA_DIR": "data_dir",
               "TOOLAUTHZ_HTTP_LISTEN": "http_listen", "TOOLAUTHZ_CONSOLE_LISTEN": "console_listen",
               "TOOLAUTHZ_STORE": "store"}


def read_config_file(config_file: str | os.PathLike) -> dict[str, Any]:
    """The file's mapping, or ToolAuthzError (unreadable, not YAML, not a mapping)."""
    try:
        loaded = yaml.safe_load(pathlib.Path(config_file).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ToolAuthzError(f"cannot read config `{shown(str(config_file))}`: {shown(str(exc), 400)}") from None
    if not isinstance(loaded, dict):
        raise ToolAuthzError(f"config `{shown(str(config_file))}` must hold a mapping")
    return loaded


def load_settings(config_file: str | os.PathLike | None = None, **overrides: Any) -> Settings:
    data: dict[str, Any] = {}
    loaded: dict[str, Any] = {}
    if config_file is not None:
        loaded = read_config_file(config_file)
        data = {"generate_missing_keys": False, **loaded}
    for env, key in ENVIRONMENT.items():
        if os.environ.get(env):
            data[key] = os.environ[env]
    data.update({k: v for k, v in overrides.items() if v is not None})
    settings = validated(data)
    if config_file is not None:
        # What the file held: a reload compares the file with it (config_changes.py).
        settings._config_file, settings._config_values = pathlib.Path(config_file), loaded
    return settings


def validated(data: dict[str, Any]) -> Settings:
    """`data` as Settings, or one ToolAuthzError naming every mistake once."""
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ToolAuthzError(f"invalid config: {'; '.join(problems(exc.errors()))}") from None


def problems_of(data: dict[str, Any]) -> list[str]:
    """Every mistake in `data`, once each; [] when it is a valid configuration."""
    try:
        Settings.model_validate(data)
    except ValidationError as exc:
        return problems(exc.errors())
    return []


def problems(errors: Iterable[ErrorDetails]) -> list[str]:
    return [_problem(error) for error in _without_echoes(list(errors))]


def _suggestion(loc: tuple[Any, ...]) -> str:
    """The known key an unknown key at `loc` most likely meant, or ""."""
    return closest(str(loc[-1]), known_keys(loc[:-1]))


def _without_echoes(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """A list whose entry was refused is then too short as well (`sinks` needs one entry,
    and the one given was dropped): that second error only echoes the first."""
    def inside(outer: tuple[Any, ...], inner: tuple[Any, ...]) -> bool:
        return len(inner) > len(outer) and inner[:len(outer)] == outer

    keys = [tuple(error["loc"]) for error in errors]
    # A misspelled required key is missing as well: the unknown key's did-you-mean says it.
    meant = {(*key[:-1], _suggestion(key)) for error, key in zip(errors, keys, strict=True)
             if error["type"] == "extra_forbidden"}
    return [error for error, key in zip(errors, keys, strict=True)
            if not (error["type"] == "too_short" and any(inside(key, other) for other in keys))
            and not (error["type"] == "missing" and key in meant)]


def _problem(error: ErrorDetails) -> str:
    loc = error["loc"]
    if not loc:
        return error["msg"].removeprefix("Value error, ")
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    if error["type"] == "extra_forbidden":
        return f"`{shown(where)}`: unknown key{did_you_mean(str(loc[-1]), known_keys(loc[:-1]))}"
    return f"`{shown(where)}`: {error['msg'].removeprefix('Value error, ').lower()}"


def known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the section at `loc` may hold ([] when `loc` names no section)."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
