"""The committed generated code must be exactly what scripts/gen_protos.py produces."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(root: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def test_generated_protobuf_code_is_fresh(tmp_path):
    _generator().generate(tmp_path)
    committed = _files(ROOT / "toolauthz" / "proto")
    fresh = _files(tmp_path)
    assert sorted(committed) == sorted(fresh), "run: .venv/bin/python scripts/gen_protos.py"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated files {stale}; run: .venv/bin/python scripts/gen_protos.py"
