"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) as a translation
layer onto the chat path: ``records`` (request records), ``translate`` (to the chat request),
``errors`` (Anthropic error shape, ``x-api-key`` auth), ``route`` (handlers and stream events)."""

from metrale_core.server.messages.route import messages_router

__all__ = ["messages_router"]
