"""Approval notifications: events derived from the approvals, delivered to webhooks and
chat off the decision path, once per fleet (see notifier.py)."""

from sidecar.notify.events import CREATED, DECIDED, EXPIRING, ApprovalEvent, payload
from sidecar.notify.notifier import Notifier, NotifierOptions
from sidecar.notify.sinks import Sent, SlackSink, WebhookSink, slack_message

__all__ = ["Notifier", "NotifierOptions", "WebhookSink", "SlackSink", "Sent", "ApprovalEvent", "payload",
           "slack_message", "CREATED", "EXPIRING", "DECIDED"]
