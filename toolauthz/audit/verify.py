"""Check an audit log against its hash chains, its stored heads and its signed checkpoints.

One pass over the records with constant state per chain, so a log of millions of records
can be streamed from the store, in `seq` order or chain by chain (what `iter_chains`
reads: safe while other writers append). Only anomalies are remembered (gaps, records
that fail their hash), and verification stops after `max_findings` of them: a log broken
everywhere needs no million findings to be rejected. A finding names its chain and the
record's place in that chain (`chain_seq`).

What each tampering looks like:
  edited      a record's hash does not match its body, or the next record was chained
              to a different hash (the record was edited and re-hashed on its own)
  deleted     a gap in a chain's seq
  reordered   records out of order, or a record that fails its hash at its place but
              verifies at another place of its chain (two records swapped their seq)
  truncated   a chain holds fewer records than the newest valid checkpoint, or its
              stored head, says it had
  dropped     a chain a valid checkpoint pins has no record left
  checkpoint_mismatch   the chain is internally consistent but the hash at a checkpoint's
              place is not the signed one: everything after an edit was re-hashed
  head_mismatch   the record at a chain's stored head is not the one the head names
  bad_checkpoint_signature   a stored checkpoint does not verify with the audit key, or
              the chain heads stored with it are not those it signs
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from toolauthz.audit.checkpoint import Checkpoint, CheckpointError, verify_checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import GENESIS_HASH, LEGACY_CHAIN, AuditRecord, canonical_body, record_hash

_MAX_SUSPECTS = 256  # records kept to test whether they were moved rather than edited
_MAX_GAP_CANDIDATES = 256  # missing seqs tried as the original place of a moved record


@dataclass(frozen=True)
class Finding:
    seq: int  # the record's place in its chain (`chain_seq`)
    kind: str
    message: str
    last_seq: int = 0  # end of a range of records (deleted, truncated); else == seq
    chain: str = LEGACY_CHAIN

    def __post_init__(self) -> None:
        if not self.last_seq:
            object.__setattr__(self, "last_seq", self.seq)

    @property
    def where(self) -> str:
        """`seq 4`, `seq 4-9`, with the chain's name unless it is the legacy chain."""
        at = f"seq {self.seq}" if self.last_seq == self.seq else f"seq {self.seq}-{self.last_seq}"
        return at if self.chain == LEGACY_CHAIN else f"chain {self.chain} {at}"


@dataclass(frozen=True)
class _Pin:
    """A hash a chain must have at `seq`: signed by a checkpoint, or its stored head."""

    seq: int
    hash: str
    checkpoint: Checkpoint | None  # None: the stored head


def verify_chain(
    records: Iterable[AuditRecord],
    checkpoints: list[Checkpoint],
    public_keys: Any,
    *,
    heads: Sequence[ChainHead] = (),
    max_findings: int = 1000,
) -> list[Finding]:
    """Findings ordered by chain and seq; an empty list means the log is intact.
    `records`: each chain's records in order (chains may interleave, as in seq order);
    `heads`: the heads the store keeps, read before the records; `public_keys`: the
    audit public key, or a list of them."""
    verifier = _Verifier(checkpoints, heads, public_keys, max_findings)
    for record in records:
        if not verifier.feed(record):
            break
    return verifier.finish()


def _content_ok(record: AuditRecord, seq: int | None = None) -> bool:
    try:
        body = canonical_body(record.chain_seq if seq is None else seq, record.event, record.chain)
        return record_hash(record.prev_hash, body) == record.hash
    except (ValueError, TypeError, AttributeError, UnicodeError):
        return False  # a tampered row may not even canonicalize


class _Verifier:
    def __init__(self, checkpoints: list[Checkpoint], heads: Sequence[ChainHead], public_keys: Any,
                 max_findings: int):
        self.findings: list[Finding] = []
        self.max_findings = max_findings
        self.stopped = False
        self.chains: dict[str, _ChainVerifier] = {}
        self.pins: dict[str, list[_Pin]] = {}
        for cp in checkpoints:
            try:
                # Only the signed token is trusted, never the columns stored beside it.
                verified = verify_checkpoint(cp.token, public_keys, cp.heads)
            except CheckpointError:
                # The row's kid is not echoed: nothing in an unverified row is trusted.
                self.findings.append(Finding(cp.count, "bad_checkpoint_signature",
                                             f"the checkpoint stored for {cp.count} records does not verify "
                                             "with the audit key, or its chain heads are not the ones it signs"))
                continue
            for head in verified.pinned():
                if head.seq:  # a chain with no record yet pins nothing
                    self.pins.setdefault(head.chain, []).append(_Pin(head.seq, head.hash, verified))
        for head in heads:
            if head.seq:
                self.pins.setdefault(head.chain, []).append(_Pin(head.seq, head.hash, None))
        for pins in self.pins.values():
            pins.sort(key=lambda pin: (pin.seq, pin.checkpoint is None))

        self.pending = 0  # the chains' gaps and suspects, resolved at the end

    def _add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def feed(self, r: AuditRecord) -> bool:
        chain = self.chains.get(r.chain)
        if chain is None:
            chain = self.chains[r.chain] = _ChainVerifier(r.chain, self.pins.get(r.chain, []), self._add)
        before = chain.anomalies()
        chain.feed(r)
        self.pending += chain.anomalies() - before
        self.stopped = len(self.findings) + self.pending >= self.max_findings
        return not self.stopped

    def finish(self) -> list[Finding]:
        if not self.stopped:
            for name, pins in self.pins.items():
                signed = [pin for pin in pins if pin.checkpoint is not None]
                if name not in self.chains and signed:
                    newest = signed[-1]
                    assert newest.checkpoint is not None
                    self._add(Finding(1, "dropped", f"chain `{name}` has no record, but the checkpoint signed at "
                                      f"{newest.checkpoint.time:.3f} covers {newest.seq} of its records",
                                      newest.seq, name))
        for chain in self.chains.values():
            chain.finish(truncation=not self.stopped)
        return sorted(self.findings, key=lambda f: (f.chain, f.seq, f.kind))


class _ChainVerifier:
    """One chain's records, in order."""

    def __init__(self, name: str, pins: list[_Pin], add: Callable[[Finding], None]):
        self.name = name
        self.pins = pins
        self.next_pin = 0
        self.report = add
        self.prev_seq, self.prev_hash, self.prev_flagged = 0, GENESIS_HASH, False
        self.gaps: list[list[int]] = []
        self.suspects: list[AuditRecord] = []
        self.trusted_upto = 0  # highest seq whose hash matched a checkpoint

    def _add(self, seq: int, kind: str, message: str, last_seq: int = 0) -> None:
        self.report(Finding(seq, kind, message, last_seq, self.name))

    def anomalies(self) -> int:
        return len(self.gaps) + len(self.suspects)

    def _record(self, seq: int) -> str:
        return f"record {seq}" if self.name == LEGACY_CHAIN else f"record {seq} of chain `{self.name}`"

    def feed(self, r: AuditRecord) -> None:
        if r.chain_seq <= self.prev_seq:
            self._out_of_order(r)
        else:
            self._in_order(r)

    def _in_order(self, r: AuditRecord) -> None:
        seq = r.chain_seq
        if seq > self.prev_seq + 1:
            self.gaps.append([self.prev_seq + 1, seq - 1])
            link_ok = True  # the broken link is explained by the gap
        else:
            link_ok = r.prev_hash == self.prev_hash
        flagged = not _content_ok(r)
        if flagged and link_ok:
            self._add(seq, "edited", f"{self._record(seq)} does not match its hash")
        elif flagged:
            self._suspect(r)  # wrong link and wrong hash: moved here, or both edited
        elif not link_ok and not self.prev_flagged:
            self._add(self.prev_seq, "edited",
                      f"{self._record(self.prev_seq)} is not the record that record {seq} "
                      "was chained to (edited and re-hashed)")
        self._check_pins(r)
        self.prev_seq, self.prev_hash, self.prev_flagged = seq, r.hash, flagged

    def _out_of_order(self, r: AuditRecord) -> None:
        seq = r.chain_seq
        for gap in self.gaps:
            if gap[0] <= seq <= gap[1]:  # not missing after all, only misplaced
                self.gaps.remove(gap)
                self.gaps += [g for g in ([gap[0], seq - 1], [seq + 1, gap[1]]) if g[0] <= g[1]]
                break
        self._add(seq, "reordered", f"{self._record(seq)} comes after record {self.prev_seq}")
        if not _content_ok(r):
            self._add(seq, "edited", f"{self._record(seq)} does not match its hash")

    def _suspect(self, r: AuditRecord) -> None:
        if len(self.suspects) < _MAX_SUSPECTS:
            self.suspects.append(r)
        else:
            self._add(r.chain_seq, "edited", f"{self._record(r.chain_seq)} does not match its hash or link")

    def _check_pins(self, r: AuditRecord) -> None:
        seq = r.chain_seq
        while self.next_pin < len(self.pins) and self.pins[self.next_pin].seq <= seq:
            pin = self.pins[self.next_pin]
            self.next_pin += 1
            if pin.seq < seq:
                continue  # its record is missing: the gap is reported instead
            if r.hash == pin.hash:
                if pin.checkpoint is not None:
                    self.trusted_upto = seq
            elif pin.checkpoint is None:
                self._add(seq, "head_mismatch", f"{self._record(seq)} is not the one the chain's stored head names")
            else:
                self._add(seq, "checkpoint_mismatch",
                          f"{self._record(seq)} differs from the checkpoint signed at "
                          f"{pin.checkpoint.time:.3f} by `{pin.checkpoint.kid}`: a record in "
                          f"{self.trusted_upto + 1}..{seq} was rewritten")

    def finish(self, *, truncation: bool) -> None:
        if truncation and self.pins and self.pins[-1].seq > self.prev_seq:
            newest = self.pins[-1]
            said = (f"the checkpoint signed at {newest.checkpoint.time:.3f}" if newest.checkpoint is not None
                    else "its stored head")
            where = "the log" if self.name == LEGACY_CHAIN else f"chain `{self.name}`"
            self._add(self.prev_seq + 1, "truncated",
                      f"{where} ends at record {self.prev_seq} but {said} covers {newest.seq}", newest.seq)
        for lo, hi in self.gaps:
            what = f"record {lo} is" if lo == hi else f"records {lo}..{hi} are"
            self._add(lo, "deleted", f"{what} missing" + ("" if self.name == LEGACY_CHAIN
                                                          else f" from chain `{self.name}`"), hi)
        self._resolve_suspects()

    def _resolve_suspects(self) -> None:
        # A record moved to another seq still verifies at its original seq, which is
        # either another suspect's seq (a swap) or a missing one (moved elsewhere).
        candidates = {s.chain_seq for s in self.suspects}
        for lo, hi in self.gaps:
            if len(candidates) + hi - lo < _MAX_GAP_CANDIDATES + len(self.suspects):
                candidates.update(range(lo, hi + 1))
        for s in self.suspects:
            origin = next((c for c in sorted(candidates) if c != s.chain_seq and _content_ok(s, c)), None)
            if origin is not None:
                self._add(s.chain_seq, "reordered", f"{self._record(s.chain_seq)} was written as record {origin}")
            else:
                self._add(s.chain_seq, "edited", f"{self._record(s.chain_seq)} does not match its hash or its link")
