"""A loopback Hugging Face hub: the HTTP shapes ``huggingface_hub`` reads, on the stdlib.

Owner: ``tests/hub``.

Invariants:
- Serves ``/api/models/{repo}[/revision/{rev}]`` (siblings with ``lfs.sha256``), ``HEAD``/``GET
  /{repo}/resolve/{rev}/{path}`` with ``ETag``, ``X-Repo-Commit``, ``X-Linked-Etag``/``-Size`` and
  ``Range`` -> 206; 404 with ``X-Error-Code``; no Xet headers (plain HTTP downloads).
- ``repos[repo] = {path: bytes}``; ``corrupt`` paths are served with one flipped byte;
  ``gated`` repos need ``Authorization: Bearer <token>``; ``requests`` records (method, path, range).
- ``cut[path] = n``: the next GET of ``path`` announces the whole length, sends ``n`` bytes and drops
  the connection (an interrupted transfer), once.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "a" * 40


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: dict[str, str] = {}
        self.corrupt: set[str] = set()
        self.cut: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _error(self, h, status: int, code: str) -> None:
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Type", "application/json")
        payload = json.dumps({"error": code}).encode()
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _serve(self, h, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/") :]
            repo = "/".join(rest.split("/")[:2])
            if rest.split("/")[2:3] == ["tree"]:
                return self._tree(h, repo)
            return self._api(h, repo)
        parts = path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(h, 404, "RepoNotFound")
        repo, name = "/".join(parts[:2]), "/".join(parts[4:])
        if not self._allowed(h, repo):
            return None
        files = self.repos[repo]
        if name not in files:
            return self._error(h, 404, "EntryNotFound")
        data = files[name]
        sha = hashlib.sha256(data).hexdigest()
        if name in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
        h.send_response(206 if start else 200)
        h.send_header("ETag", f'"{sha}"')
        h.send_header("X-Linked-Etag", f'"{sha}"')
        h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if body and name in self.cut:
            h.wfile.write(data[start : start + self.cut.pop(name)])
            h.wfile.flush()
            h.close_connection = True
        elif body:
            h.wfile.write(data[start:])

    def _allowed(self, h, repo: str) -> bool:
        if repo not in self.repos:
            self._error(h, 401, "RepoNotFound")
            return False
        token = self.gated.get(repo)
        if token is not None and h.headers.get("Authorization") != f"Bearer {token}":
            self._error(h, 401, "GatedRepo")
            return False
        return True

    def _tree(self, h, repo: str) -> None:
        if not self._allowed(h, repo):
            return
        entries = [
            {
                "type": "file",
                "path": n,
                "size": len(d),
                "oid": hashlib.sha1(d).hexdigest(),
                "lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 130},
            }
            for n, d in sorted(self.repos[repo].items())
        ]
        self._json(h, entries)

    def _json(self, h, obj) -> None:
        payload = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _api(self, h, repo: str) -> None:
        if not self._allowed(h, repo):
            return
        siblings = [
            {
                "rfilename": n,
                "size": len(d),
                "blobId": hashlib.sha1(d).hexdigest(),
                "lfs": {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 130},
            }
            for n, d in sorted(self.repos[repo].items())
        ]
        payload = json.dumps(
            {
                "id": repo,
                "modelId": repo,
                "sha": COMMIT,
                "siblings": siblings,
                "private": False,
                "gated": repo in self.gated,
            }
        ).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)
