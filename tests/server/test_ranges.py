"""``ranges``: one table of bounds for the check and the document; ``check_ranges`` names every
offending field of a record, decoded or built by a translation."""

from __future__ import annotations

import pytest

from metrale_core.server.errors import APIError
from metrale_core.server.ranges import BOUNDS, Bound, check_ranges
from metrale_core.server.schemas import ChatCompletionRequest, ChatMessage

ASK = [ChatMessage(role="user", content="hi")]


def test_a_built_record_is_checked_field_by_field():
    req = ChatCompletionRequest(messages=ASK, temperature=2.5, n=0, stop=["s"] * 17)
    with pytest.raises(APIError) as info:
        check_ranges(req)
    message = info.value.message
    assert info.value.param == "n"  # the first offending field, in the record's order
    assert "temperature: must be between 0 and 2, got 2.5" in message
    assert "n: must be between 1 and 128, got 0" in message
    assert "stop: at most 16 stop strings, got 17" in message


def test_edges_of_open_and_closed_bounds():
    check_ranges(ChatCompletionRequest(messages=ASK, temperature=2.0, top_p=1.0, seed=(1 << 64) - 1))
    for field, value in (("top_p", 0.0), ("seed", 1 << 64), ("max_tokens", 0)):
        with pytest.raises(APIError) as info:
            check_ranges(ChatCompletionRequest(messages=ASK, **{field: value}))
        assert info.value.param == field


def test_logit_bias_keys_and_values():
    with pytest.raises(APIError) as info:
        check_ranges(ChatCompletionRequest(messages=ASK, logit_bias={"x": 1.0, "7": 101.0}))
    assert "logit_bias.x: keys must be token ids" in info.value.message
    assert "logit_bias.7: must be between -100 and 100, got 101.0" in info.value.message


def test_bounds_as_json_schema():
    assert Bound(0, 1, low_open=True).json_schema() == {"exclusiveMinimum": 0, "maximum": 1}
    assert BOUNDS["seed"].json_schema() == {"minimum": -(1 << 63), "exclusiveMaximum": 1 << 64}
    assert Bound(1, None).json_schema() == {"minimum": 1}
