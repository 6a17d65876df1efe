"""The heads of the audit chains, and the one hash that commits them all.

The trail is several hash chains (`records.chain_of` says which record goes where); a
signed checkpoint commits every chain's head at once through the Merkle Tree Hash of
RFC 6962 (section 2.1) over the heads sorted by chain name. A Merkle tree rather than
one hash over the list: a chain's head can then be proven part of a checkpoint with a
proof of log2(chains) hashes, without showing the others.

The tree is the RFC's, over SHA-256 (hashlib): leaves hashed with a 0x00 prefix, inner
nodes with 0x01, the split at the largest power of two below the size. No maintained
Python library implements RFC 6962; the tests check this one against the RFC's
reference vectors (certificate-transparency's `merkle_tree_test`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from toolauthz.canonical import canonical_json


@dataclass(frozen=True, order=True)
class ChainHead:
    """One chain's head: its name, how many records it holds (the last one's
    `chain_seq`), and the last record's hash."""

    chain: str
    seq: int
    hash: str

    def leaf(self) -> bytes:
        """The Merkle leaf: RFC 8785 JSON of [chain, seq, hash], unambiguous for any name."""
        return canonical_json([self.chain, self.seq, self.hash])


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962 MTH(D[n]); SHA-256 of the empty string for no leaves."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    level = [hashlib.sha256(b"\x00" + leaf).digest() for leaf in leaves]
    # Bottom-up: pair neighbours; an odd node is carried up unchanged. This builds the
    # same tree as the RFC's recursive split at the largest power of two below n.
    while len(level) > 1:
        paired = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def heads_root(heads: Sequence[ChainHead]) -> str:
    """The hex Merkle root over `heads` in chain-name order (the order verification
    sorts them in, whatever order they were read in)."""
    return merkle_root([head.leaf() for head in sorted(heads)]).hex()


def records_in(heads: Sequence[ChainHead]) -> int:
    """How many records the chains hold together."""
    return sum(head.seq for head in heads)


def heads_json(heads: Sequence[ChainHead]) -> str:
    """Heads as stored beside a checkpoint and exported with it: [[chain, seq, hash], ...]
    without spaces."""
    return json.dumps([[h.chain, h.seq, h.hash] for h in heads], separators=(",", ":"))


def heads_from_json(text: str) -> tuple[ChainHead, ...]:
    """The heads of `heads_json`; none for text that is not (a tampered cell or file:
    the checkpoint then fails to verify, since its root covers heads)."""
    try:
        value = json.loads(text) if text else []
        return tuple(ChainHead(str(name), int(seq), str(hash_)) for name, seq, hash_ in value)
    except (TypeError, ValueError):
        return ()
