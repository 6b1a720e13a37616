"""A message's text on screen: Markdown (or plain text) exactly as tall as its content.

The conversation scrolls, never a bubble: the browser's height follows its document, wheel
events go to the conversation, and only web links leave the app (copy:N anchors copy a code
block, and the link reads "Copied" for a moment; formulas are this message's own images,
nothing else is ever loaded).
"""

from __future__ import annotations

import math

from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QImage, QTextCursor, QWheelEvent
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from app.ui import formulas, markdown

COPIED_MS = 1500  # how long a code block's link reads "Copied"


class MessageText(QTextBrowser):
    """Markdown exactly as tall as its content: the conversation scrolls, never a bubble."""

    copy_requested = Signal(str)

    def __init__(self, name: str, accessible_name: str, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self.setAccessibleName(accessible_name)
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        font = self.font()
        font.setPointSizeF(font.pointSizeF() + 1)  # prose reads better a step above UI text
        self.setFont(font)
        self.document().setDocumentMargin(0)
        self.document().setIndentWidth(18)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.anchorClicked.connect(self._anchor_clicked)
        self.code_blocks: tuple[str, ...] = ()
        self._formulas: dict[str, QImage] = {}  # math:… image name -> the drawn formula
        self._natural_width = 0
        self._fit_max = 0

    def fit_content_width(self, max_width: int) -> None:
        """Hug the text (user bubbles) instead of filling the column."""
        self._fit_max = max_width
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)

    def show_markdown(self, text: str, *, dark: bool) -> None:
        self._show(markdown.render(text, dark=dark))

    def show_plain(self, text: str) -> None:
        self._show(markdown.render_plain(text))

    def _show(self, rendered: markdown.RenderedMarkdown) -> None:
        self.code_blocks = rendered.code_blocks
        scale = self.devicePixelRatioF()
        self._formulas = {
            markdown.formula_name(f): formulas.image(f, scale) for f in rendered.formulas
        }
        self.setHtml(rendered.html)
        if self._fit_max:
            probe = self.document().clone(self)
            probe.setTextWidth(self._fit_max)
            self._natural_width = min(self._fit_max, math.ceil(probe.idealWidth()) + 2)
            probe.deleteLater()
            self.updateGeometry()

    def sizeHint(self) -> QSize:
        return QSize(self._natural_width or super().sizeHint().width(), self.height())

    def minimumSizeHint(self) -> QSize:
        return QSize(48, self.height())

    def loadResource(self, kind: int, url: QUrl) -> object:
        """Formulas come from this message's own images; nothing else is ever loaded."""
        return self._formulas.get(url.toString())

    def _anchor_clicked(self, url: QUrl) -> None:
        """copy:N copies a code block; only web links leave the app, nothing else opens."""
        if url.scheme() == "copy":
            index = int(url.path()) if url.path().isdigit() else -1
            if 0 <= index < len(self.code_blocks):
                self.copy_requested.emit(self.code_blocks[index])
                href = url.toString()
                if self._relabel(href, "Copied"):
                    QTimer.singleShot(COPIED_MS, self, lambda: self._relabel(href, "Copy"))
        elif url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)

    def _relabel(self, href: str, text: str) -> bool:
        """The words of the link to `href`, in its own format; False when it is gone (the
        message was shown again meanwhile)."""
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.charFormat().anchorHref() == href:
                    cursor = QTextCursor(self.document())
                    cursor.setPosition(fragment.position())
                    cursor.setPosition(
                        fragment.position() + fragment.length(), QTextCursor.MoveMode.KeepAnchor
                    )
                    cursor.insertText(text, fragment.charFormat())
                    return True
                it += 1
            block = block.next()
        return False

    def wheelEvent(self, event: QWheelEvent) -> None:
        event.ignore()  # let the conversation scroll; this widget never has anything to scroll

    def _fit_height(self) -> None:
        height = math.ceil(self.document().size().height())
        if height != self.height():
            self.setFixedHeight(height)
