"""A sidecar for the framework examples: the example bundle `policies/`, a temporary data
directory, 127.0.0.1 on a random port; its address while the `with` block runs."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import tempfile
from collections.abc import Iterator

from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings

BUNDLE = pathlib.Path(__file__).resolve().parents[1] / "policies"
# Orders the example's runtime vouches for (its own store): alice's ord_1, refundable 100.00.
ORDER = {"uid": {"type": "Order", "id": "ord_1"}, "parents": [],
         "attrs": {"owner": {"__entity": {"type": "User", "id": "alice"}}, "refundable_cents": 10_000}}


@contextlib.contextmanager
def local_sidecar() -> Iterator[str]:
    logger = logging.getLogger("toolauthz")
    before = logger.level
    logger.setLevel(logging.ERROR)  # "generated a development key" is expected here
    with tempfile.TemporaryDirectory(prefix="toolauthz-example-") as tmp:
        settings = Settings(bundle=BUNDLE, data_dir=pathlib.Path(tmp) / "data", listen="127.0.0.1:0",
                            audit={"checkpoint_interval_seconds": 3600})
        sidecar = build_sidecar(settings)
        server, port = create_server(sidecar, "127.0.0.1:0")
        try:
            yield f"127.0.0.1:{port}"
        finally:
            server.stop(None)
            sidecar.close()
            logger.setLevel(before)
