"""The context meter beside the composer: how much of the model's context the next turn fills.

It shows the count the background prefill already made (history, attached files and the
draft through its last complete word, app/engine/prewarm.py `on_count`), so typing never
tokenizes twice on the UI thread. Past WARN_SHARE it turns to the warning colour and says
why in its tooltip; a message that would not fit says so before it is sent.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget

WARN_SHARE = 0.85  # past this share of the context the meter warns


class ContextMeter(QLabel):
    """'1,234 / 8,192 tokens', coloured by how full the context is (level: ok, warn, full)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("", parent)
        self.setObjectName("context-meter")
        self.setAccessibleName("Context used")
        self.tokens = 0
        self.n_ctx = 0
        self.level = ""
        self.set_counts(0, 0)

    def set_counts(self, tokens: int, n_ctx: int) -> None:
        """Show `tokens` of `n_ctx` (0: no model loaded yet, nothing to show)."""
        self.tokens, self.n_ctx = tokens, n_ctx
        if n_ctx <= 0:
            self._show("", "ok", "")
            return
        text = f"{tokens:,} / {n_ctx:,} tokens"
        share = tokens / n_ctx
        if tokens >= n_ctx:
            self._show(
                f"{text} · too long",
                "full",
                f"This message would not fit: the conversation and the draft are {tokens:,} "
                f"tokens but the context holds {n_ctx:,}. Shorten the message, remove an "
                "attachment, or start a new conversation.",
            )
        elif share > WARN_SHARE:
            self._show(
                text,
                "warn",
                f"The context is {share:.0%} full: {n_ctx - tokens:,} tokens are left for "
                "this message and the reply. Older turns will have to be left out soon.",
            )
        else:
            self._show(
                text,
                "ok",
                "Tokens of the conversation, the attached files and the draft, out of the "
                "model's context",
            )

    def _show(self, text: str, level: str, tip: str) -> None:
        self.setText(text)
        self.setToolTip(tip)
        if level != self.level:
            self.level = level
            self.setProperty("level", level)
            self.style().unpolish(self)  # the style sheet picks the colour by level
            self.style().polish(self)
