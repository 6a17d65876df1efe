"""What changed in the config file since the process started: nothing of it applies on a
reload (a reload swaps the bundle only), so each changed key is a restart the operator
has to know about, said in the log and in GetStatus rather than silently ignored."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from toolauthz.server.config import Settings


def config_changes(settings: Settings) -> tuple[str, ...]:
    """Notices for the keys of the config file whose value differs from the one the
    process started with (none when it was not started from a file)."""
    path: pathlib.Path | None = settings._config_file
    if path is None:
        return ()
    started: dict[str, Any] = settings._config_values
    try:
        now = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return (f"restart needed: the config `{path}` cannot be read now; the one read at start applies",)
    if not isinstance(now, dict):
        return (f"restart needed: the config `{path}` holds no mapping now; the one read at start applies",)
    changed = sorted(str(key) for key in set(started) | set(now) if started.get(key) != now.get(key))
    if not changed:
        return ()
    shown = ", ".join(f"`{key}`" for key in changed[:8]) + (" and more" if len(changed) > 8 else "")
    return (f"restart needed: {shown} changed in `{path}`; a reload applies only the bundle",)
