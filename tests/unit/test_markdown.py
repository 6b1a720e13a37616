"""Markdown for chat bubbles: raw HTML stays text, code blocks stay exact and copyable."""

from __future__ import annotations

import pytest

from app.ui.markdown import render, split_reasoning


@pytest.mark.parametrize("dark", [False, True])
def test_raw_html_is_escaped_not_interpreted(dark: bool) -> None:
    out = render('Hi <script>alert(1)</script> <b onclick="x">bold</b>', dark=dark).html
    assert "<script>" not in out
    assert "<b onclick" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out


def test_code_block_is_extracted_exactly() -> None:
    code = 'def f(x):\n    return x < 1 and "<b>"\n\n\n# trailing comment'
    rendered = render(f"Look:\n\n```python\n{code}\n```\n\nDone.", dark=False)
    assert rendered.code_blocks == (code,)
    assert "&lt;b&gt;" in rendered.html  # the code's own markup is escaped in the view


def test_each_code_block_gets_a_copy_link_with_its_index() -> None:
    text = "```js\nlet a = 1;\n```\n\ntext\n\n```\nplain\n```\n\n    indented()\n"
    rendered = render(text, dark=True)
    assert rendered.code_blocks == ("let a = 1;", "plain", "indented()")
    for index in range(3):
        assert f'<a href="copy:{index}"' in rendered.html
    assert rendered.html.count(">Copy</a>") == 3


def test_language_comes_from_the_fence_and_is_highlighted() -> None:
    rendered = render("```python\ndef f():\n    return 1\n```", dark=False)
    assert ">python</td>" in rendered.html
    assert '<span style="color' in rendered.html  # pygments' inline styles
    assert "class=" not in rendered.html


def test_unknown_language_keeps_its_label_and_shows_plain_text() -> None:
    rendered = render("```notalanguage\nsome <text>\n```", dark=False)
    assert ">notalanguage</td>" in rendered.html
    assert "some &lt;text&gt;" in rendered.html


def test_unfenced_language_is_guessed_or_plain() -> None:
    short = render("```\nx\n```", dark=False)
    assert ">text</td>" in short.html
    guessed = render("```\n#!/usr/bin/env python3\nimport sys\nprint(sys.argv)\n```", dark=False)
    assert ">python" in guessed.html


def test_light_and_dark_use_different_highlighting() -> None:
    code = "```python\ndef f():\n    return 1\n```"
    assert render(code, dark=False).html != render(code, dark=True).html


def test_tables_and_strikethrough() -> None:
    out = render("| a | b |\n|---|--:|\n| 1 | 2 |\n\n~~gone~~", dark=False).html
    assert "<table" in out
    assert "<th" in out
    assert "<td" in out
    assert "text-align:right" in out
    assert "<s>gone</s>" in out


def test_only_web_links_become_anchors() -> None:
    out = render("[web](https://example.com) [bad](javascript:alert(1)) [c](copy:0)", dark=False)
    assert 'href="https://example.com"' in out.html
    assert 'href="copy:0"' not in out.html
    assert 'href="javascript' not in out.html


def test_images_become_links_never_fetched() -> None:
    out = render("![cat](https://example.com/cat.png) ![x](/etc/passwd)", dark=False).html
    assert "<img" not in out
    assert 'href="https://example.com/cat.png"' in out
    assert 'href="/etc/passwd"' not in out
    assert 'src="' not in out


def test_split_reasoning_complete_block() -> None:
    assert split_reasoning("<think>\nplan it\n</think>\n\nThe answer.") == (
        "plan it",
        "The answer.",
    )


def test_split_reasoning_unterminated_while_streaming() -> None:
    assert split_reasoning("<think>still thinking") == ("still thinking", "")
    assert split_reasoning("  <thi") == ("", "")


def test_split_reasoning_without_think() -> None:
    assert split_reasoning("Just an answer") == (None, "Just an answer")
    assert split_reasoning("") == (None, "")
    text = "Talking about <think> tags mid-text"
    assert split_reasoning(text) == (None, text)
