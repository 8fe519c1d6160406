"""The hookspecs are a documented contract: every spec is documented, and docs/hooks.md matches."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

from metrale_core.plugin import hookspecs, plain_hookspec
from metrale_core.plugin.hookdoc import doc_problems, hookspecs_of, parse_hookspec, render_markdown
from metrale_core.plugin.hookspecs import hookspec
from metrale_core.plugin.registry import FAMILIES

HOOKS_MD = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"
SPECS = hookspecs_of(hookspecs)

#: The hooks the design promises (DESIGN.md "Hookspecs", /tmp/apis.md): name -> arguments.
PROMISED = {
    "metrale_model_loaders": ("register",),
    "metrale_kv_scale_sources": ("register",),
    "metrale_logit_processors": ("register",),
    "metrale_samplers": ("register",),
    "metrale_schedulers": ("register",),
    "metrale_speculative_proposers": ("register",),
    "metrale_tool_call_parsers": ("register",),
    "metrale_executors": ("register",),
    "metrale_engine_flags": ("parser",),
}


def test_every_promised_hook_has_a_spec_with_its_arguments():
    found = {fn.__name__: tuple(inspect.signature(fn).parameters) for fn in SPECS}
    for name, args in PROMISED.items():
        assert found.get(name) == args, f"hookspec {name}{args} is missing or has other arguments"


def test_every_registration_family_has_a_spec():
    for family, (hook, _spec_type) in FAMILIES.items():
        assert hasattr(hookspecs, hook), f"family {family} is collected through {hook}, which has no spec"


@pytest.mark.parametrize("spec", SPECS, ids=lambda fn: fn.__name__)
def test_hookspec_is_documented(spec):
    doc = inspect.getdoc(spec)
    assert doc, f"{spec.__name__} has no docstring"
    assert "Called:" in doc and "Returns:" in doc and "Flags:" in doc
    for arg in inspect.signature(spec).parameters:
        assert arg in doc, f"{spec.__name__}'s docstring does not mention its argument {arg!r}"
    assert doc_problems(spec) == []


def test_doc_checker_catches_incomplete_docstrings():
    @hookspec(firstresult=True)
    def metrale_bad(engine, request):
        """Do something.

        Called:
            sometimes.

        Args:
            engine: the engine.

        Flags:
            none worth mentioning.
        """

    problems = doc_problems(metrale_bad)
    assert "metrale_bad: argument 'request' is not documented under 'Args:'" in problems
    assert "metrale_bad: no (or empty) 'Returns:' section" in problems
    assert "metrale_bad: no (or empty) 'Example:' section" in problems
    assert "metrale_bad: 'Flags:' does not say 'firstresult', but the spec sets it" in problems
    assert parse_hookspec(metrale_bad).args == {"engine": "the engine."}


def test_render_refuses_a_spec_outside_every_group():
    module = types.ModuleType("fake_specs")
    module.metrale_samplers = hookspecs.metrale_samplers
    module.metrale_schedulers = hookspecs.metrale_schedulers
    groups = (("Registration", "intro", ("metrale_samplers",)),)
    with pytest.raises(ValueError, match="metrale_schedulers: in no group"):
        render_markdown(module, groups)


def test_reference_renders_every_hook_with_its_signature():
    text = hookspecs.render_reference()
    for fn in SPECS:
        doc = parse_hookspec(fn)
        assert f"### `{doc.name}({', '.join(doc.argnames)})`" in text
        assert doc.summary in text


def test_docs_hooks_md_is_generated_from_the_docstrings():
    expected = hookspecs.render_reference()
    actual = HOOKS_MD.read_text(encoding="utf-8") if HOOKS_MD.exists() else ""
    assert actual == expected, (
        "docs/hooks.md is out of date with metrale_core/plugin/hookspecs.py; regenerate it with "
        "`python -m metrale_core.plugin.hookspecs > docs/hooks.md`"
    )


def test_module_entry_point_prints_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "metrale_core.plugin.hookspecs"], capture_output=True, text=True, check=True
    ).stdout
    assert out == hookspecs.render_reference()


def test_importing_hookspecs_stays_light():
    code = "import sys, metrale_core.plugin.hookspecs; print(sorted({'torch', 'cupy', 'litestar'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_hookspec_is_typed_with_real_types():
    """Each argument and the return of every spec is annotated, and the annotations (imported
    under ``TYPE_CHECKING`` in hookspecs.py) resolve to the real classes."""
    import argparse
    import typing

    from prometheus_client.metrics_core import Metric

    from metrale_core.engine import LLMEngine
    from metrale_core.plugin import components

    names = {"argparse": argparse, "Metric": Metric, **vars(components)}
    for _title, _intro, hooks in hookspecs.GROUPS:
        for hook in hooks:
            fn = getattr(hookspecs, hook)
            hints = typing.get_type_hints(fn, localns=names)
            assert set(hints) == {*inspect.signature(fn).parameters, "return"}, hook
    started = typing.get_type_hints(hookspecs.metrale_engine_started, localns=names)
    # the engine hooks take the engine through a protocol (hookspecs must not import the engine:
    # an import circle), whose every member the real engine has
    assert started["engine"] is hookspecs.EngineHandle
    members = {n for n in vars(hookspecs.EngineHandle) if not n.startswith("_")} | set(
        hookspecs.EngineHandle.__annotations__
    )
    assert members == {"config", "stats"}
    assert callable(LLMEngine.stats) and "config" in inspect.signature(LLMEngine.__init__).parameters
    loaders = typing.get_type_hints(hookspecs.metrale_model_loaders, localns=names)
    assert typing.get_args(loaders["register"]) == ([components.ModelLoaderSpec], None)


def test_plain_hookspec_writes_the_returns_and_flags_sections():
    @plain_hookspec("Register through ``register``.")
    def metrale_plain(register):
        """Register things.

        Called:
            once.

        Args:
            register: the callback.

        Example:
            @hookimpl
            def metrale_plain(register): ...
        """

    doc = parse_hookspec(metrale_plain)
    assert doc.sections["Returns"] == "Nothing; the return value is ignored. Register through ``register``."
    assert doc.sections["Flags"].startswith("plain hook (not firstresult, not historic)")
    assert doc.sections["Example"].startswith("@hookimpl")
    assert doc.opts == {"firstresult": False, "historic": False, "warn_on_impl": None, "warn_on_impl_args": None}
    assert doc_problems(metrale_plain) == []


def test_plain_hookspec_refuses_a_docstring_that_writes_its_sections():
    with pytest.raises(ValueError, match="metrale_own"):

        @plain_hookspec()
        def metrale_own(register):
            """Register things.

            Returns:
                Something.

            Example:
                pass
            """
