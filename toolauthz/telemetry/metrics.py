"""The Prometheus metrics, all named `toolauthz_*`.

Labels are bounded: a tool label is a name the loaded catalog holds, or `unknown` (a
model writes the tool name, so its string never becomes a label); results, verify codes
verdicts and transports (`grpc`, `mcp`, `http`, `console`: toolauthz/service/observe.py)
are fixed vocabularies; a shadow label is a policy `@id` of the bundle. No
call id, request id, principal or tenant is ever a label.

With several worker processes, `PROMETHEUS_MULTIPROC_DIR` (set by the parent before it
starts the workers, toolauthz/server/observability.py) makes every process write its
values to files there, and the parent serves their sum. The variable is read when
prometheus_client is first imported, so a worker imports this module only after it is
set (spawned workers inherit it).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Gauge, Histogram

UNKNOWN_TOOL = "unknown"

# Decisions take about a millisecond; a slow disk or a big batch, tens.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

DECISIONS = Counter("toolauthz_decisions",
                    "Authorize answers (a batch's: one per call) by tool, decision and transport",
                    ["tool", "result", "transport"])
RPC_SECONDS = Histogram("toolauthz_rpc_duration_seconds",
                        "Time to answer Authorize, AuthorizeBatch, Verify, ReportOutcome and ReportRefusal",
                        ["rpc", "transport"],
                        buckets=_LATENCY_BUCKETS)
VERIFICATIONS = Counter("toolauthz_verifications", "Verify answers by code and transport", ["code", "transport"])
APPROVALS_PENDING = Gauge("toolauthz_approvals_pending", "Approvals waiting for a decision (sampled from the store)",
                          multiprocess_mode="livemostrecent")
APPROVALS_DECIDED = Counter("toolauthz_approvals_decided", "Approval decisions by verdict and transport",
                            ["verdict", "transport"])
AUDIT_WRITE_SECONDS = Histogram("toolauthz_audit_write_duration_seconds",
                                "Time to commit a batch of audit records (with its ledger rows)",
                                buckets=_LATENCY_BUCKETS)
AUDIT_WRITE_FAILURES = Counter("toolauthz_audit_write_failures", "Audit commits that failed (no token was sent)")
SHED = Counter("toolauthz_shed", "Requests refused RESOURCE_EXHAUSTED before they were decided: the decision "
               "queue's wait would have exceeded max_queue_seconds (no token; audited in aggregate)")
CONGESTION_MARKS = Counter("toolauthz_congestion_marks", "Authorize and AuthorizeBatch answers marked congested "
                           "(trailing metadata toolauthz-congested: 1) while the decision queue was long: the "
                           "SDKs' clients slow down on them before the queue's bound refuses")
CALLS_OVER_LIMIT = Counter("toolauthz_calls_over_limit", "Unary calls refused RESOURCE_EXHAUSTED on arrival "
                           "because max_concurrent_rpcs calls were in progress (no token, safe to retry)")
STREAMING_OVER_LIMIT = Counter("toolauthz_streaming_calls_over_limit", "Streaming calls (health and approval "
                               "watches, reflection, QueryDecisions) refused RESOURCE_EXHAUSTED on arrival because "
                               "max_streaming_rpcs were open (safe to retry)")
STORE_ERRORS = Counter("toolauthz_store_errors", "Requests answered UNAVAILABLE because a store failed")
FORESEEN = Counter("toolauthz_store_foreseen", "PostgreSQL write transactions whose reads were foreseen (one round "
                   "trip), by result: hit, or miss (another replica wrote a row they read; the batch ran again)",
                   ["result"])
RELOADS = Counter("toolauthz_reloads", "Bundle reloads that swapped in a new version")
RELOAD_ERRORS = Counter("toolauthz_reload_errors", "Bundle reloads refused (the last good bundle kept serving)")
RETAINED_INPUTS = Counter("toolauthz_retained_inputs", "Inputs of calls kept for replay (audit.retain_input), "
                          "by outcome: kept, too_large, failed", ["outcome"])
BUNDLE_SIGNATURE_REFUSALS = Counter("toolauthz_bundle_signature_refusals",
                                    "Bundle reloads refused because the bundle did not verify against its signature")
BUNDLE_FETCHES = Counter("toolauthz_bundle_fetches",
                         "Polls of the bundle server by outcome: new, unchanged, not_modified, refused, or why no "
                         "archive came (unreachable, tls, timeout, redirect, status, too_large, credentials)",
                         ["outcome"])
BUNDLE_FETCH_FAILURES = Gauge("toolauthz_bundle_fetch_failures",
                              "Polls of the bundle server that have failed in a row (0: the last one succeeded)",
                              multiprocess_mode="livemax")
POLICY_INFO = Gauge("toolauthz_policy_info", "1 for the policy version a worker serves (info metric)",
                    ["version"], multiprocess_mode="livemax")
BUILD_INFO = Gauge("toolauthz_build_info", "1, labelled with what runs: version, commit, Python, Cedar (cedarpy) "
                   "and the proto package (info metric)", ["version", "commit", "python", "cedar", "proto"],
                   multiprocess_mode="livemax")
DECISION_LOG_EVENTS = Counter("toolauthz_decision_log_events",
                              "Decision events shipped over HTTP, or dropped: dropped_buffer_full (the bounded "
                              "buffer was full), dropped_failed (retries exhausted), dropped_refused (a 4xx)",
                              ["outcome"])
NOTIFICATIONS = Counter("toolauthz_notifications",
                        "Approval notifications by sink kind, event and result (delivered, retry, skipped, dead)",
                        ["sink", "event", "result"])
NOTIFICATIONS_DEAD = Gauge("toolauthz_notifications_dead", "Dead-letter notifications kept (sampled from the store)",
                           multiprocess_mode="livemostrecent")
SHADOW_DISAGREEMENTS = Counter("toolauthz_shadow_disagreements",
                               "Calls whose decision a @shadow policy would have changed", ["policy"])


def tool_label(name: str, catalog: Collection[str]) -> str:
    """`name` when the catalog holds it, else `unknown`: never the model's string."""
    return name if name in catalog else UNKNOWN_TOOL


@contextmanager
def timed(histogram: Histogram) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - started)


def serving_version(version: str, previous: str = "") -> None:
    """The info metric: `version` is 1 and the version it replaced 0."""
    if previous and previous != version:
        POLICY_INFO.labels(version=previous).set(0)
    POLICY_INFO.labels(version=version).set(1)
