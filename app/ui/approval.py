"""The approval prompt: before a tool runs, the person reads which server's tool is called
with which arguments, and answers Allow once, Always allow, or Deny (with a reason the model
reads).

`ask` is what app/tool_loop's McpRunner awaits. It never answers for the person: closing the
prompt (Esc, the window's close button) is a denial without a reason, and when the call is
cancelled (Stop) while the prompt is open, the prompt closes with it.
"""

from __future__ import annotations

import asyncio

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.conversations.tool_records import pretty_arguments
from app.tool_loop import CallRequest, Decision
from app.ui.fit import fit_to_screen


class ApprovalDialog(QDialog):
    """One call waiting for the person: its server, tool and arguments, and the three answers."""

    def __init__(self, request: CallRequest, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Allow this tool call?")
        self.setObjectName("tool-approval")
        self.request = request
        self.decision = Decision(allow=False)  # what closing the prompt means
        what = QLabel(
            f"The model wants to run <b>{_escaped(request.tool)}</b> of the MCP server "
            f"<b>{_escaped(request.server)}</b> with these arguments:",
            self,
        )
        what.setWordWrap(True)
        self.arguments = QPlainTextEdit(pretty_arguments(request.call.arguments), self)
        self.arguments.setReadOnly(True)
        self.arguments.setAccessibleName("Arguments of the call")
        self.reason = QLineEdit(self)
        self.reason.setAccessibleName("Reason for denying")
        self.reason.setPlaceholderText("Reason if you deny it (optional; the model reads it)")
        buttons = QDialogButtonBox(self)
        self.allow_once = self._button(buttons, "Allow once", Decision(allow=True))
        self.always = self._button(buttons, "Always allow", Decision(allow=True, always=True))
        self.deny = self._button(buttons, "Deny", None)
        self.allow_once.setDefault(True)
        self.always.setToolTip(
            f"Run {request.tool} of {request.server} from now on without asking "
            "(Settings > Tools asks again)"
        )
        layout = QVBoxLayout(self)
        layout.addWidget(what)
        layout.addWidget(self.arguments, 1)
        layout.addWidget(self.reason)
        layout.addWidget(buttons)
        self.resize(480, 300)
        fit_to_screen(self)

    def _button(
        self, buttons: QDialogButtonBox, text: str, decision: Decision | None
    ) -> QPushButton:
        button = buttons.addButton(text, QDialogButtonBox.ButtonRole.ActionRole)
        button.setAutoDefault(False)
        button.clicked.connect(lambda: self._decide(decision))
        return button

    def _decide(self, decision: Decision | None) -> None:
        self.decision = decision or Decision(allow=False, reason=self.reason.text().strip())
        self.accept()


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def ask(request: CallRequest, parent: QWidget | None) -> Decision:
    """The person's answer to `request`, from a prompt over `parent`; cancelled with the call."""
    dialog = ApprovalDialog(request, parent)
    answered = asyncio.get_running_loop().create_future()
    dialog.finished.connect(lambda _code: answered.done() or answered.set_result(dialog.decision))
    dialog.open()
    try:
        return await answered
    finally:
        dialog.finished.disconnect()
        dialog.close()
        dialog.deleteLater()
