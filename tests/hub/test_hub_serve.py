"""``met serve ORG/NAME-GGUF`` as a subprocess: fetched from the loopback hub, then one chat completion."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from metrale_core.testing.requires import needs_file

EMBEDDED = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@needs_file(EMBEDDED, "run met generate once to fetch the embedded model")
def test_serve_by_hub_name(hub):
    hub.repos["org/smol-GGUF"] = {"smol-Q4_1.gguf": EMBEDDED.read_bytes()}
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale_core.cli.main", "serve", "org/smol-GGUF:Q4_1", "--port", str(port), "--no-tui"],
        env={**os.environ},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)  # polling interval, not synchronisation
        body = json.dumps(
            {
                "model": "org/smol-GGUF",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Hi"}],
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.load(resp)
        assert answer["model"] == "org/smol-GGUF" and answer["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
