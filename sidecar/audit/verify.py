"""Check an audit log against its hash chain and its signed checkpoints.

One pass over the records with constant state, so a log of millions of records can be
streamed from the store. Only anomalies are remembered (gaps, records that fail their
hash), and verification stops after `max_findings` of them: a log broken everywhere needs
no million findings to be rejected.

What each tampering looks like:
  edited      a record's hash does not match its body, or the next record was chained
              to a different hash (the record was edited and re-hashed on its own)
  deleted     a gap in seq
  reordered   records out of seq order, or a record that fails its hash at its seq but
              verifies at another seq of the log (two records swapped their seq)
  truncated   fewer records than the newest valid checkpoint covers
  checkpoint_mismatch   the chain is internally consistent but the hash at a checkpoint's
              count is not the signed one: everything after an edit was re-hashed
  bad_checkpoint_signature   a stored checkpoint does not verify with the audit key
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sidecar.audit.checkpoint import Checkpoint, CheckpointError, verify_checkpoint
from sidecar.audit.records import GENESIS_HASH, AuditRecord, canonical_body, record_hash

_MAX_SUSPECTS = 256  # records kept to test whether they were moved rather than edited
_MAX_GAP_CANDIDATES = 256  # missing seqs tried as the original place of a moved record


@dataclass(frozen=True)
class Finding:
    seq: int
    kind: str
    message: str
    last_seq: int = 0  # end of a range of records (deleted, truncated); else == seq

    def __post_init__(self) -> None:
        if not self.last_seq:
            object.__setattr__(self, "last_seq", self.seq)


def verify_chain(
    records: Iterable[AuditRecord],
    checkpoints: list[Checkpoint],
    public_keys: Any,
    *,
    max_findings: int = 1000,
) -> list[Finding]:
    """Findings ordered by seq; an empty list means the log is intact. `records` must be
    in seq order as stored; `public_keys` is the audit public key, or a list of them."""
    verifier = _Verifier(checkpoints, public_keys, max_findings)
    for record in records:
        if not verifier.feed(record):
            break
    return verifier.finish()


def _content_ok(record: AuditRecord, seq: int | None = None) -> bool:
    try:
        body = canonical_body(record.seq if seq is None else seq, record.event)
        return record_hash(record.prev_hash, body) == record.hash
    except (ValueError, TypeError, AttributeError, UnicodeError):
        return False  # a tampered row may not even canonicalize


class _Verifier:
    def __init__(self, checkpoints: list[Checkpoint], public_keys: Any, max_findings: int):
        self.findings: list[Finding] = []
        self.max_findings = max_findings
        self.stopped = False
        self.prev_seq, self.prev_hash, self.prev_flagged = 0, GENESIS_HASH, False
        self.gaps: list[list[int]] = []
        self.suspects: list[AuditRecord] = []
        self.trusted_upto = 0  # highest seq whose hash matched a checkpoint
        self.checkpoints: list[Checkpoint] = []
        for cp in checkpoints:
            try:
                # Only the signed token is trusted, never the columns stored beside it.
                self.checkpoints.append(verify_checkpoint(cp.token, public_keys))
            except CheckpointError:
                # The row's kid is not echoed: nothing in an unverified row is trusted.
                self._add(cp.count, "bad_checkpoint_signature",
                          f"the checkpoint stored for {cp.count} records does not verify "
                          "with the audit key")
        self.checkpoints.sort(key=lambda cp: cp.count)
        self.next_cp = 0

    def _add(self, seq: int, kind: str, message: str, last_seq: int = 0) -> None:
        self.findings.append(Finding(seq, kind, message, last_seq))

    def feed(self, r: AuditRecord) -> bool:
        if r.seq <= self.prev_seq:
            self._out_of_order(r)
        else:
            self._in_order(r)
        anomalies = len(self.findings) + len(self.gaps) + len(self.suspects)
        self.stopped = anomalies >= self.max_findings
        return not self.stopped

    def _in_order(self, r: AuditRecord) -> None:
        if r.seq > self.prev_seq + 1:
            self.gaps.append([self.prev_seq + 1, r.seq - 1])
            link_ok = True  # the broken link is explained by the gap
        else:
            link_ok = r.prev_hash == self.prev_hash
        flagged = not _content_ok(r)
        if flagged and link_ok:
            self._add(r.seq, "edited", f"record {r.seq} does not match its hash")
        elif flagged:
            self._suspect(r)  # wrong link and wrong hash: moved here, or both edited
        elif not link_ok and not self.prev_flagged:
            self._add(self.prev_seq, "edited",
                      f"record {self.prev_seq} is not the record that record {r.seq} "
                      "was chained to (edited and re-hashed)")
        self._check_checkpoints(r)
        self.prev_seq, self.prev_hash, self.prev_flagged = r.seq, r.hash, flagged

    def _out_of_order(self, r: AuditRecord) -> None:
        for gap in self.gaps:
            if gap[0] <= r.seq <= gap[1]:  # not missing after all, only misplaced
                self.gaps.remove(gap)
                self.gaps += [g for g in ([gap[0], r.seq - 1], [r.seq + 1, gap[1]])
                              if g[0] <= g[1]]
                break
        self._add(r.seq, "reordered",
                  f"record {r.seq} comes after record {self.prev_seq}")
        if not _content_ok(r):
            self._add(r.seq, "edited", f"record {r.seq} does not match its hash")

    def _suspect(self, r: AuditRecord) -> None:
        if len(self.suspects) < _MAX_SUSPECTS:
            self.suspects.append(r)
        else:
            self._add(r.seq, "edited", f"record {r.seq} does not match its hash or link")

    def _check_checkpoints(self, r: AuditRecord) -> None:
        while self.next_cp < len(self.checkpoints) and \
                self.checkpoints[self.next_cp].count <= r.seq:
            cp = self.checkpoints[self.next_cp]
            self.next_cp += 1
            if cp.count < r.seq:
                continue  # its record is missing: the gap is reported instead
            if r.hash == cp.head_hash:
                self.trusted_upto = r.seq
            else:
                self._add(r.seq, "checkpoint_mismatch",
                          f"record {r.seq} differs from the checkpoint signed at "
                          f"{cp.time:.3f} by `{cp.kid}`: a record in "
                          f"{self.trusted_upto + 1}..{r.seq} was rewritten")

    def finish(self) -> list[Finding]:
        newest = self.checkpoints[-1] if self.checkpoints else None
        if newest and newest.count > self.prev_seq and not self.stopped:
            self._add(self.prev_seq + 1, "truncated",
                      f"the log ends at record {self.prev_seq} but the checkpoint signed "
                      f"at {newest.time:.3f} covers {newest.count}", newest.count)
        for lo, hi in self.gaps:
            what = f"record {lo} is" if lo == hi else f"records {lo}..{hi} are"
            self._add(lo, "deleted", f"{what} missing", hi)
        self._resolve_suspects()
        return sorted(self.findings, key=lambda f: (f.seq, f.kind))

    def _resolve_suspects(self) -> None:
        # A record moved to another seq still verifies at its original seq, which is
        # either another suspect's seq (a swap) or a missing one (moved elsewhere).
        candidates = {s.seq for s in self.suspects}
        for lo, hi in self.gaps:
            if len(candidates) + hi - lo < _MAX_GAP_CANDIDATES + len(self.suspects):
                candidates.update(range(lo, hi + 1))
        for s in self.suspects:
            origin = next((c for c in sorted(candidates)
                           if c != s.seq and _content_ok(s, c)), None)
            if origin is not None:
                self._add(s.seq, "reordered",
                          f"record {s.seq} was written as record {origin}")
            else:
                self._add(s.seq, "edited",
                          f"record {s.seq} does not match its hash or its link")
