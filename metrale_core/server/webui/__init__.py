"""The browser chat page at ``/``: one static HTML file with its CSS and JS inline (``index.html``).

Owner: ``server.app`` mounts :data:`webui_handlers` at the top level of the app, outside the
API-key guard: the page holds no secret; it sends the key its user enters with each API call.

Invariants:
- ``webui_handlers`` is a list of route handlers, none of them in the OpenAPI schema.
- The page loads nothing from another origin (see ``page.SECURITY_HEADERS``).
"""

from metrale_core.server.webui.page import chat_page

__all__ = ["webui_handlers"]

webui_handlers: list = [chat_page]
