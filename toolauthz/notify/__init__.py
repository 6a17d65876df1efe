"""Approval notifications: events derived from the approvals, delivered to webhooks and
chat off the decision path, once per fleet (see notifier.py)."""

from toolauthz.notify.events import CREATED, DECIDED, EXPIRING, ApprovalEvent, payload
from toolauthz.notify.notifier import Notifier, NotifierOptions
from toolauthz.notify.sinks import Sent, SlackSink, WebhookSink, slack_message

__all__ = ["Notifier", "NotifierOptions", "WebhookSink", "SlackSink", "Sent", "ApprovalEvent", "payload",
           "slack_message", "CREATED", "EXPIRING", "DECIDED"]
