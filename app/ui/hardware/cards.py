"""The wizard's layout: the machine, model, settings and plan cards and the footer, built
once. A mixin of `HardwareWizard`: it creates the widgets the wizard fills and connects the
inputs to the wizard's re-planning, from the parts in parts.py; remote.py builds the other
machines' card.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialogButtonBox,
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

from app.hardware.memory import KV_TYPES
from app.hardware.planner import PROFILES
from app.settings import Settings
from app.ui.a11y import described
from app.ui.hardware.chart import PlanChart
from app.ui.hardware.parts import PathLabel, selectable_label, titled_card
from app.ui.hardware.planning import CONTEXT_STOPS, DEFAULT_CONTEXT, MAX_RESIDENT, UBATCHES
from app.ui.hardware.remote import RemoteMachines
from app.ui.hardware.words import ENGINE_TEXT, KV_TEXT, PROFILE_TEXT, resident_words
from app.ui.theme import STATUS


class WizardCards:
    """The wizard's layout (see the module's docstring)."""

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        body = QScrollArea(self)
        body.setObjectName("wizard-body")
        body.setWidgetResizable(True)
        body.setFrameShape(QFrame.Shape.NoFrame)
        contents = QWidget(body)
        contents.setObjectName("wizard-contents")
        body.setWidget(contents)
        page = QVBoxLayout(contents)
        page.setContentsMargins(20, 18, 20, 12)
        page.setSpacing(14)
        intro = selectable_label(
            "Where each part of the model lives on this machine: which layers and experts go "
            "to each GPU, and which stay in system RAM.",
            contents,
            role="lead",
        )
        page.addWidget(intro)
        columns = QHBoxLayout()
        columns.setSpacing(14)
        left = QVBoxLayout()
        left.setSpacing(14)
        left.addWidget(self._build_machine(contents))
        left.addWidget(self._build_remote(contents))
        left.addWidget(self._build_model(contents))
        left.addWidget(self._build_settings(contents))
        left.addStretch(1)
        right = QVBoxLayout()
        right.addWidget(self._build_plan(contents))
        right.addStretch(1)
        columns.addLayout(left, 11)
        columns.addLayout(right, 12)
        page.addLayout(columns, 1)
        outer.addWidget(body, 1)

        buttons = QDialogButtonBox(self)
        self.apply_button = buttons.addButton("Apply", QDialogButtonBox.ButtonRole.AcceptRole)
        described(
            self.apply_button,
            "Apply",
            "Save this plan as the model's load settings; a loaded model reloads with it now",
        )
        self.apply_button.setDefault(True)
        self.cancel_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        described(self.cancel_button, "Cancel", "Close without saving anything")
        self.apply_button.clicked.connect(self.apply)
        self.cancel_button.clicked.connect(self.reject)
        self.apply_error = selectable_label("", self)
        self.apply_error.setStyleSheet(f"color: {STATUS['error']};")
        self.apply_error.hide()
        footer = QHBoxLayout()
        footer.setContentsMargins(20, 10, 20, 16)
        footer.addWidget(self.apply_error, 1)
        footer.addWidget(buttons)
        line = QFrame(self)
        line.setFrameShape(QFrame.Shape.HLine)
        line.setStyleSheet("color: palette(mid);")
        outer.addWidget(line)
        outer.addLayout(footer)

    def _build_machine(self, parent: QWidget) -> QFrame:
        card, column = titled_card("This machine", parent)
        self.device_table = QTableWidget(0, 4, card)
        self.device_table.setObjectName("devices")
        described(
            self.device_table,
            "Detected devices",
            "The GPUs llama.cpp can use and the CPU with system RAM; free memory is what a "
            "plan may fill",
        )
        self.device_table.setHorizontalHeaderLabels(["Device", "Kind", "Free", "Total"])
        header = self.device_table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2, 3):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setHighlightSections(False)
        self.device_table.verticalHeader().hide()
        self.device_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.device_table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.device_table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.device_table.setShowGrid(False)
        self.device_table.setAlternatingRowColors(True)
        self.device_table.setWordWrap(False)
        self.device_table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.device_table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.device_table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        column.addWidget(self.device_table)
        self.machine_status = selectable_label("", card)
        self.machine_status.setAccessibleName("GPU support")
        column.addWidget(self.machine_status)
        self.rebuild_hint = selectable_label("", card, role="muted")
        self.rebuild_hint.setAccessibleName("How to enable GPU support")
        self.rebuild_hint.hide()
        column.addWidget(self.rebuild_hint)
        self.engine_label = selectable_label("", card)
        self.engine_label.setAccessibleName("Recommended engine")
        column.addWidget(self.engine_label)
        return card

    def _build_remote(self, parent: QWidget) -> QFrame:
        self.remote = RemoteMachines(parent, Settings.load().rpc_servers, self._request_plan)
        return self.remote.card

    def _build_model(self, parent: QWidget) -> QFrame:
        card, column = titled_card("Model", parent)
        row = QHBoxLayout()
        row.setSpacing(10)
        names = QVBoxLayout()
        names.setSpacing(2)
        self.model_name = selectable_label("", card)
        self.model_name.setAccessibleName("Model name")
        bold = QFont(self.model_name.font())
        bold.setWeight(QFont.Weight.DemiBold)
        self.model_name.setFont(bold)
        self.model_path_label = PathLabel(card)
        self.model_path_label.setObjectName("muted")
        self.model_path_label.setAccessibleName("Model file")
        names.addWidget(self.model_name)
        names.addWidget(self.model_path_label)
        row.addLayout(names, 1)
        self.model_button = QPushButton("Choose…", card)
        described(self.model_button, "Choose model", "Pick another GGUF model file to plan for")
        row.addWidget(self.model_button, 0, Qt.AlignmentFlag.AlignTop)
        column.addLayout(row)
        facts = QGridLayout()
        facts.setHorizontalSpacing(16)
        facts.setVerticalSpacing(6)
        self.facts: dict[str, QLabel] = {}
        for i, (key, title) in enumerate(
            (
                ("architecture", "Architecture"),
                ("size", "Size"),
                ("quantization", "Quantization"),
                ("layers", "Layers"),
                ("experts", "Experts"),
                ("context", "Trained context"),
            )
        ):
            name = selectable_label(title, card, role="muted")
            value = selectable_label("—", card)
            value.setAccessibleName(title)
            self.facts[key] = value
            facts.addWidget(name, i // 2, (i % 2) * 2)
            facts.addWidget(value, i // 2, (i % 2) * 2 + 1)
        facts.setColumnStretch(1, 1)
        facts.setColumnStretch(3, 1)
        column.addLayout(facts)
        self.model_error = selectable_label("", card)
        self.model_error.setStyleSheet(f"color: {STATUS['error']};")
        self.model_error.setAccessibleName("Model problem")
        self.model_error.hide()
        column.addWidget(self.model_error)
        return card

    def _build_settings(self, parent: QWidget) -> QFrame:
        card, column = titled_card("How it runs", parent)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        form.setHorizontalSpacing(14)
        form.setVerticalSpacing(10)

        self.engine_combo = QComboBox(card)
        described(
            self.engine_combo,
            "Engine",
            "What runs this model: llama.cpp (the plan below places its tensors) or MLX "
            "(Apple Silicon's GPU in unified memory)",
        )
        for name, text in ENGINE_TEXT.items():
            self.engine_combo.addItem(text, name)
        form.addRow("Engine", self.engine_combo)

        self.context_slider = QSlider(Qt.Orientation.Horizontal, card)
        described(
            self.context_slider,
            "Context length",
            "The longest conversation the model holds at once, in tokens; its KV cache grows "
            "with it",
        )
        self.context_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.context_slider.setTickInterval(1)
        self.context_slider.setPageStep(2)
        self.context_value = QLabel("", card)
        self.context_value.setAccessibleName("Context length in tokens")
        self.context_value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.context_value.setMinimumWidth(
            self.context_value.fontMetrics().horizontalAdvance("1,048,576 tokens") + 4
        )
        self.context_min = selectable_label("", card, role="muted")
        self.context_max = selectable_label("", card, role="muted")
        self.context_max.setAlignment(Qt.AlignmentFlag.AlignRight)
        slider_box = QGridLayout()
        slider_box.setHorizontalSpacing(10)
        slider_box.setVerticalSpacing(0)
        slider_box.addWidget(self.context_slider, 0, 0, 1, 2)
        slider_box.addWidget(self.context_value, 0, 2)
        slider_box.addWidget(self.context_min, 1, 0)
        slider_box.addWidget(self.context_max, 1, 1)
        slider_box.setColumnStretch(0, 1)
        slider_box.setColumnStretch(1, 1)
        form.addRow("Context", slider_box)

        self.profile_combo = QComboBox(card)
        described(
            self.profile_combo,
            "Profile",
            "What the model spends its time on, which sets the micro-batch",
        )
        for profile in PROFILES:
            text, tip = PROFILE_TEXT[profile]
            self.profile_combo.addItem(text, profile)
            self.profile_combo.setItemData(
                self.profile_combo.count() - 1, tip, Qt.ItemDataRole.ToolTipRole
            )
        form.addRow("Profile", self.profile_combo)

        self.kv_combo = QComboBox(card)
        described(
            self.kv_combo,
            "KV cache type",
            "How the conversation's KV cache is stored: smaller types leave room for more "
            "experts on the GPUs",
        )
        for kv in KV_TYPES:
            self.kv_combo.addItem(KV_TEXT.get(kv, kv), kv)
        form.addRow("KV cache", self.kv_combo)

        self.ubatch_combo = QComboBox(card)
        described(
            self.ubatch_combo,
            "Micro-batch",
            "Tokens read per step of prefill: larger is faster for long prompts but needs "
            "larger compute buffers. Automatic picks it for the profile.",
        )
        for ub in UBATCHES:
            self.ubatch_combo.addItem("Automatic (by profile)" if ub is None else f"{ub:,}", ub)
        form.addRow("Micro-batch", self.ubatch_combo)

        self.resident_spin = QSpinBox(card)
        described(
            self.resident_spin,
            "Conversations kept loaded",
            "How many conversations stay in memory at once, so switching between them costs "
            "nothing; each keeps its own KV cache of the whole context, so the KV memory "
            "grows with their number",
        )
        self.resident_spin.setRange(1, MAX_RESIDENT)
        self.resident_spin.setValue(
            max(1, min(Settings.load().resident_conversations, MAX_RESIDENT))
        )
        self.resident_spin.setFixedWidth(80)
        self.resident_spin.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.resident_note = selectable_label("", card, role="muted")
        self.resident_note.setAccessibleName("KV memory of the conversations kept loaded")
        self.resident_note.setWordWrap(True)
        self.resident_spin.valueChanged.connect(
            lambda n: self.resident_note.setText(resident_words(n))
        )
        self.resident_note.setText(resident_words(self.resident_spin.value()))
        resident_row = QHBoxLayout()
        resident_row.addWidget(self.resident_spin)
        resident_row.addWidget(self.resident_note, 1)
        form.addRow("Conversations", resident_row)

        self.kv_ram_check = QCheckBox("Keep the KV cache in system RAM", card)
        described(
            self.kv_ram_check,
            "KV cache in RAM",
            "Frees GPU memory for experts at the cost of slower attention (llama.cpp -nkvo)",
        )
        form.addRow("", self.kv_ram_check)
        column.addLayout(form)
        self._set_stops(list(CONTEXT_STOPS), DEFAULT_CONTEXT)
        return card

    def _build_plan(self, parent: QWidget) -> QFrame:
        card, column = titled_card("Memory plan", parent)
        title = column.itemAt(0).widget()
        column.removeWidget(title)
        heading = QHBoxLayout()
        heading.addWidget(title)
        heading.addStretch(1)
        self.fit_chip = QLabel("", card)
        self.fit_chip.setObjectName("fit-chip")
        self.fit_chip.setAccessibleName("Whether the plan fits")
        heading.addWidget(self.fit_chip)
        column.insertLayout(0, heading)

        self.chart = PlanChart(card)
        column.addWidget(self.chart)
        self.summary_label = selectable_label("", card)
        self.summary_label.setAccessibleName("Plan summary")
        bold = QFont(self.summary_label.font())
        bold.setWeight(QFont.Weight.DemiBold)
        self.summary_label.setFont(bold)
        column.addWidget(self.summary_label)
        self.details_label = selectable_label("", card, role="muted")
        self.details_label.setAccessibleName("Plan details")
        column.addWidget(self.details_label)
        self.status_label = selectable_label("", card)
        self.status_label.setAccessibleName("Plan status")
        column.addWidget(self.status_label)
        self.warnings_label = selectable_label("", card, role="muted")
        self.warnings_label.setAccessibleName("Warnings")
        self.warnings_label.setTextFormat(Qt.TextFormat.RichText)
        column.addWidget(self.warnings_label)
        self.alternatives_title = selectable_label("", card)
        self.alternatives_title.setAccessibleName("Other choices")
        column.addWidget(self.alternatives_title)
        self.alternatives_box = QVBoxLayout()
        self.alternatives_box.setSpacing(6)
        column.addLayout(self.alternatives_box)
        self.alternatives_note = selectable_label("", card, role="muted")
        column.addWidget(self.alternatives_note)
        actions = QHBoxLayout()
        actions.addStretch(1)
        self.copy_button = QPushButton("Copy llama-server command", card)
        described(
            self.copy_button,
            "Copy llama-server command",
            "Copy the llama-server command line that loads the model with this plan",
        )
        self.copy_button.clicked.connect(self._copy_command)
        actions.addWidget(self.copy_button)
        column.addLayout(actions)
        for widget in (self.alternatives_title, self.alternatives_note):
            widget.hide()
        return card

    def _connect(self) -> None:
        self.model_button.clicked.connect(self._choose_model)
        self.context_slider.valueChanged.connect(self._context_moved)
        self.profile_combo.currentIndexChanged.connect(self._request_plan)
        self.kv_combo.currentIndexChanged.connect(self._request_plan)
        self.ubatch_combo.currentIndexChanged.connect(self._request_plan)
        self.resident_spin.valueChanged.connect(self._request_plan)
        self.kv_ram_check.toggled.connect(self._request_plan)
