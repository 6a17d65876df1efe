"""Activating a bundle under the fleet's revision floor, with its `bundle` audit record.

A signed bundle activates only at or above the floor the store keeps (store/bundle_floor.py),
at start-up as on every reload, and its activation lifts the floor in one statement that
answers the floor as it then stands: a replica activating below a revision another one
just activated learns it there and refuses. A revision names one signed bundle, so another
digest under the floor's revision is refused too. Store errors refuse (fail closed): the
caller keeps serving what it serves, or does not start.

Every activation and refusal is a `bundle` audit record in the tenant `_system`
(audit/records.py SYSTEM_TENANT), with the revision, digest and signer.
"""

from __future__ import annotations

import logging

from toolauthz.audit.records import SYSTEM_TENANT, AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.clock import Clock
from toolauthz.errors import BundleError, Problem, StoreUnavailable
from toolauthz.store.rules import BundleFloor

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
