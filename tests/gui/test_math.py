"""Math in replies: LaTeX typeset by ziamath and drawn as images, its source when it cannot
be parsed, code and prices left alone (issue 16); `$$…$$` on a line of its own, centred."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextDocument, QTextImageFormat
from PySide6.QtWidgets import QTextBrowser, QWidget
from pytestqt.qtbot import QtBot

from app.ui import markdown
from app.ui.chat_view import ChatView
from app.ui.formulas import image, typeset
from app.ui.message_view import MessageView
from tests.gui.harness import Harness


@pytest.mark.parametrize(
    ("text", "sources", "display"),
    [
        ("Euler: $e^{i\\pi}+1=0$.", ["e^{i\\pi}+1=0"], False),
        ("$$\n\\int_0^1 x\\,dx\n$$", ["\\int_0^1 x\\,dx"], True),
        ("Inline \\(x+1\\) too.", ["x+1"], False),
        ("\\[ y = mx + b \\]", ["y = mx + b"], True),
    ],
)
def test_each_delimiter_becomes_a_formula(qapp, text, sources, display) -> None:
    rendered = markdown.render(text, dark=False)
    assert [f.latex.strip() for f in rendered.formulas] == sources
    assert all(f.display == display for f in rendered.formulas)
    assert all(markdown.formula_name(f) in rendered.html for f in rendered.formulas)
    assert "$" not in rendered.html and "\\(" not in rendered.html


@pytest.mark.parametrize(
    "text",
    ["It costs $5 and $6.", "Was $7.50, now $5", "`$x$` in code", "```\n$$x$$\n```"],
)
def test_prices_and_code_are_not_math(qapp, text) -> None:
    rendered = markdown.render(text, dark=False)
    assert rendered.formulas == ()
    assert "$" in rendered.html


def test_a_formula_that_cannot_be_parsed_stays_as_its_source(qapp) -> None:
    rendered = markdown.render("Broken: $\\frac{a}{$ here", dark=False)
    assert rendered.formulas == () and "$\\frac{a}{$" in rendered.html
    assert typeset("\\frac{a}{", False, "#000000") is None


def test_the_drawn_formula_has_ink_in_the_themes_colour(qapp) -> None:
    formula = typeset("x^2 + y^2 = z^2", False, "#ff0000")
    drawn = image(formula, 2.0)
    assert drawn.width() == round(formula.width * 2) and drawn.devicePixelRatio() == 2.0
    inked = [
        drawn.pixelColor(x, y)
        for x in range(drawn.width())
        for y in range(drawn.height())
        if drawn.pixelColor(x, y).alpha() > 200
    ]
    assert inked and all(c.red() > 200 and c.green() < 60 for c in inked)


def test_a_reply_with_math_shows_the_rendered_form(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    qtbot.waitExposed(view)
    reply = "The area is $\\pi r^2$, and\n\n$$\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$$"
    view.set_messages(
        [MessageView("u1", "user", "Area? $\\pi r^2$"), MessageView("a1", "assistant", reply)]
    )
    texts = {
        w.property("messageId"): w.findChild(QTextBrowser, "messageText")
        for w in view.findChildren(QWidget, "message")
    }
    shown = texts["a1"].document()
    names = _images(shown)
    assert len(names) == 2
    for name in names:
        loaded = shown.resource(QTextDocument.ResourceType.ImageResource, QUrl(name))
        assert loaded is not None and not loaded.isNull()
    assert "$" not in texts["a1"].toPlainText()
    assert texts["u1"].toPlainText() == "Area? $\\pi r^2$"  # the user's text stays as typed
    assert _images(texts["u1"].document()) == []


def _images(document: QTextDocument) -> list[str]:
    names = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isImageFormat():
                names.append(QTextImageFormat(fmt).name())
            it += 1
        block = block.next()
    return names


def test_double_dollar_math_amid_a_paragraph_is_a_centred_line_of_its_own(
    harness: Harness,
) -> None:
    window = harness.start()
    store, conversation = window.store, window.conversation_id
    question = store.add_message(conversation, None, "user", "Sum of 1..n?")
    reply = "The sum is:\n$$\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$$\nfor every n."
    answer = store.add_message(conversation, question.id, "assistant", reply)
    harness.act(window.reload)
    widget = next(
        w for w in window.chat.findChildren(QWidget, "message") if w.message.id == answer.id
    )
    document = widget.findChild(QTextBrowser, "messageText").document()
    lines = []
    block = document.begin()
    while block.isValid():
        lines.append((block.text().strip(), block.blockFormat().alignment()))
        block = block.next()
    assert lines == [
        ("The sum is:", Qt.AlignmentFlag.AlignLeft),
        ("\ufffc", Qt.AlignmentFlag.AlignHCenter),  # the formula's image, alone and centred
        ("for every n.", Qt.AlignmentFlag.AlignLeft),
    ]
