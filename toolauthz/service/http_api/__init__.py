"""The HTTP/JSON API: Authorize, Verify, ReportOutcome and GetKeys for runtimes that do
not speak gRPC (a TypeScript agent with `fetch`, a shell script with `curl`).

    POST /v1/authorize   {context, call}                      -> the AuthorizeResponse as JSON
    POST /v1/authorize-batch  {context, calls: [{call, entities}]}
                              -> {answers: [{response: <as /v1/authorize>} | {error: {code, message}}]}
    POST /v1/verify      {token, context, call}               -> {valid, code, decision_id}
    POST /v1/outcome     {context, call_id, status, ...}      -> {decision_id, unverified}
    POST /v1/approval    {approval_id, context?}              -> the approval (GetApproval)
    POST /v1/approval/wait  {approval_id, context?, wait_seconds?}
                                                              -> the approval once decided, or at
                                                                 the end of the wait (WatchApproval)
    POST /v1/call-story  {tenant, call_id}                    -> {summary, steps, complete}
    GET  /v1/keys                                             -> {keys: [{kid, paserk, jwk, state}]}
    GET  /healthz                                             -> {status: "SERVING"}

The handlers hand the authorizer's plans to the decision pump exactly as the gRPC
handlers do, so decisions, errors and audit records are the same on both transports.
`call.input` is a JSON value in the body, kept as the bytes received (json_body.py): the
digest, the strict parsing and the schema see the text the runtime sent, as gRPC's
`input_json` does. Every body must be `Content-Type: application/json`, which a page
cannot post without a CORS preflight the API never passes. OpenAPI: docs/openapi.yaml.

Its parts, along their seams:
    listener.py   uvicorn on the shared loop; the caller and Host rule of each connection
    app.py        the routes (RPC and body cap of each) and the one boundary, in order
    body.py       reading a body within its cap, parsing it off the loop when large
    json_body.py  the strict scan that keeps raw members and enforces a body's shape
    envelope.py   each route's body shape, and the model values a body stands for
    handlers.py   what each route asks of the authorizer and the pump
    approval_routes.py  the approval, wait and call-story routes (desk, watches, audit log)
    approval_json.py    the JSON of an approval and of a call's story
    answers.py    the JSON of a decision and of a failure
"""

from toolauthz.service.http_api.app import HttpApi, HttpRoute
from toolauthz.service.http_api.listener import HostRule, HttpListener, HttpPeer, any_host, host_rule

__all__ = ["HostRule", "HttpApi", "HttpListener", "HttpPeer", "HttpRoute", "any_host", "host_rule"]
