"""The authorizer: the engine's verdict plus the call ledger, tokens and the audit trail.

Fail closed: any error between the verdict and the response means no token. The audit
record of every answer is committed before the answer is returned; a decision's record
and a verification's record commit in the same transaction as their ledger write.

    core.py       Authorizer: each RPC as a plan, and plans run (ledger writes shared)
    parts.py      what every plan uses: the collaborators, ids, tokens, audit events
    plans.py      a plan and the answers it finishes with
    writes.py     running plans: their writes share commits; decisions made on run counts
    deciding.py   Authorize of a new call: validation, the decision, its draft and record
    replay.py     Authorize of a call already recorded (the same call id again)
    verifying.py  Verify: the token checked, then consumed by the call's owner
    reports.py    ReportOutcome and ReportRefusal
"""

from toolauthz.authorizer.core import Authorizer
from toolauthz.authorizer.plans import AuthorizeResult, Deciding, OutcomeResult, Plan, VerifyResult
from toolauthz.authorizer.reports import MAX_REFUSAL_DETAIL_CHARS, REPORTABLE_REFUSALS

__all__ = ["MAX_REFUSAL_DETAIL_CHARS", "REPORTABLE_REFUSALS", "AuthorizeResult", "Authorizer", "Deciding",
           "OutcomeResult", "Plan", "VerifyResult"]
