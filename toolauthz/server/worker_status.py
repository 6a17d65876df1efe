"""Every worker's status, for a GetStatus that any worker can answer for all of them.

The workers of `serve --workers N` share a per-run directory (made and removed by the
parent, toolauthz/server/observability.py). Each worker publishes its status there as
`worker-<index>.json`, replaced atomically (write, then rename): after each batch of
decisions and each reload attempt, by a thread of its own so that the decision pump
never waits for the file. GetStatus publishes the answering worker's status at once
and reads every file, so its counters lag no more than one publication behind the other
workers' own. A file is rewritten when it changed, at most once per `min_interval`: a
publication costs about 0.5 ms of CPU (the write and the rename), as much as a decision's
whole hand-off, and at one call in flight every decision is a batch of one.

The files hold counters and versions, never a call's values; a file that does not
parse, or names a process that is gone, is left out rather than trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import threading
from collections.abc import Callable

from toolauthz.service.status import PolicyStatus, PumpStatus, WorkerStatus

log = logging.getLogger("toolauthz.status")

_MAX_FILE_BYTES = 1 << 20


class StatusBoard:
    """`snapshot()` is this worker's status now; `changed()` asks for a publication."""

    def __init__(self, directory: pathlib.Path, snapshot: Callable[[], WorkerStatus], *,
                 min_interval: float = 0.25):
        self._directory = directory
        self._min_interval = min_interval
        self._snapshot = snapshot
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-board", daemon=True)

    def start(self) -> StatusBoard:
        self.publish()
        self._thread.start()
        return self

    def changed(self) -> None:
        self._wake.set()

    def publish(self) -> WorkerStatus:
        status = self._snapshot()
        body = json.dumps(_to_json(status), sort_keys=True).encode()
        path = self._directory / f"worker-{status.index}.json"
        with self._write_lock:
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_bytes(body)
            os.replace(temporary, path)
        return status

    def read_all(self) -> list[WorkerStatus]:
        """This worker's status now and every other live worker's last publication."""
        own = self.publish()
        found = {own.index: own}
        for path in sorted(self._directory.glob("worker-*.json")):
            status = _read(path)
            if status is not None and status.index not in found and _alive(status.pid):
                found[status.index] = status
        return [found[index] for index in sorted(found)]

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.publish()
            except OSError as exc:  # the directory went away: GetStatus still answers for this worker
                log.warning("cannot publish this worker's status: %s", exc)
            if self._stop.wait(self._min_interval):  # changes meanwhile wake the next publication
                return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _to_json(status: WorkerStatus) -> dict[str, object]:
    policy, pump = status.policy, status.pump
    return {"index": status.index, "pid": status.pid, "version": policy.version, "loaded_at": policy.loaded_at,
            "bundle_dir": policy.bundle_dir, "reloads": policy.reloads, "last_reload_error": policy.last_reload_error,
            "shadow_effects": dict(policy.shadow_effects), "answered": pump.answered, "batches": pump.batches,
            "waiting": pump.waiting, "revision": policy.revision, "digest": policy.digest, "signer": policy.signer,
            "notices": list(policy.notices)}


def _read(path: pathlib.Path) -> WorkerStatus | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if path.stat().st_size > _MAX_FILE_BYTES:
            return None
        data = json.loads(path.read_bytes())
        policy = PolicyStatus(version=str(data["version"]), loaded_at=float(data["loaded_at"]),
                              bundle_dir=str(data["bundle_dir"]), reloads=int(data["reloads"]),
                              last_reload_error=str(data["last_reload_error"]),
                              shadow_effects={str(k): int(v) for k, v in dict(data["shadow_effects"]).items()},
                              revision=None if data.get("revision") is None else int(data["revision"]),
                              digest=str(data.get("digest", "")), signer=str(data.get("signer", "")),
                              notices=tuple(str(n) for n in data.get("notices", ())))
        pump = PumpStatus(answered=int(data["answered"]), batches=int(data["batches"]), waiting=int(data["waiting"]))
        return WorkerStatus(index=int(data["index"]), pid=int(data["pid"]), policy=policy, pump=pump)
    return None
