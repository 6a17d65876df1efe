"""What is running: the package version, the commit it was built from, and the versions
of what decides (Cedar, through cedarpy) and of the wire (the proto package).

`toolauthz.__version__` is the one place the version is written. The commit comes from
the installed package's metadata when an installer recorded one (PEP 610
`direct_url.json`, a `pip install git+...`), else from git when the package runs from a
checkout, else it is `unknown`; it is never guessed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import pathlib
import platform
import re
import subprocess
from dataclasses import asdict, dataclass

import toolauthz

UNKNOWN = "unknown"
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class BuildInfo:
    version: str
    commit: str
    python: str
    cedar: str
    proto: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def lines(self) -> list[str]:
        return [f"{name}: {value}" for name, value in self.as_dict().items()]


@functools.cache
def build_info() -> BuildInfo:
    return BuildInfo(version=toolauthz.__version__, commit=_commit(), python=platform.python_version(),
                     cedar=_distribution_version("cedarpy"), proto=_proto_package())


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def _proto_package() -> str:
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2

    return str(authorizer_pb2.DESCRIPTOR.package)


def _commit() -> str:
    return _commit_from_metadata() or _commit_from_checkout() or UNKNOWN


def _commit_from_metadata() -> str:
    try:
        text = importlib.metadata.distribution("toolauthz").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return ""
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id", "")
    except (ValueError, AttributeError):
        return ""
    return commit[:12] if isinstance(commit, str) and _COMMIT.match(commit) else ""


def _commit_from_checkout() -> str:
    """HEAD of the checkout the package was imported from (an editable install); "" outside
    a checkout or without git. Only `rev-parse`: `git status` would run whatever filters
    and monitors the checkout's own config names, and this runs inside the sidecar."""
    root = pathlib.Path(toolauthz.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return ""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head[:12] if _COMMIT.match(head) else ""
