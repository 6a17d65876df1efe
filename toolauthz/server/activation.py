"""Activating a bundle under the fleet's revision floor, with its `bundle` audit record.

A signed bundle activates only at or above the floor the store keeps (store/bundle_floor.py),
at start-up as on every reload, and its activation lifts the floor in one statement that
answers the floor as it then stands: a replica activating below a revision another one
just activated learns it there and refuses. A revision names one signed bundle, so another
digest under the floor's revision is refused too. Store errors refuse (fail closed): the
caller keeps serving what it serves, or does not start.

Every activation and refusal is a `bundle` audit record in the tenant `_system`
(audit/records.py SYSTEM_TENANT), with the revision, digest and signer: at start-up one
record (build.py), on each reload one, whether the bundle comes from a directory or a
bundle server (`Activations`, shared by both reloaders).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.audit.records import SYSTEM_TENANT, AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.clock import Clock, SystemClock
from toolauthz.errors import BundleError, Problem, StoreUnavailable
from toolauthz.store.faces import BundleFloor
from toolauthz.telemetry import metrics

log = logging.getLogger("toolauthz.reload")

BUNDLE_LOADED, BUNDLE_REFUSED = "loaded", "refused"  # results of `bundle` audit records
ROLLBACK_ALLOWED = "rollback_allowed"


def floor_revision(floor: BundleFloor | None, serving: Bundle | None) -> int | None:
    """The lowest revision that may activate now: the store's floor, else (no store
    floor yet) the serving bundle's revision. A store that cannot be read refuses."""
    if floor is not None:
        try:
            stored = floor.current()
        except StoreUnavailable as exc:
            raise BundleError([Problem(SIGNATURE_FILE, f"refused: the revision floor cannot be read: {exc}")]) \
                from None
        if stored is not None:
            return stored.revision
    return serving.revision if serving is not None else None


def hold_to_floor(bundle: Bundle, floor: BundleFloor | None, now: float) -> None:
    """Lifts the floor to the bundle's revision, or BundleError when the floor is above it
    (another process activated a newer one meanwhile) or names another bundle of the same
    revision. Unsigned bundles (no revision) have no floor."""
    if floor is None or bundle.revision is None:
        return
    try:
        stood = floor.lift(bundle.revision, bundle.digest, now)
    except StoreUnavailable as exc:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: the revision floor cannot be written: {exc}")]) \
            from None
    if stood.revision > bundle.revision:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: the bundle's revision {bundle.revision} is below the "
                                                   f"floor, {stood.revision}: a rollback is refused "
                                                   "(toolauthz bundle allow-rollback)")])
    if stood.digest not in ("", bundle.digest):
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: revision {bundle.revision} was activated with other "
                                                   "content; sign a new revision")])


def record_bundle(audit: AuditSink | None, clock: Clock, result: str, bundle: Bundle, codes: tuple[str, ...],
                  detail: dict[str, object]) -> None:
    """A `bundle` audit record: `bundle` is the one loaded, or the one that keeps serving
    after a refusal. A record that cannot be written is logged: the activation stands."""
    if audit is None:
        return
    described: dict[str, object] = {"revision": bundle.revision, "digest": bundle.digest, "signer": bundle.signer,
                                    "source": str(bundle.directory)}
    try:
        audit.write(AuditEvent(kind="bundle", time=clock.now(), tenant=SYSTEM_TENANT, result=result,
                               policy_version=bundle.version, error_codes=codes, detail={**described, **detail}))
    except StoreUnavailable as exc:
        log.error("the audit record of a bundle activation (%s) could not be written: %s", result, exc)


class Activations:
    """What the two reloaders share (reload.py reads a directory, remote_reload.py polls a
    bundle server), so that both hold a candidate to the same floor and keep the same
    records: the candidate's admission, the swap and its record, a refusal and its record,
    holding the serving bundle back below the fleet's floor, the notices of what only a
    restart applies, and the count of attempts that tests and tools wait on."""

    def __init__(self, holder: BundleHolder, *, keys: Mapping[str, Ed25519PublicKey] | None,
                 floor: BundleFloor | None, audit: AuditSink | None, clock: Clock | None, retaining: bool,
                 settings_changes: Callable[[], tuple[str, ...]] | None):
        self._holder = holder
        self._keys = keys
        self._floor = floor
        self._audit = audit
        self._clock = clock or SystemClock()
        self._retaining = retaining
        self._settings_changes = settings_changes
        # What a swapped bundle asks for that only a restart applies (shown in status).
        self.restart_needed: tuple[str, ...] = ()
        self.settings_changed: tuple[str, ...] = ()  # config keys changed since the start
        self.last_error = ""
        self.reloads = 0
        self.attempts = 0
        self._attempted = threading.Condition()
        self.after_swap: Callable[[], None] | None = None  # serving processes: heap.py
        self.after_attempt: Callable[[], None] | None = None  # the worker's status board
        self._lock = threading.Lock()  # one reload at a time (the watcher or poller, and SIGHUP)

    @property
    def source(self) -> str:
        """Where bundles come from, as status shows it."""
        return str(self._holder.current.directory)

    def wait_for_attempt(self, after: int, timeout: float) -> bool:
        """Block until more than `after` reload attempts have finished (for tests and
        tools that must see the outcome of a change without sleeping)."""
        with self._attempted:
            return self._attempted.wait_for(lambda: self.attempts > after, timeout)

    def _attempt_done(self) -> None:
        self.check_floor()
        self._note_settings_changes()
        if self.after_attempt is not None:
            self.after_attempt()
        with self._attempted:
            self.attempts += 1
            self._attempted.notify_all()

    def _admit(self, load: Callable[[int | None], Bundle], serving: Bundle) -> Bundle:
        """The bundle `load` gives when held to the lowest revision that may activate now;
        a new one lifts the floor. A signed one must not be older than the floor, and other
        content under the serving revision is refused too: a revision names one signed
        bundle, so only a newer signature may change what is enforced."""
        signed = self._keys is not None
        bundle = load(floor_revision(self._floor, serving) if signed else None)
        if bundle.version == serving.version:
            return bundle  # nothing new: the floor stays as it is
        if signed and bundle.revision == serving.revision:
            raise BundleError([Problem(SIGNATURE_FILE, f"refused: revision {bundle.revision} is the serving one's, "
                                                       "but the content differs; sign a new revision")])
        if signed:
            hold_to_floor(bundle, self._floor, self._clock.now())
        return bundle

    def _swap(self, bundle: Bundle, serving: Bundle, detail: dict[str, object]) -> None:
        self._holder.swap(bundle)
        record_bundle(self._audit, self._clock, BUNDLE_LOADED, bundle, (),
                      {"previous_version": serving.version, "previous_revision": serving.revision, **detail})
        metrics.RELOADS.inc()
        metrics.serving_version(bundle.version, serving.version)
        self._note_restart_needed(bundle)
        if self.after_swap is not None:
            self.after_swap()
        self.reloads += 1

    def _refuse(self, exc: BundleError, serving: Bundle, what: str, detail: dict[str, object]) -> None:
        """Counted, recorded with the version that keeps serving, and logged in one line
        (each problem an item of `problems`: never newlines in a message)."""
        metrics.RELOAD_ERRORS.inc()
        signature = any(p.file == SIGNATURE_FILE for p in exc.problems)
        if signature:
            metrics.BUNDLE_SIGNATURE_REFUSALS.inc()
        record_bundle(self._audit, self._clock, BUNDLE_REFUSED, serving,
                      ("bundle_signature" if signature else "bundle_invalid",), {"reason": str(exc)[:2000], **detail})
        log.error("%s refused; version %s keeps serving", what, serving.version,
                  extra={"problems": [str(p) for p in exc.problems]})

    def _note_restart_needed(self, bundle: Bundle) -> None:
        """A process that started with no tool retaining its inputs has no retainer (and
        maybe no retention key): a reloaded tool with `audit.retain_input` retains
        nothing until a restart. Said in the log and in status, never silently."""
        notices: list[str] = []
        if not self._retaining:
            asking = sorted(name for name, s in bundle.tools.items() if s.tool.retain_input_seconds)
            if asking:
                shown = ", ".join(f"`{name}`" for name in asking[:5]) + (" and more" if len(asking) > 5 else "")
                notices.append(f"restart needed: {shown} set audit.retain_input, which applies only after a "
                               "restart (inputs are not retained until then)")
        new = [notice for notice in notices if notice not in self.restart_needed]
        self.restart_needed = tuple(notices)  # in status before the log says so
        for notice in new:
            log.warning("%s", notice)

    def _note_settings_changes(self) -> None:
        if self._settings_changes is None:
            return
        notices = self._settings_changes()
        new = [notice for notice in notices if notice not in self.settings_changed]
        self.settings_changed = notices  # in status before the log says so
        for notice in new:
            log.warning("%s", notice)

    def check_floor(self) -> None:
        """Holds the serving bundle back (it decides nothing) while the fleet's floor is
        above its revision: another process activated a newer one, and this one has none
        to load. A store that cannot be read changes nothing: decisions need it anyway."""
        with self._lock:  # never between a reload's read of the floor and its swap
            self._check_floor()

    def _check_floor(self) -> None:
        serving = self._holder.current
        if self._floor is None or self._keys is None or serving.revision is None:
            return
        try:
            stored = self._floor.current()
        except StoreUnavailable:
            return
        if stored is not None and stored.revision > serving.revision:
            newly = not self._holder.held_back
            self._holder.hold_back(f"revision {serving.revision} is below the fleet's floor, {stored.revision}: "
                                   "no decision until a bundle at the floor loads")
            if newly:  # in status before the log says so
                log.error("the serving bundle's revision %s is below the fleet's floor %s: no decisions until a "
                          "bundle at the floor loads", serving.revision, stored.revision)
        else:
            self._holder.release()
