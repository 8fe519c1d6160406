"""Parse hookspec docstrings and render the hook reference (``docs/hooks.md``) from them.

Owner: ``metrale_core.plugin.hookspecs.render_reference`` and ``tests/plugin/test_hookspecs.py``.

Invariants:
- The docstring is the only copy of a hook's documentation; the Markdown is derived from it.
- A docstring is a one-line summary followed by the sections ``Called:``, ``Args:``, ``Returns:``,
  ``Flags:`` and ``Example:`` (in that order, each header alone on its line, bodies indented).
  ``Args:`` holds one ``name: text`` entry per argument of the spec.
- ``Flags:`` agrees with the marker options: it names ``firstresult`` / ``historic`` when those are
  set, and says ``plain hook`` when neither is.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from types import ModuleType

from attrs import frozen

__all__ = ["HookDoc", "doc_problems", "hookspecs_of", "parse_hookspec", "render_markdown"]

PROJECT = "metrale"
SECTIONS = ("Called", "Args", "Returns", "Flags", "Example")
_HEADER = re.compile(rf"^({'|'.join(SECTIONS)}):\s*$")
_ARG = re.compile(r"^(\w+):\s*(.*)$")


@frozen
class HookDoc:
    """The parsed documentation of one hookspec."""

    name: str
    argnames: tuple[str, ...]
    #: The first paragraph of the docstring, reflowed to one line.
    summary: str
    #: Section title -> body (dedented; prose reflowed except ``Example``).
    sections: dict[str, str]
    #: ``Args:`` entries, argument name -> text (reflowed).
    args: dict[str, str]
    #: The pluggy marker options (``firstresult``, ``historic``, ...).
    opts: dict


def hookspecs_of(module: ModuleType) -> list[Callable]:
    """The hookspec functions of ``module`` (marked ``metrale_spec``), in source order."""
    specs = [
        fn for name, fn in vars(module).items() if name.startswith(PROJECT + "_") and hasattr(fn, PROJECT + "_spec")
    ]
    return sorted(specs, key=lambda fn: fn.__code__.co_firstlineno)


def _reflow(lines: list[str]) -> str:
    return " ".join(line.strip() for line in lines if line.strip())


def parse_hookspec(fn: Callable) -> HookDoc:
    """Split ``fn``'s docstring into summary, sections and argument entries."""
    doc = inspect.getdoc(fn) or ""
    head: list[str] = []
    raw: dict[str, list[str]] = {}
    current: list[str] = head
    for line in doc.splitlines():
        match = _HEADER.match(line)
        if match:
            current = raw.setdefault(match.group(1), [])
        else:
            current.append(line)
    sections = {}
    for title, lines in raw.items():
        body = textwrap.dedent("\n".join(lines)).strip("\n")
        sections[title] = body if title == "Example" else _reflow(body.splitlines())
    args: dict[str, list[str]] = {}
    for line in textwrap.dedent("\n".join(raw.get("Args", []))).splitlines():
        match = _ARG.match(line)
        if match:
            args[match.group(1)] = [match.group(2)]
        elif args:
            args[list(args)[-1]].append(line)
    summary_lines = "\n".join(head).strip().split("\n\n")[0].splitlines()
    return HookDoc(
        name=fn.__name__,
        argnames=tuple(inspect.signature(fn).parameters),
        summary=_reflow(summary_lines),
        sections=sections,
        args={name: _reflow(lines) for name, lines in args.items()},
        opts=dict(getattr(fn, PROJECT + "_spec", {}) or {}),
    )


def doc_problems(fn: Callable) -> list[str]:
    """What is missing or wrong in ``fn``'s docstring (empty when it follows the structure)."""
    doc = parse_hookspec(fn)
    problems = []
    if not doc.summary:
        problems.append("no one-line summary")
    for title in SECTIONS:
        if not doc.sections.get(title):
            problems.append(f"no (or empty) '{title}:' section")
    for name in doc.argnames:
        if not doc.args.get(name):
            problems.append(f"argument {name!r} is not documented under 'Args:'")
    for name in set(doc.args) - set(doc.argnames):
        problems.append(f"'Args:' documents {name!r}, which is not an argument")
    flags = doc.sections.get("Flags", "").lower()
    for opt in ("firstresult", "historic"):
        if doc.opts.get(opt) and opt not in flags:
            problems.append(f"'Flags:' does not say {opt!r}, but the spec sets it")
    if not any(doc.opts.get(opt) for opt in ("firstresult", "historic")) and "plain" not in flags:
        problems.append("'Flags:' must say 'plain hook' for a spec without firstresult/historic")
    return [f"{doc.name}: {problem}" for problem in problems]


def _render_hook(doc: HookDoc) -> list[str]:
    out = [f"### `{doc.name}({', '.join(doc.argnames)})`", "", doc.summary, ""]
    out += [f"**Called:** {doc.sections['Called']}", "", "**Arguments:**", ""]
    out += [f"- `{name}`: {doc.args[name]}" for name in doc.argnames]
    out += ["", f"**Returns:** {doc.sections['Returns']}", ""]
    out += [f"**Flags:** {doc.sections['Flags']}", "", "**Example:**", "", "```python"]
    out += [doc.sections["Example"], "```", ""]
    return out


def render_markdown(module: ModuleType, groups) -> str:
    """Render every hookspec of ``module`` under the ``groups`` (title, intro, names) it belongs to.

    Raises ``ValueError`` when a spec's docstring breaks the structure or a spec is in no group
    (or a group names a hook that does not exist), so the reference can never silently omit one.
    """
    specs = {fn.__name__: fn for fn in hookspecs_of(module)}
    problems = [problem for fn in specs.values() for problem in doc_problems(fn)]
    grouped = [name for _, _, names in groups for name in names]
    problems += [f"{name}: in no group of GROUPS" for name in specs if name not in grouped]
    problems += [f"{name}: listed in GROUPS but not a hookspec" for name in grouped if name not in specs]
    if problems:
        raise ValueError("hookspec documentation is incomplete:\n  " + "\n  ".join(problems))
    out = [
        "# Metrale hook reference",
        "",
        f"<!-- Generated from the docstrings in {module.__name__}; do not edit by hand. -->",
        f"<!-- Regenerate: python -m {module.__name__} > docs/hooks.md -->",
        "",
        "A plugin is a module named by an entry point in the `metrale` group "
        '(`[project.entry-points.metrale] myname = "metrale_myname"`) whose functions are '
        "marked with `@metrale_core.hookimpl` and named after the hooks below. An "
        "implementation may accept fewer arguments than the spec. Hook names are checked at "
        "startup: a misspelled hook is an error.",
        "",
    ]
    for title, intro, names in groups:
        out += [f"## {title}", "", intro, ""]
        for name in names:
            out += _render_hook(parse_hookspec(specs[name]))
    return "\n".join(out).rstrip("\n") + "\n"
