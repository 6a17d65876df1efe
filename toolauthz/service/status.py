"""What GetStatus reports: the values the server hands to the ToolAuthorizer handler.

The handler defines the shape and the server (toolauthz/server/sidecar.py, `Sidecar.status`)
fills it, so the service layer never reaches up into the server's wiring. With several
worker processes the server hands every worker's status (toolauthz/server/worker_status.py)
and `aggregate` sums them, so that the answer does not depend on which worker took it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The loaded bundle and how its reloads went."""

    version: str
    loaded_at: float  # seconds since the epoch
    bundle_dir: str
    reloads: int
    last_reload_error: str  # empty when the last reload succeeded
    shadow_effects: Mapping[str, int]  # @shadow policy id -> calls it would have changed
    revision: int | None = None  # the signed revision (None: not signed)
    digest: str = ""  # SHA-256 of the bundle's snapshot
    signer: str = ""  # the key id of its signature
    # What needs the operator: a reload that changed what only a restart applies, a
    # bundle held back below the fleet's revision floor (one line each).
    notices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PumpStatus:
    """A decision pump (one per process), or the sum of all workers' pumps."""

    answered: int
    batches: int
    waiting: int


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One serving process."""

    index: int
    pid: int
    policy: PolicyStatus
    pump: PumpStatus


@dataclass(frozen=True, slots=True)
class SidecarStatus:
    """`policy` and `pump` sum up `workers` (see `aggregate`); `answered_by` is the pid
    of the worker that answered, for diagnosis only."""

    policy: PolicyStatus
    pump: PumpStatus
    workers: tuple[WorkerStatus, ...] = ()
    answered_by: int = 0


def aggregate(workers: Sequence[WorkerStatus], answered_by: int) -> SidecarStatus:
    """The whole sidecar: the most recently loaded bundle (a reload reaches the workers
    one after the other), the most reloads any worker made, the first reload error any
    worker holds, and the sums of the counters."""
    if not workers:
        raise ValueError("a sidecar has at least one worker")
    ordered = tuple(sorted(workers, key=lambda w: w.index))
    newest = max(ordered, key=lambda w: w.policy.loaded_at).policy
    shadow: Counter[str] = Counter()
    for worker in ordered:
        shadow.update(worker.policy.shadow_effects)
    error = next((w.policy.last_reload_error for w in ordered if w.policy.last_reload_error), "")
    notices = tuple(dict.fromkeys(n for w in ordered for n in w.policy.notices))  # each once, in worker order
    policy = PolicyStatus(version=newest.version, loaded_at=newest.loaded_at, bundle_dir=newest.bundle_dir,
                          reloads=max(w.policy.reloads for w in ordered), last_reload_error=error,
                          shadow_effects=dict(shadow), revision=newest.revision, digest=newest.digest,
                          signer=newest.signer, notices=notices)
    pump = PumpStatus(answered=sum(w.pump.answered for w in ordered), batches=sum(w.pump.batches for w in ordered),
                      waiting=sum(w.pump.waiting for w in ordered))
    return SidecarStatus(policy, pump, ordered, answered_by)
