"""``met pull`` / ``met models`` / ``met rm`` end to end, the real client against the loopback hub (subprocesses,
so the client reads HF_ENDPOINT / HF_HOME afresh)."""

from __future__ import annotations

import os
import subprocess
import sys

GGUF = {"tiny-Q4_K_M.gguf": b"GGUF" + b"\x01" * 5000, "tiny-Q8_0.gguf": b"GGUF" + b"\x02" * 7000, "README.md": b"hi"}


def met(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "metrale_core.cli.main", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_pull_models_rm(hub):
    hub.repos["org/tiny-GGUF"] = dict(GGUF)
    done = met("pull", "org/tiny-GGUF:q8_0")
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert path.endswith("tiny-Q8_0.gguf")
    with open(path, "rb") as handle:
        assert handle.read() == GGUF["tiny-Q8_0.gguf"]
    assert not any("Q4_K_M" in p for _, p, _ in hub.requests if "resolve" in p)
    listing = met("models")
    assert "org/tiny-GGUF" in listing.stdout and "KB" in listing.stdout, listing.stdout
    removed = met("rm", "org/tiny-GGUF")
    assert removed.returncode == 0, removed.stderr
    assert "org/tiny-GGUF" not in met("models").stdout


def test_corrupt_file_refused_and_deleted(hub):
    hub.repos["org/bad-GGUF"] = dict(GGUF)
    hub.corrupt.add("tiny-Q4_K_M.gguf")
    done = met("pull", "org/bad-GGUF")
    assert done.returncode == 2 and "sha256" in done.stderr, done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("met: error")]) == 1
    assert "org/bad-GGUF" not in met("models").stdout or "0 B" in met("models").stdout


def test_missing_and_gated_and_token(hub):
    done = met("pull", "org/none")
    assert done.returncode == 2 and "no repo org/none" in done.stderr, done.stderr
    hub.repos["org/gated-GGUF"] = dict(GGUF)
    hub.gated["org/gated-GGUF"] = "secret"
    done = met("pull", "org/gated-GGUF")
    assert done.returncode == 2 and "gated" in done.stderr and "HF_TOKEN" in done.stderr, done.stderr
    done = met("pull", "org/gated-GGUF", HF_TOKEN="secret")
    assert done.returncode == 0, done.stderr


def test_no_network_and_offline(hub):
    hub.repos["org/tiny-GGUF"] = dict(GGUF)
    assert met("pull", "org/tiny-GGUF").returncode == 0
    done = met("pull", "org/tiny-GGUF", HF_HUB_OFFLINE="1")
    assert done.returncode == 0 and done.stdout.strip().endswith("tiny-Q4_K_M.gguf"), done.stderr
    done = met("pull", "org/other", HF_HUB_OFFLINE="1")
    assert done.returncode == 2 and "not in the cache" in done.stderr, done.stderr
    hub.close()
    done = met("pull", "org/other")
    assert done.returncode == 2 and "cannot reach HF_ENDPOINT" in done.stderr, done.stderr


def test_pull_by_file_name(hub):
    hub.repos["org/tiny-GGUF"] = dict(GGUF)
    done = met("pull", "org/tiny-GGUF/tiny-Q8_0.gguf")
    assert done.returncode == 0 and done.stdout.strip().endswith("tiny-Q8_0.gguf"), done.stderr
    assert {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p} == {"tiny-Q8_0.gguf"}
    done = met("pull", "org/tiny-GGUF/none.gguf")
    assert done.returncode == 2 and "has no file none.gguf" in done.stderr, done.stderr
