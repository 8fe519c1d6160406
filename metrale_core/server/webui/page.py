"""``GET /``: the chat page (``index.html`` of this package, read once, served as is).

Owner: ``server.webui`` (its ``webui_handlers``).  The page is a single static file -- HTML,
inline CSS and vanilla JS, no build step, no CDN, no external fonts -- that talks to the server's
own ``/v1/models`` and ``/v1/chat/completions`` with ``fetch``.

Invariants:
- Every answer carries :data:`SECURITY_HEADERS`: a Content-Security-Policy that allows loads and
  connections to this origin only (the inline script and style of the page itself, ``data:``
  images), no framing, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``.
- ``Cache-Control: no-cache``: a browser revalidates, so an upgraded server serves its new page.
- Not in the OpenAPI schema (it is not an API).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from litestar import MediaType, Response, get

__all__ = ["SECURITY_HEADERS", "chat_page", "page_html"]

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def page_html() -> str:
    """The page's text (read from the installed package on first use)."""
    return files("metrale_core.server.webui").joinpath("index.html").read_text(encoding="utf-8")


@get(["/", "/index.html"], include_in_schema=False, sync_to_thread=False)
def chat_page() -> Response[str]:
    """The browser chat page."""
    return Response(page_html(), media_type=MediaType.HTML, headers=SECURITY_HEADERS)
