"""Regenerates toolauthz/proto/ from proto/. Run: .venv/bin/python scripts/gen_protos.py

The generated code is committed; tests/test_proto_fresh.py fails when it is stale.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "toolauthz" / "proto"


def generate(out_dir: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # protoc writes absolute-package imports (`from toolauthz.v1 import ...`); the
    # code lives under toolauthz.proto, so make them relative to that package.
    for path in out_dir.rglob("*.py"):
        text = path.read_text()
        fixed = text.replace("from toolauthz.v1 import", "from toolauthz.proto.toolauthz.v1 import")
        path.write_text(fixed)
    for pkg in [out_dir, out_dir / "toolauthz", out_dir / "toolauthz" / "v1"]:
        (pkg / "__init__.py").touch()


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR)
