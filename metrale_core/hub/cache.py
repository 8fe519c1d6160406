"""The local HF cache: list the models in it with their sizes, remove one.

Owner: ``met models`` and ``met rm``.

Invariants:
- Only the standard HF cache (``HF_HUB_CACHE`` / ``HF_HOME``) is read or changed, through
  ``huggingface_hub.scan_cache_dir``.
"""

from __future__ import annotations

from metrale_core.hub.errors import HubError

__all__ = ["cached_models", "format_models", "remove_model"]


def cached_models() -> list[tuple[str, int, int]]:
    """``(repo_id, size_on_disk, n_files)`` for every model repo in the cache, by name."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    return sorted((r.repo_id, r.size_on_disk, r.nb_files) for r in info.repos if r.repo_type == "model")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def format_models(rows: list[tuple[str, int, int]]) -> str:
    """A table of the cached models, or a line saying there are none."""
    if not rows:
        return "no models in the cache"
    width = max(len("MODEL"), *(len(r[0]) for r in rows))
    lines = [f"{'MODEL':<{width}}  {'SIZE':>10}  FILES"]
    lines += [f"{repo:<{width}}  {_human(size):>10}  {files}" for repo, size, files in rows]
    return "\n".join(lines)


def remove_model(repo_id: str) -> int:
    """Delete every cached revision of ``repo_id``; the bytes freed."""
    from huggingface_hub import scan_cache_dir

    repo_id = repo_id.split(":", 1)[0]
    for repo in scan_cache_dir().repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            hashes = [rev.commit_hash for rev in repo.revisions]
            strategy = scan_cache_dir().delete_revisions(*hashes)
            strategy.execute()
            return repo.size_on_disk
    raise HubError(f"{repo_id} is not in the cache (see 'met models')")
