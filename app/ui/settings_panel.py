"""Per-conversation settings: the system prompt, how replies are sampled, and whether the
chat may call tools (the MCP servers of Settings > Tools; off is `mcp_servers: []`, on removes
the key, so every server turned on there is offered: app/ui/chat_tools.py).

Edits are saved as they are made (after a short pause), so there is no Apply button to
forget. Only the settings the user touches are written into the conversation's sampling
dict; the others, including keys this panel does not know, stay as they were, and a setting
never written follows the engine's default.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRegularExpression, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QPalette, QRegularExpressionValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.conversations import ConversationStore, StoreError
from app.engine.protocol import SamplingParams
from app.session import DEFAULT_MAX_TOKENS
from app.ui import theme
from app.ui.chat_tools import SERVERS_KEY
from app.ui.preset_picker import PresetPicker

SAVE_DEBOUNCE_MS = 300
MAX_TOKENS_LIMIT = 1_048_576
_DEFAULTS = SamplingParams()
# What Reset removes: every sampling key Stoke knows, so each follows the default again.
SAMPLING_KEYS = ("temperature", "top_p", "min_p", "top_k", "seed", "max_tokens", "reasoning")
_SEED_DIGITS = 9  # every 9-digit number fits the engines' 32-bit seeds


class _SliderSpin(QWidget):
    """A slider for a quick feel and a spin box for an exact value, kept in step."""

    value_changed = Signal(float)

    def __init__(
        self, name: str, tip: str, maximum: float, step: float, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._scale = round(1 / step)
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setRange(0, round(maximum * self._scale))
        self.slider.setPageStep(self._scale // 10 or 1)
        self.spin = QDoubleSpinBox(self)
        self.spin.setRange(0.0, maximum)
        self.spin.setSingleStep(step)
        self.spin.setDecimals(2)
        self.spin.setFixedWidth(72)
        self.spin.setAlignment(Qt.AlignmentFlag.AlignRight)
        for widget in (self.slider, self.spin):
            widget.setAccessibleName(name)
            widget.setToolTip(tip)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(8)
        row.addWidget(self.slider, 1)
        row.addWidget(self.spin)
        self.slider.valueChanged.connect(lambda steps: self.spin.setValue(steps / self._scale))
        self.spin.valueChanged.connect(self._spun)

    def value(self) -> float:
        return self.spin.value()

    def set_value(self, value: float) -> None:
        """Show `value` without signalling a change (loading is not editing)."""
        with QSignalBlocker(self.spin), QSignalBlocker(self.slider):
            self.spin.setValue(value)
            self.slider.setValue(round(self.spin.value() * self._scale))

    def _spun(self, value: float) -> None:
        with QSignalBlocker(self.slider):
            self.slider.setValue(round(value * self._scale))
        self.value_changed.emit(value)


class ConversationSettings(QWidget):
    """The open conversation's settings, saved to the store as they are edited."""

    changed = Signal(str)  # conversation id, after its settings were saved

    def __init__(self, store: ConversationStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversation-settings")
        self.setStyleSheet(theme.stylesheet("settings.qss"))
        self._store = store
        self._conversation_id: str | None = None
        self._pending: dict[str, Any] = {}  # sampling edits not saved yet; None removes a key
        self._prompt_edited = False

        self.system_prompt = QPlainTextEdit(self)
        self.system_prompt.setObjectName("system-prompt")
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setToolTip(
            "Instructions the model follows for the whole conversation. Changing them makes "
            "the model read the conversation again once, on the next reply."
        )
        self.system_prompt.setPlaceholderText("For example: You are a concise assistant.")
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setMinimumHeight(110)
        self.system_prompt.setMaximumHeight(320)

        self.temperature = _SliderSpin(
            "Temperature",
            "Randomness of the reply: 0 always picks the likeliest word; higher is more varied",
            2.0,
            0.05,
            self,
        )
        self.top_p = _SliderSpin(
            "Top-p",
            "Sample only from the likeliest words whose probabilities add up to this (1: all)",
            1.0,
            0.01,
            self,
        )
        self.min_p = _SliderSpin(
            "Min-p",
            "Leave out words less likely than this fraction of the likeliest word (0: off)",
            1.0,
            0.01,
            self,
        )
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setAccessibleName("Maximum reply length")
        self.max_tokens.setToolTip("The longest reply, in tokens; the model may stop sooner")
        self.max_tokens.setRange(1, MAX_TOKENS_LIMIT)
        self.max_tokens.setSingleStep(256)
        self.max_tokens.setGroupSeparatorShown(True)
        self.max_tokens.setSuffix(" tokens")
        self.seed = QLineEdit(self)
        self.seed.setObjectName("seed")
        self.seed.setAccessibleName("Seed")
        self.seed.setToolTip(
            "A fixed seed gives the same reply to the same prompt and settings; "
            "leave it blank for a new one each time"
        )
        self.seed.setPlaceholderText("Random")
        self.seed.setValidator(
            QRegularExpressionValidator(QRegularExpression(rf"\d{{0,{_SEED_DIGITS}}}"), self)
        )
        self.reasoning = QCheckBox("Think before answering", self)
        self.reasoning.setAccessibleName("Reasoning")
        self.reasoning_hint = _hint("Needs a reasoning model.", self)
        self.use_tools = QCheckBox("Use MCP tools", self)
        self.use_tools.setObjectName("use-tools")
        self.use_tools.setAccessibleName("Use tools")
        self.use_tools.setToolTip(
            "Let the model call the tools of the servers turned on in Settings > Tools; you "
            "approve each call unless you trust it"
        )
        self.reset_button = QPushButton("Reset to defaults", self)
        self.reset_button.setObjectName("reset-settings")
        self.reset_button.setAccessibleName("Reset sampling to defaults")
        self.reset_button.setToolTip(
            "Put every sampling setting back to its default; the system prompt is kept"
        )

        self.presets = PresetPicker(store, self)
        self.presets.before_change = self.flush
        self.presets.applied.connect(self._preset_applied)

        self._build_layout()
        self.set_reasoning_supported(False)
        self._show_sampling({})
        self.setEnabled(False)

        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(SAVE_DEBOUNCE_MS)
        self._save_timer.timeout.connect(self._save)
        self.system_prompt.textChanged.connect(self._prompt_changed)
        self.temperature.value_changed.connect(lambda v: self._edit("temperature", round(v, 2)))
        self.top_p.value_changed.connect(lambda v: self._edit("top_p", round(v, 2)))
        self.min_p.value_changed.connect(lambda v: self._edit("min_p", round(v, 2)))
        self.max_tokens.valueChanged.connect(lambda v: self._edit("max_tokens", v))
        self.seed.textChanged.connect(lambda text: self._edit("seed", int(text) if text else None))
        self.reasoning.toggled.connect(lambda on: self._edit("reasoning", on))
        self.use_tools.toggled.connect(lambda on: self._edit(SERVERS_KEY, None if on else []))
        self.reset_button.clicked.connect(self.reset)

    def _build_layout(self) -> None:
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # a narrow dock: label above
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        form.setHorizontalSpacing(12)
        form.setVerticalSpacing(10)
        rows: list[tuple[str, QWidget, QWidget]] = [
            ("Temperature", self.temperature, self.temperature.spin),
            ("Top-p", self.top_p, self.top_p.spin),
            ("Min-p", self.min_p, self.min_p.spin),
            ("Max length", self.max_tokens, self.max_tokens),
            ("Seed", self.seed, self.seed),
        ]
        for text, field, buddy in rows:
            label = QLabel(text, self)
            label.setBuddy(buddy)
            form.addRow(label, field)
        form.addRow("", self.reasoning)
        form.addRow("", self.reasoning_hint)

        reset_row = QHBoxLayout()
        reset_row.addStretch(1)
        reset_row.addWidget(self.reset_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 12)
        layout.setSpacing(8)
        layout.addWidget(_section("Preset", self))
        layout.addWidget(self.presets)
        layout.addSpacing(10)
        layout.addWidget(_section("System prompt", self))
        layout.addWidget(self.system_prompt, 1)
        layout.addWidget(_hint("Applies from the next reply.", self))
        layout.addSpacing(10)
        layout.addWidget(_section("Sampling", self))
        layout.addLayout(form)
        layout.addSpacing(6)
        layout.addLayout(reset_row)
        layout.addSpacing(10)
        layout.addWidget(_section("Tools", self))
        layout.addWidget(self.use_tools)
        layout.addWidget(_hint("Servers are added in Settings > Tools.", self))
        layout.addStretch(1)

    # Public

    def load(self, conversation_id: str | None) -> None:
        """Show a conversation's settings (None: none, and the panel is disabled). Edits
        still waiting to be saved go to the conversation they were made in."""
        self.flush()
        self._conversation_id = None
        conversation = None
        if conversation_id is not None:
            try:
                conversation = self._store.get_conversation(conversation_id)
            except StoreError as error:
                QMessageBox.warning(self, "Stoke", str(error))
        prompt = conversation.system_prompt if conversation else None
        with QSignalBlocker(self.system_prompt):
            self.system_prompt.setPlainText(prompt or "")
        self._show_sampling(conversation.sampling if conversation else {})
        self._conversation_id = conversation.id if conversation else None
        self.presets.load(self._conversation_id)
        self.setEnabled(conversation is not None)

    def set_reasoning_supported(self, supported: bool) -> None:
        """Whether the loaded model can think before answering; the checkbox is off limits
        (greyed) otherwise, whatever the conversation asks for."""
        self.reasoning.setEnabled(supported)
        self.reasoning_hint.setVisible(not supported)
        self.reasoning.setToolTip(
            "Let the model reason step by step before it answers: slower, often better"
            if supported
            else "The loaded model does not reason before answering"
        )

    def reset(self) -> None:
        """Every known sampling setting back to its default, saved at once."""
        if self._conversation_id is None:
            return
        self._show_sampling({})
        self._pending = dict.fromkeys(SAMPLING_KEYS)
        self.flush()

    def flush(self) -> None:
        """Save edits still waiting out the pause, now (before a switch or a close)."""
        if self._pending or self._prompt_edited:
            self._save_timer.stop()
            self._save()

    # Internals

    def _show_sampling(self, sampling: dict) -> None:
        """Fill the controls from a sampling dict, defaults for what it leaves out."""
        self.temperature.set_value(float(sampling.get("temperature", _DEFAULTS.temperature)))
        self.top_p.set_value(float(sampling.get("top_p", _DEFAULTS.top_p)))
        self.min_p.set_value(float(sampling.get("min_p", _DEFAULTS.min_p)))
        seed = sampling.get("seed", _DEFAULTS.seed)
        with QSignalBlocker(self.max_tokens), QSignalBlocker(self.seed):
            self.max_tokens.setValue(int(sampling.get("max_tokens", DEFAULT_MAX_TOKENS)))
            self.seed.setText("" if seed is None else str(seed))
        with QSignalBlocker(self.reasoning):
            self.reasoning.setChecked(bool(sampling.get("reasoning", False)))
        with QSignalBlocker(self.use_tools):
            self.use_tools.setChecked(sampling.get(SERVERS_KEY) != [])

    def _edit(self, key: str, value: Any) -> None:
        if self._conversation_id is None:
            return
        self._pending[key] = value
        self._save_timer.start()

    def _prompt_changed(self) -> None:
        if self._conversation_id is None:
            return
        self._prompt_edited = True
        self._save_timer.start()

    def _save(self) -> None:
        """Merge the edits into what the store holds now, so nothing else is overwritten."""
        conversation_id = self._conversation_id
        pending, self._pending = self._pending, {}
        prompt_edited, self._prompt_edited = self._prompt_edited, False
        if conversation_id is None:
            return
        try:
            if pending:
                sampling = dict(self._store.get_conversation(conversation_id).sampling)
                for key, value in pending.items():
                    if value is None:
                        sampling.pop(key, None)
                    else:
                        sampling[key] = value
                self._store.set_sampling(conversation_id, sampling)
            if prompt_edited:
                prompt = self.system_prompt.toPlainText()
                self._store.set_system_prompt(conversation_id, prompt if prompt.strip() else None)
        except StoreError as error:
            QMessageBox.warning(self, "Stoke", str(error))
            return
        self.presets.show_match()
        self.changed.emit(conversation_id)

    def _preset_applied(self, conversation_id: str) -> None:
        self.load(conversation_id)  # the preset's prompt and sampling in the controls
        self.changed.emit(conversation_id)


def _section(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    font = QFont(label.font())
    font.setWeight(QFont.Weight.DemiBold)
    label.setFont(font)
    return label


def _hint(text: str, parent: QWidget) -> QLabel:
    label = QLabel(text, parent)
    label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
    label.setWordWrap(True)
    return label
