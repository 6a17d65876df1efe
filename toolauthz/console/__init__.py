"""The browser console for approvers and auditors (docs/console.md).

Server-rendered pages (Starlette and Jinja2, plain HTML forms, one small script for the
expiry countdown, every asset in this package), served by `toolauthz serve` itself on
`console_listen`, on the same event loop as the gRPC server and the HTTP API. Being in
the process that decides, an approval decided here goes through the very ApprovalDesk
call that gRPC `DecideApproval` makes: the same checks, refusals and audit records, and
the same poke that wakes the `WatchApproval` streams a runtime's Guard waits on.

Under `--workers N` every worker serves the console on the one address (SO_REUSEPORT,
as for the gRPC and HTTP listeners: the parent reserves the port, port 0 resolved once).
Nothing the console keeps is per process: the session is a signed cookie whose secret is
one file in the data directory (toolauthz/console/session.py), the approvals and the audit
trail are in the shared store, and a decision made on one worker reaches the watchers of
another through the store (the desk's watches look again every MAX_WATCH_WAIT seconds;
PostgreSQL notifies at once). Only the last on-demand chain verification shown in the
explorer is the answering worker's own.

Layers: above the service layer (it uses its error table and loopback rules), below the
server, which builds it from the settings (toolauthz/server/web.py `console_of`).
"""

from toolauthz.console.app import Console
from toolauthz.console.visit import ConsoleDeps

__all__ = ["Console", "ConsoleDeps"]
