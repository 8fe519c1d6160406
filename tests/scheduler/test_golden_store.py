"""Golden files and the pytest plugin's ``golden`` fixture / ``--update-goldens`` option."""

from __future__ import annotations

import pytest

from metrale_core.testing import GoldenMismatch, GoldenStore

pytest_plugins = ["pytester"]


def test_golden_store_compares_writes_and_diffs(tmp_path):
    store = GoldenStore(tmp_path)
    with pytest.raises(GoldenMismatch, match="does not exist; run pytest with --update-goldens"):
        store("demo", "a\nb\n")
    GoldenStore(tmp_path, update=True)("demo", "a\nb")
    assert (tmp_path / "demo.trace").read_text() == "a\nb\n"
    store("demo", "a\nb\n")  # equal after newline normalisation
    with pytest.raises(GoldenMismatch) as info:
        store("demo", "a\nc\n")
    assert "-b\n+c" in str(info.value) and "demo.trace" in str(info.value)
    with pytest.raises(ValueError, match="golden name"):
        store("../escape", "x")


def test_plugin_fixture_and_update_option(pytester):
    pytester.makepyfile(
        test_g="""
        def test_trace(golden, fake_clock, recording_model_factory):
            fake_clock.advance(1.5)
            model = recording_model_factory([])
            golden("demo", f"clock={fake_clock()} vocab={model.info.vocab_size}")
    """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)
    pytester.runpytest("-p", "no:cacheprovider", "--update-goldens").assert_outcomes(passed=1)
    assert (pytester.path / "tests" / "golden" / "demo.trace").read_text() == "clock=1.5 vocab=64\n"
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_tiny_engine_fixture_uses_the_fake_clock(tiny_engine, recording_model_factory, fake_clock):
    from metrale_core.sampling.params import SamplingParams
    from metrale_core.testing import SeqScript

    model = recording_model_factory([SeqScript([10, 11], [40, 41, 42]), SeqScript([20], [50, 51])])
    engine = tiny_engine(model, max_num_seqs=4)
    greedy = SamplingParams(temperature=0.0)
    engine.add_request("a", [10, 11], greedy, timeout_s=1.0)
    engine.add_request("b", [20], greedy)
    streams: dict[str, list] = {"a": [], "b": []}
    reasons = {}
    for _ in range(10):
        if not engine.has_unfinished():
            break
        if len(streams["a"]) == 2:
            fake_clock.advance(1.0)
        for out in engine.step():
            streams[out.request_id].extend(out.new_token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert streams == {"a": [40, 41], "b": [50, 51, 2]}
    assert reasons == {"a": "timeout", "b": "stop"}
    assert model.errors == [] and model.lines[0] == "forward #0: s10@0+2 fresh -> 40 | s20@0+1 fresh -> 50"
