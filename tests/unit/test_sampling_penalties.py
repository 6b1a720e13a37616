"""The server's checks of the sampling fields it now honours (penalties, logit_bias) and of
those it refuses (best_of > 1, suffix): ranges in words, values carried into SamplingParams."""

from __future__ import annotations

import pytest

from app.server.schema import ApiError, parse_chat, parse_completion

CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def test_penalties_and_logit_bias_reach_the_sampling_params() -> None:
    sampling = parse_chat(
        {
            **CHAT,
            "presence_penalty": 1.5,
            "frequency_penalty": -0.5,
            "repeat_penalty": 1.1,
            "logit_bias": {"7": -100, "3": 2.5},
        }
    ).params.sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (1.5, -0.5)
    assert sampling.repeat_penalty == 1.1
    assert sampling.logit_bias == ((3, 2.5), (7, -100.0))
    by_text = parse_chat({**CHAT, "logit_bias": [["hello", 1], [5, False]]}).params
    assert by_text.text_bias == (("hello", 1.0),) and by_text.sampling.logit_bias == ((5, -100.0),)
    defaults = parse_chat(CHAT).params.sampling
    assert (defaults.presence_penalty, defaults.frequency_penalty) == (0.0, 0.0)
    assert defaults.repeat_penalty == 1.0 and defaults.logit_bias == ()


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"presence_penalty": 5}, "presence_penalty", "-2 to 2"),
        ({"frequency_penalty": "high"}, "frequency_penalty", "-2 to 2"),
        ({"repeat_penalty": 0}, "repeat_penalty", "0.1 to 2"),
        ({"logit_bias": {"1": 101}}, "logit_bias", "-100 to 100"),
        ({"logit_bias": {"1": True}}, "logit_bias", "-100 to 100"),
        ({"logit_bias": {"": 1}}, "logit_bias", "token ids (like 42) or non-empty text"),
        ({"logit_bias": [[-1, 1]]}, "logit_bias", "token ids (like 42) or non-empty text"),
        ({"logit_bias": [[1]]}, "logit_bias", "[token id or text, bias] pairs"),
        ({"logit_bias": "x"}, "logit_bias", "object"),
        ({"logit_bias": {str(i): 1 for i in range(2000)}}, "logit_bias", "1,024"),
        ({"best_of": 3}, "best_of", "best_of"),
    ],
)
def test_out_of_range_fields_are_refused_in_words(fields: dict, param: str, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat({**CHAT, **fields})
    assert caught.value.status == 400 and caught.value.param == param
    assert words in caught.value.message


def test_suffix_is_refused_and_best_of_one_accepted() -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion({"model": "m", "prompt": "a", "suffix": "b"})
    assert caught.value.param == "suffix"
    parsed = parse_completion({"model": "m", "prompt": "a", "suffix": "", "best_of": 1})
    assert parsed.prompt == "a"
