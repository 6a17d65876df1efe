"""Human approval: a second principal approves the exact call, and only that call.

An approval is bound to the call's digest; approving it yields a token for that digest
and nothing else. Who may approve is decided by Cedar (`Action::"approve"` on
`Approval::"<id>"`, through the engine); two rules hold whatever the policies say: a
requester never approves their own call, and an approver from another tenant is refused
(identity/approvers.py: neither the tenant the request names nor an ID token makes a
person the bundle declares in another tenant an approver here).

A decision is only as good as the policies that made it: approving a call re-decides it
under the bundle loaded now (from the arguments and entities the approval keeps while it
is pending), and so does a replay that would hand out its token under another policy
version. A call the policies now deny, or now route to another group, gets no token
(`policy_changed`); one they now allow without approval is approved as asked.

One module per responsibility: `desk.py` opens and reads approvals and answers replays;
`deciding.py` decides one (who may, what is audited, which token); `redecide.py` decides
the call afresh under the policies loaded now; `listeners.py` tells watchers of changes.
"""

from toolauthz.approvals.deciding import APPROVE, REJECT
from toolauthz.approvals.desk import MAX_WATCH_WAIT, TERMINAL, ApprovalDesk, ReplayedApproval, short_code
from toolauthz.approvals.listeners import ChangeListener
from toolauthz.approvals.redecide import POLICY_CHANGED

__all__ = ["APPROVE", "MAX_WATCH_WAIT", "POLICY_CHANGED", "REJECT", "TERMINAL", "ApprovalDesk", "ChangeListener",
           "ReplayedApproval", "short_code"]
