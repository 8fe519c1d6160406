"""Transfers that go wrong half way: an interrupted download resumes with a ``Range`` request and
ends with the right bytes; a full disk is one line naming the cache and what to do."""

from __future__ import annotations

import os
import subprocess
import sys

from huggingface_hub import constants

from tests.hub.test_hub_cli import met

# The client writes in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB): a cut after the first chunk leaves
# that chunk on disk, so the retry must ask for the rest with a Range request.
CHUNK = constants.DOWNLOAD_CHUNK_SIZE
BLOB = bytes(range(256)) * ((CHUNK + CHUNK // 4) // 256)


def test_interrupted_transfer_resumes_with_range(hub):
    hub.repos["org/cut-GGUF"] = {"cut-Q4_K_M.gguf": BLOB}
    hub.cut["cut-Q4_K_M.gguf"] = CHUNK + 1000
    done = met("pull", "org/cut-GGUF")
    assert done.returncode == 0, done.stderr
    with open(done.stdout.strip(), "rb") as handle:
        assert handle.read() == BLOB
    gets = [rng for method, path, rng in hub.requests if method == "GET" and path.endswith("cut-Q4_K_M.gguf")]
    assert gets[0] is None and gets[-1] == f"bytes={CHUNK}-", gets


# Runs the CLI with every write into the cache's blobs failing with ENOSPC after the first bytes, as a
# full disk does (the client writes its ``.incomplete`` file through ``temp_file.write``).
_DISK_FULL = """
import errno, sys
import huggingface_hub.file_download as fd
real = fd.http_get
def full_disk(url, temp_file, **kw):
    temp_file.write(b"GGUF")
    raise OSError(errno.ENOSPC, "No space left on device")
fd.http_get = full_disk
from metrale_core.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_full_disk_is_one_line(hub):
    hub.repos["org/big-GGUF"] = {"big-Q4_K_M.gguf": BLOB}
    done = subprocess.run(
        [sys.executable, "-c", _DISK_FULL, "pull", "org/big-GGUF"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("met: error")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "disk full" in errors[0] and "HF_HOME" in errors[0] and os.environ["HF_HOME"] in errors[0], errors
