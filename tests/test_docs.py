"""Docs and tests cover every hook (the datasette rule), and the docs name real code.

- Every hookspec has its entry in ``docs/hooks.md`` (heading with the exact signature) and a
  ``test_hook_<name>`` somewhere in the test suites (tests/, plugins/*/tests, contrib/*/tests).
- The user, plugin and architecture guides exist, link the hook reference, and every
  ``metrale_core.x.y`` module they name exists.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from metrale_core.plugin import hookspecs
from metrale_core.plugin.hookdoc import hookspecs_of

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOKS = [fn.__name__ for fn in hookspecs_of(hookspecs)]
SIGNATURES = {fn.__name__: tuple(inspect.signature(fn).parameters) for fn in hookspecs_of(hookspecs)}
GUIDES = ("user-guide.md", "plugin-guide.md", "architecture.md")


def _test_files() -> list[Path]:
    roots = [ROOT / "tests", *ROOT.glob("plugins/*/tests"), *ROOT.glob("contrib/*/tests")]
    return [p for root in roots for p in root.rglob("test_*.py")]


def _hook_tests() -> set[str]:
    found = set()
    for path in _test_files():
        found.update(
            re.findall(r"^\s*(?:async\s+)?def test_hook_(metrale_\w+)\(", path.read_text(encoding="utf-8"), re.M)
        )
    return found


HOOK_TESTS = _hook_tests()


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook):
    heading = f"### `{hook}({', '.join(SIGNATURES[hook])})`"
    assert heading in (DOCS / "hooks.md").read_text(encoding="utf-8"), (
        f"docs/hooks.md has no entry {heading}; regenerate it with "
        "`python -m metrale_core.plugin.hookspecs > docs/hooks.md`"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    assert hook in HOOK_TESTS, (
        f"no test exercises {hook}: add `def test_hook_{hook}()` (see tests/plugin/test_hooks.py) that "
        "registers a plugin implementing it and asserts what changes"
    )


def _resolves(dotted: str) -> bool:
    """``a.b.C`` names a module, or an attribute chain of the longest importable module prefix."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("guide", GUIDES)
def test_guides_link_the_hook_reference_and_name_real_code(guide):
    text = (DOCS / guide).read_text(encoding="utf-8")
    assert "hooks.md" in text
    names = set(re.findall(r"\bmetrale_core(?:\.[A-Za-z_]\w*)+", text))
    assert names, f"{guide} names no metrale_core code"
    missing = sorted(name for name in names if not _resolves(name))
    assert missing == [], f"{guide} names code that does not exist: {missing}"


def test_plugin_guide_tutorial_matches_the_contrib_plugin():
    """The tutorial's code blocks are the contrib plugin's code, so they cannot rot."""
    text = (DOCS / "plugin-guide.md").read_text(encoding="utf-8")
    plugin = ROOT / "contrib" / "metrale-slai"
    for name in ("metrale_slai/__init__.py", "metrale_slai/policy.py", "pyproject.toml"):
        source = (plugin / name).read_text(encoding="utf-8")
        for block in re.findall(rf"<!-- from {re.escape(name)} -->\n```\w*\n(.*?)```", text, re.S):
            assert block in source, f"a block of docs/plugin-guide.md is no longer in {name}"
    assert text.count("<!-- from ") >= 4


def test_plugin_guide_blocks_quoted_from_the_tree_are_still_there():
    """Blocks marked ``<!-- from plugins/... -->`` (the decoder-definition example) are that file's code."""
    text = (DOCS / "plugin-guide.md").read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- from ((?:plugins|contrib)/[^ ]+) -->\n```\w*\n(.*?)```", text, re.S)
    assert any(path.endswith("metrale_qwen3/olmo2.py") for path, _ in blocks)
    for path, block in blocks:
        assert block in (ROOT / path).read_text(encoding="utf-8"), (
            f"a block of docs/plugin-guide.md is no longer in {path}"
        )
