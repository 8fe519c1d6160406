"""The OpenAI Responses API (``/v1/responses``) as a translation layer onto the chat path:
``records`` (request record), ``translate`` (to the chat request), ``events`` (output items and
stream events), ``store`` (bounded LRU for ``previous_response_id``), ``route`` (handlers)."""

from metrale_core.server.responses.route import response_handlers
from metrale_core.server.responses.store import ResponseStore

__all__ = ["ResponseStore", "response_handlers"]
