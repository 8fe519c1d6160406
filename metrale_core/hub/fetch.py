"""Resolve a model argument to a local path, downloading hub names with ``huggingface_hub``.

Owner: the CLI (``met serve``, ``met generate``, ``met pull``).

Invariants:
- A local path that exists is returned unchanged; ``None`` (the embedded model) stays ``None``.
- Downloads use the real client: the standard HF cache, ``HF_TOKEN``, ``HF_ENDPOINT``,
  ``HF_HUB_OFFLINE``, resumable ``.incomplete`` files and its tqdm progress bar on stderr.
- Every LFS file fetched is checked against the hub's sha256; a mismatching file is deleted
  from the cache and refused with a one-line error.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from metrale_core.hub.errors import HubError, hub_error
from metrale_core.hub.spec import HubSpec, choose_gguf_files, is_hub_name, parse_spec, wanted_hf_file

__all__ = ["fetch_model", "resolve_model_arg"]


def resolve_model_arg(model: str | None) -> str | None:
    """The local path for ``model``: unchanged if it is a path (or ``None``), else fetched from the hub."""
    if model is None or not is_hub_name(model):
        return model
    return str(fetch_model(parse_spec(model)))


def fetch_model(spec: HubSpec) -> Path:
    """Download (or find in the cache) the files ``spec`` needs; the local model path."""
    try:
        return _fetch(spec)
    except HubError:
        raise
    except Exception as exc:  # the client's errors -> one line
        raise hub_error(exc, spec.repo_id) from None


def _fetch(spec: HubSpec) -> Path:
    from huggingface_hub import HfApi, constants, snapshot_download

    if constants.HF_HUB_OFFLINE:
        return _local_choice(_cached_snapshot(spec.repo_id), spec)
    info = HfApi().model_info(spec.repo_id, files_metadata=True)
    siblings = {s.rfilename: s for s in info.siblings or []}
    names = list(siblings)
    if spec.filename:
        if spec.filename not in siblings:
            raise HubError(f"{spec.repo_id} has no file {spec.filename}")
        files = [spec.filename]
    else:
        files = choose_gguf_files(names, spec.quant)
        if not files:
            if spec.quant:
                raise HubError(f"{spec.repo_id} has no .gguf files; drop ':{spec.quant}' to fetch its safetensors")
            files = [n for n in names if wanted_hf_file(n)]
            if not any(n.endswith(".safetensors") for n in files):
                raise HubError(f"{spec.repo_id} has neither .gguf nor .safetensors weights")
    folder = Path(snapshot_download(spec.repo_id, allow_patterns=files))
    for name in files:
        lfs = siblings[name].lfs
        if lfs is not None:
            _check_sha256(folder / name, lfs.sha256, spec.repo_id)
    return folder / files[0] if files[0].endswith(".gguf") else folder


def _cached_snapshot(repo_id: str) -> Path:
    """The newest cached snapshot folder of ``repo_id`` (offline); the client's error if none."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        snapshots = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
        found = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
        if not found:
            raise
        return found[-1]


def _local_choice(folder: Path, spec: HubSpec) -> Path:
    names = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    if spec.filename:
        return folder / spec.filename
    ggufs = choose_gguf_files(names, spec.quant)
    return folder / ggufs[0] if ggufs else folder


def _check_sha256(path: Path, expected: str, repo_id: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected.lower():
        blob = path.resolve()
        for target in (path, blob):
            if os.path.lexists(target):
                os.unlink(target)
        raise HubError(
            f"{repo_id}/{path.name}: sha256 mismatch (got {digest.hexdigest()[:12]}…, hub says "
            f"{expected[:12]}…); the file was deleted, run the command again"
        )
