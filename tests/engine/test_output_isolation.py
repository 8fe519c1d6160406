"""OutputProcessor: a failure caused by one request's parameters fails only that request.

A ``logit_bias`` naming a token outside the vocabulary (which the server refuses at the edge,
but a direct engine user can still send) raises inside the logit pipeline; before per-row
isolation it failed the whole step through ``fail_in_flight`` (every sequence of the batch
finished with "error").
"""

from __future__ import annotations

from metrale_core.sampling import SamplingParams


def test_bad_bias_fails_only_its_own_request(make_engine, tokens, run):
    prompt = [3, 4, 5, 6]
    solo = make_engine()
    solo.add_request("good", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    expected = tokens(run(solo)["good"])
    assert len(expected) == 6

    engine = make_engine()
    engine.add_request("good", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request("bad", [1, 2], SamplingParams(temperature=0.0, max_tokens=6, logit_bias={10**8: 1.0}))
    engine.add_request("good2", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    outs = run(engine)  # the step itself must not raise
    bad = outs["bad"][-1]
    assert bad.finished and bad.finish_reason == "error"
    assert "logit_bias" in bad.error and "vocabulary" in bad.error
    for name in ("good", "good2"):
        assert outs[name][-1].finish_reason == "length"
        assert tokens(outs[name]) == expected
    assert not engine.scheduler.running
