"""Hub failures as one-line :class:`metrale_core.errors.MetraleError`s that say what to do next.

Owner: ``metrale_core.hub.fetch``.

Invariants:
- Every message is one line and names the repo, the endpoint or the cache folder concerned.
"""

from __future__ import annotations

import errno

from metrale_core.errors import ConfigError, MetraleError

__all__ = ["HubError", "hub_error"]


class HubError(MetraleError):
    """A model could not be fetched from (or found in the cache of) the hub."""


def hub_error(exc: BaseException, repo_id: str) -> MetraleError:
    """Map a hub / OS exception raised while fetching ``repo_id`` to a one-line error."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hf_errors

    endpoint = constants.ENDPOINT
    if isinstance(exc, hf_errors.GatedRepoError):
        return HubError(f"{repo_id} is gated: accept its terms on the hub and set HF_TOKEN to a token with access")
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return HubError(f"no repo {repo_id} on {endpoint} (check the name; private repos need HF_TOKEN)")
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return HubError(f"{repo_id}: revision not found on {endpoint}")
    if isinstance(exc, (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled)):
        if constants.HF_HUB_OFFLINE:
            return HubError(
                f"{repo_id} is not in the cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE=1; unset it to download"
            )
        return HubError(
            f"cannot reach HF_ENDPOINT {endpoint}; check the network or set HF_HUB_OFFLINE=1 to use the cache"
        )
    if isinstance(exc, hf_errors.EntryNotFoundError):
        return HubError(f"{repo_id}: file not found on {endpoint}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return HubError(
            f"disk full while downloading {repo_id} into {constants.HF_HUB_CACHE}; "
            "free space or set HF_HOME to a bigger disk"
        )
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, (OSError, hf_errors.HfHubHTTPError)) or "connect" in type(exc).__name__.lower():
        return HubError(
            f"cannot reach HF_ENDPOINT {endpoint} ({type(exc).__name__}); "
            "check the network or set HF_HUB_OFFLINE=1 to use the cache"
        )
    return HubError(f"{repo_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
