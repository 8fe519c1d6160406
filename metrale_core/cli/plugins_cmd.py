"""``met plugins``: what is installed and what each plugin provides.

Owner: the CLI (``metrale_core.cli.main`` wires it to the ``plugins`` sub-command); the HTTP
server may serve ``plugins_json`` as well.

Invariants:
- Both views list every plugin the registry knows, in load order (built-ins first), including
  failed, blocked and skipped ones, each with its distribution and version.
- ``plugins_json`` returns only JSON types (str, list, dict, None).
"""

from __future__ import annotations

from metrale_core.plugin.registry import PluginInfo, Registry

__all__ = ["format_plugins", "plugins_json"]

_STATUS_NOTE = {
    "loaded": "",
    "failed": "failed",
    "blocked": "blocked by METRALE_DISABLE_PLUGINS",
    "skipped": "not in METRALE_PLUGINS",
}


def plugins_json(reg: Registry) -> list[dict]:
    """One JSON object per plugin: name, distribution, version, status, hooks, components, error."""
    return [
        {
            "name": info.name,
            "distribution": info.distribution,
            "version": info.version,
            "status": info.status,
            "hooks": list(info.hooks),
            "components": {family: list(names) for family, names in info.components.items()},
            "error": info.error,
        }
        for info in reg.plugins
    ]


def _detail_lines(info: PluginInfo) -> list[str]:
    if info.error is not None:
        return [f"error: {info.error}"]
    if info.status != "loaded":
        return []
    if not info.components:
        return ["(registers no components)"]
    return [f"{family}: {', '.join(names)}" for family, names in info.components.items()]


def format_plugins(reg: Registry) -> str:
    """A table of installed plugins, with what each registers under it (or why it failed)."""
    if not reg.plugins:
        return "No Metrale plugins are installed."
    header = ("PLUGIN", "DISTRIBUTION", "VERSION", "STATUS")
    rows = [
        (info.name, info.distribution, info.version, _STATUS_NOTE.get(info.status, info.status) or "ok")
        for info in reg.plugins
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def line(row: tuple[str, ...]) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        return "  ".join(cells).rstrip()

    out = [f"{len(reg.plugins)} Metrale plugin(s):", "", line(header)]
    for info, row in zip(reg.plugins, rows):
        out.append(line(row))
        out += [f"    {detail}" for detail in _detail_lines(info)]
    return "\n".join(out)
