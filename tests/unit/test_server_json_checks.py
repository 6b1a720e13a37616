"""check_json: what json.loads takes but the server cannot use is refused in words, naming
the field: nesting deeper than any request needs, and lone UTF-16 surrogates."""

from __future__ import annotations

import json

import pytest

from app.server.schema import MAX_JSON_DEPTH, ApiError, check_json


def _nested(levels: int) -> dict:
    body: dict = {"model": "m"}
    inner: list = []
    body["x"] = inner
    for _ in range(levels - 2):
        inner.append([])
        inner = inner[0]
    return body


def test_depth_is_limited_without_recursion() -> None:
    check_json(_nested(MAX_JSON_DEPTH))
    with pytest.raises(ApiError, match="nested too deeply") as caught:
        check_json(_nested(MAX_JSON_DEPTH + 1))
    assert caught.value.status == 400
    with pytest.raises(ApiError, match="nested too deeply"):
        check_json(_nested(200_000))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        ('{"stop": ["ok", "\\udfff"]}', "stop[1]"),
        ('{"metadata": {"\\ud800": 1}}', "metadata"),
        ('{"\\ud800": 1}', "the request body"),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(body: str, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        check_json(json.loads(body))
    assert caught.value.status == 400 and caught.value.param == param
    assert "surrogate" in caught.value.message


def test_paired_surrogates_and_long_token_lists_pass() -> None:
    check_json(json.loads('{"prompt": "\\ud83d\\ude00", "ids": ' + str(list(range(10**5))) + "}"))
