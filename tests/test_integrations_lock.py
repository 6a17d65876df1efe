"""requirements-integrations-b.lock: exactly what the adapters' frameworks add on top of the
runtime and test locks, each pinned once, and installed as pinned (scripts/setup.sh --dev)."""

from __future__ import annotations

import tomllib
from importlib import metadata

from conftest import ROOT
from packaging.requirements import Requirement
from test_locks import _closure, _norm, _pins

EXTRAS = ("pydantic-ai", "claude-agent")


def test_the_integrations_lock_is_the_frameworks_on_top_of_the_dev_lock():
    lock = ROOT / "requirements-integrations-b.lock"
    assert "-r requirements-dev.lock" in lock.read_text().splitlines()
    pins, dev, runtime = _pins(lock), _pins(ROOT / "requirements-dev.lock"), _pins(ROOT / "requirements.lock")
    assert not set(pins) & (set(dev) | set(runtime))
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    roots = [requirement for extra in EXTRAS for requirement in extras[extra]]
    assert _closure(roots) - set(runtime) - set(dev) == set(pins)
    for name, version in pins.items():
        assert metadata.version(name) == version, f"{name}: installed {metadata.version(name)}, locked {version}"
    assert {_norm(Requirement(r).name) for r in roots} <= set(pins)
