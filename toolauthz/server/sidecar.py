"""A built sidecar: its components, wired once by `build_sidecar` (server/build.py),
with what it reports of itself (status, metrics) and its orderly close."""

from __future__ import annotations

import logging
import os
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolauthz.approvals import ApprovalDesk
from toolauthz.authorizer import Authorizer
from toolauthz.bundle import BundleHolder
from toolauthz.errors import StoreUnavailable
from toolauthz.server.config import Settings
from toolauthz.server.pump import DecisionPump
from toolauthz.server.reload import BundleReloader
from toolauthz.server.worker_status import StatusBoard
from toolauthz.service.access import Gate
from toolauthz.service.status import PolicyStatus, PumpStatus, SidecarStatus, WorkerStatus, aggregate
from toolauthz.service.watching import WatchLimits
from toolauthz.store import Store
from toolauthz.store.audit_writer import AuditWriter, Checkpointer
from toolauthz.store.faces import Approvals, AuditLogOf
from toolauthz.store.rules import Ledger
from toolauthz.telemetry import metrics
from toolauthz.tokens.keyring import KeyRing
from toolauthz.tokens.keys import SigningKey

if TYPE_CHECKING:  # loaded only by a sidecar with a bundle server (it brings the HTTP client)
    from toolauthz.notify import Notifier  # likewise, only with `notifications:`
    from toolauthz.server.remote_reload import RemoteBundleReloader

log = logging.getLogger("toolauthz.server")


@dataclass
class Sidecar:
    settings: Settings
    bundles: BundleHolder
    store: Store
    ledger: Ledger
    audit_log: AuditLogOf
    audit_writer: AuditWriter
    checkpointer: Checkpointer
    keyring: KeyRing
    audit_key: SigningKey
    authorizer: Authorizer
    approvals: ApprovalDesk
    approval_store: Approvals
    pump: DecisionPump
    reloader: BundleReloader | RemoteBundleReloader  # a directory, or a bundle server (`bundle_server`)
    watches: WatchLimits
    gate: Gate  # every handler's check of its caller's roles and tenants
    notifier: Notifier | None = None  # approval notifications (`notifications:`), started by the server
    closed: bool = False
    started_at: float = field(default_factory=time.time)
    worker_index: int = 0
    # With several workers: every worker's status, through the run directory.
    board: StatusBoard | None = None
    _sampler: threading.Thread | None = None
    _sampling_stop: threading.Event = field(default_factory=threading.Event)

    def worker_status(self) -> WorkerStatus:
        bundle = self.bundles.current
        notices = (*self.reloader.restart_needed, *self.reloader.settings_changed,
                   *((self.bundles.held_back,) if self.bundles.held_back else ()))
        policy = PolicyStatus(version=bundle.version, loaded_at=bundle.loaded_at, bundle_dir=self.reloader.source,
                              reloads=self.reloader.reloads, last_reload_error=self.reloader.last_error,
                              shadow_effects=self.authorizer.shadow_effects(), revision=bundle.revision,
                              digest=bundle.digest, signer=bundle.signer or "", notices=notices)
        pump = PumpStatus(answered=self.pump.answered, batches=self.pump.batches, waiting=self.pump.waiting)
        return WorkerStatus(self.worker_index, os.getpid(), policy, pump)

    def status(self) -> SidecarStatus:
        workers = self.board.read_all() if self.board is not None else [self.worker_status()]
        return aggregate(workers, answered_by=os.getpid())

    def share_status(self, directory: pathlib.Path, index: int) -> None:
        """Publish this worker's status in `directory` and answer GetStatus for every
        worker that does (toolauthz/server/worker_status.py)."""
        self.worker_index = index
        self.board = StatusBoard(directory, self.worker_status).start()
        self.pump.after_batch = self.board.changed
        self.reloader.after_attempt = self.board.changed

    def sample_metrics(self, interval: float = 5.0) -> None:
        """Keep the gauges the store knows (approvals pending) current for the scrapes,
        and say what runs (`toolauthz_build_info`)."""
        from toolauthz.server.version import build_info

        metrics.BUILD_INFO.labels(**build_info().as_dict()).set(1)

        def run() -> None:
            while True:
                try:
                    metrics.APPROVALS_PENDING.set(self.approval_store.count_pending(time.time()))
                except StoreUnavailable as exc:
                    log.warning("cannot count pending approvals: %s", exc)
                if self._sampling_stop.wait(interval):
                    return

        self._sampler = threading.Thread(target=run, name="metrics-sampler", daemon=True)
        self._sampler.start()

    def close(self) -> None:
        """Drains the audit writer, signs a final checkpoint and closes the stores; a
        second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self._sampling_stop.set()
        if self._sampler is not None:
            self._sampler.join()
        self.reloader.close()
        if self.notifier is not None:
            self.notifier.close()
        self.pump.close()
        if self.board is not None:
            self.board.close()
        self.gate.refusals.close()  # the refusals still counted, written before the writer drains
        self.audit_writer.close()
        if self.authorizer.retainer is not None:
            self.authorizer.retainer.store.close()
        self.checkpointer.close()  # signs a final checkpoint of everything written
        self.store.close()
