"""The call digest: what a token is bound to (docs/digest.md is the cross-language spec).

sha256(DIGEST_DOMAIN + JCS(call)). JCS (RFC 8785) gives every runtime the same bytes for
the same value; the domain prefix keeps a call digest from ever equalling the hash of
some other JSON document the system signs or records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import rfc8785

from toolauthz import canonical
from toolauthz.errors import InputError
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.strict_json import parse_strict_json

__all__ = ["DIGEST_DOMAIN", "MAX_DEPTH", "DigestedCall", "InputLimits", "call_digest", "canonical_json",
           "digest_call"]

DIGEST_DOMAIN = b"toolauthz/call/v1\n"
MAX_DEPTH = 64


@dataclass(frozen=True)
class InputLimits:
    """How much input a call may carry before it is refused unparsed."""

    max_bytes: int
    max_depth: int = MAX_DEPTH


@dataclass(frozen=True)
class DigestedCall:
    """A call's arguments as strictly parsed, and the digest a token for it is bound to."""

    input: Any  # the parsed JSON value: dict, list, str, int, float, bool or None
    digest: str


def digest_call(ctx: TrustedContext, call: ProposedCall, limits: InputLimits) -> DigestedCall:
    """The one way from `input_json` to a digest, for Authorize and Verify alike: the
    same strict parsing and depth limit, so that no input can verify that Authorize would
    have refused. Raises InputError."""
    value = parse_strict_json(call.input_json, max_bytes=limits.max_bytes, max_depth=limits.max_depth)
    digest = call_digest(tool=call.name, input=value, principal_type=ctx.principal.type,
                         principal_id=ctx.principal.id, tenant=ctx.tenant, call_id=call.call_id)
    return DigestedCall(value, digest)


def canonical_json(obj: Any) -> bytes:
    """RFC 8785 canonical JSON of `obj`, or InputError if it has no canonical form."""
    try:
        return canonical.canonical_json(obj)
    except rfc8785.IntegerDomainError:
        # The library's own message contains the number: do not pass values on.
        message = "an integer is outside ±(2^53-1); send it as a string"
    except rfc8785.FloatDomainError:
        message = "a number is NaN or infinite"
    except rfc8785.CanonicalizationError as e:
        # The remaining texts are fixed; the only non-UTF-8 a str can hold is a surrogate.
        message = "a string contains a lone surrogate" if "UTF-8" in str(e) else str(e)
    except UnicodeEncodeError:
        # rfc8785 0.1.4 sorts keys with key.encode("utf-16be"), which raises this (not
        # CanonicalizationError) for a key holding a lone surrogate.
        message = "a key contains a lone surrogate"
    except RecursionError:
        message = "input nests too deeply"
    except (TypeError, ValueError):
        message = "input cannot be canonicalized"
    raise InputError("invalid_input", f"cannot canonicalize: {message}")


def call_digest(
    *, tool: str, input: object, principal_type: str, principal_id: str, tenant: str, call_id: str
) -> str:
    """Lowercase hex SHA-256 binding one exact call; `input` is the strictly parsed value."""
    fields = {"tool": tool, "principal_type": principal_type, "principal_id": principal_id,
              "tenant": tenant, "call_id": call_id}
    for name, value in fields.items():
        # A non-string here would still canonicalize, to a digest no other runtime expects.
        if not isinstance(value, str):
            raise InputError("invalid_input", f"cannot canonicalize: `{name}` must be a string")
    call = {
        "call_id": call_id,
        "input": input,
        "principal": {"type": principal_type, "id": principal_id},
        "tenant": tenant,
        "tool": tool,
    }
    return hashlib.sha256(DIGEST_DOMAIN + canonical_json(call)).hexdigest()
