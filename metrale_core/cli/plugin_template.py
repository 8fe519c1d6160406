"""``met plugins new NAME``: render the plugin template into a new distribution folder.

Owner: the CLI (``metrale_core.cli.main`` wires it to ``met plugins new``); the template files
are package data in ``metrale_core/templates/plugin/`` (``*.jinja``; a path part ``__module__``
becomes the plugin's module name).

Invariants:
- NAME is validated once (lowercase letters, digits and dashes, starting with a letter); the
  distribution is ``metrale-NAME``, the module ``metrale_NAME`` (dashes to underscores), the
  entry point and the component name are NAME.
- Nothing is overwritten: an existing target folder is a ``ConfigError``.
- Rendering is strict: an undefined template variable is an error, never an empty string.
"""

from __future__ import annotations

import re
from pathlib import Path

from attrs import frozen

from metrale_core.errors import ConfigError

__all__ = ["TEMPLATE_DIR", "PluginNames", "render_plugin"]

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates" / "plugin"
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


@frozen
class PluginNames:
    """Every spelling of one plugin's name the template uses."""

    name: str

    @classmethod
    def parse(cls, text: str) -> PluginNames:
        name = text.strip().lower().removeprefix("metrale-")
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"plugin name {text!r} must be lowercase letters, digits and single "
                "dashes, starting with a letter (e.g. 'top-a' or 'metrale-top-a')"
            )
        return cls(name)

    @property
    def dist(self) -> str:
        return f"metrale-{self.name}"

    @property
    def module(self) -> str:
        return f"metrale_{self.name.replace('-', '_')}"

    @property
    def option(self) -> str:
        return f"{self.name.replace('-', '_')}_ban_ids"


def render_plugin(name: str, directory: Path | str = ".") -> Path:
    """Write the template for plugin ``name`` into ``directory/metrale-NAME``; returns that path."""
    import jinja2

    from metrale_core import __version__

    names = PluginNames.parse(name)
    target = Path(directory).expanduser() / names.dist
    if target.exists():
        raise ConfigError(f"{target} already exists; choose another --dir or remove it")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    major, minor = (int(part) for part in __version__.split(".")[:2])
    values = dict(
        name=names.name,
        dist=names.dist,
        module=names.module,
        option=names.option,
        core_version=f"{major}.{minor}",
        core_next_minor=f"{major}.{minor + 1}",
    )
    sources = sorted(p for p in TEMPLATE_DIR.rglob("*.jinja") if p.is_file())
    if not sources:
        raise ConfigError(f"the plugin template is missing from {TEMPLATE_DIR}; reinstall metrale-core")
    for source in sources:
        relative = source.relative_to(TEMPLATE_DIR).with_suffix("")
        out = target / str(relative).replace("__module__", names.module)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(env.from_string(source.read_text(encoding="utf-8")).render(**values), encoding="utf-8")
    return target
