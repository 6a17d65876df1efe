"""Audit query filter values: spelled as records hold them, or refused naming the allowed ones."""

from __future__ import annotations

import pytest

from toolauthz import approvals
from toolauthz.audit.records import KINDS
from toolauthz.audit.store import RESULTS, AuditQuery, checked_query
from toolauthz.errors import RequestError
from toolauthz.model import Decision
from toolauthz.server import reload
from toolauthz.store.ledger import OUTCOMES
from toolauthz.tokens import claims


def test_results_are_every_value_the_writers_record():
    verify_codes = {claims.OK, claims.MALFORMED, claims.UNKNOWN_KEY, claims.BAD_SIGNATURE, claims.EXPIRED,
                    claims.NOT_YET_VALID, claims.WRONG_AUDIENCE, claims.CLAIMS_MISMATCH}
    written = ({d.value for d in Decision} | {approvals.APPROVE, approvals.REJECT} | verify_codes
               | {"already_used", "refused", "superseded"} | set(OUTCOMES) | {reload.BUNDLE_LOADED})
    assert set(RESULTS) == written
    assert len({r.lower() for r in RESULTS}) == len(RESULTS)  # case-insensitive input is unambiguous


@pytest.mark.parametrize("given, spelled", [("allow", "ALLOW"), ("Approval_Required", "APPROVAL_REQUIRED"),
                                            ("reject", "REJECT"), ("FAILED", "failed"), ("ok", "ok")])
def test_a_result_in_any_case_is_spelled_as_records_hold_it(given, spelled):
    assert checked_query(AuditQuery(result=given)).result == spelled


def test_kind_in_any_case():
    assert checked_query(AuditQuery(kind="Approval")).kind == "approval"


@pytest.mark.parametrize("query, named", [
    (AuditQuery(result="allowed"), "ALLOW, DENY, APPROVAL_REQUIRED"),
    (AuditQuery(kind="approvals"), "authorize, verify, approval, outcome"),
    (AuditQuery(principal="alice"), 'User::"alice"'),
    (AuditQuery(principal='User::alice'), 'User::"alice"'),
    (AuditQuery(principal='User::"al ice"'), 'User::"alice"'),
])
def test_a_value_no_record_holds_is_refused_naming_the_allowed_ones(query, named):
    with pytest.raises(RequestError) as info:
        checked_query(query)
    assert named in str(info.value)


def test_a_refusal_shows_the_value_escaped():
    with pytest.raises(RequestError) as info:
        checked_query(AuditQuery(result="x\x1b[31m\nDENY"))
    assert "\x1b" not in str(info.value) and "\n" not in str(info.value)


def test_a_principal_uid_passes_unchanged():
    assert checked_query(AuditQuery(principal='User::"alice@example.com"')).principal == 'User::"alice@example.com"'
    assert KINDS == ("authorize", "verify", "approval", "outcome", "bundle")
