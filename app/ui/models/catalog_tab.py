"""The Catalog tab: recommended models as cards, each with the planner's verdict for this
machine and a Download button that knows what is already in the library or on its way.

Detecting the GPUs and planning every entry run on a pool thread (the first plan of DeepSeek
reads its layout: seconds). `CatalogCard` is one entry; `CatalogTab` is a mixin of
`ModelsDialog` that owns the cards and the machine line above them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QThreadPool
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.hardware.detect import Hardware
from app.models.catalog import DOES_NOT_FIT, CatalogEntry, Fit, assess
from app.ui.a11y import described
from app.ui.models.download_row import DownloadRow
from app.ui.models.widgets import FitBadge, download_anyway, tab_page, text_label
from app.ui.models.words import format_context, machine_summary
from app.units import decimal_bytes


class CatalogCard(QFrame):
    def __init__(self, entry: CatalogEntry, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entry = entry
        self.setObjectName("card")
        self.setAccessibleName(entry.name)
        grid = QGridLayout(self)
        grid.setContentsMargins(14, 12, 14, 12)
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(4)
        title = text_label(entry.name, "card-title", self)
        title.setWordWrap(True)
        context = (
            f" · {format_context(entry.context_length)} context" if entry.context_length else ""
        )
        kind = "MoE" if entry.moe else "dense"
        meta = text_label(
            f"{entry.repo} · {entry.format.upper()} · {entry.parameters} ({kind}){context}",
            "muted",
            self,
        )
        meta.setWordWrap(True)
        meta.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        notes = text_label(entry.notes, "", self)
        notes.setWordWrap(True)
        self.badge = FitBadge(self)
        self.size_label = text_label(f"{decimal_bytes(entry.size_bytes)}", "card-title", self)
        self.size_label.setAccessibleName("Download size")
        self.size_label.setToolTip("About this much is downloaded and kept on disk")
        self.download_button = QPushButton("Download", self)
        self.download_button.setObjectName("primary")
        described(
            self.download_button,
            f"Download {entry.name}",
            f"Download {decimal_bytes(entry.size_bytes)} from {entry.repo}",
        )
        self.engine_label = text_label("", "muted", self)
        self.engine_label.setWordWrap(True)
        self.engine_label.setAccessibleName("Engine on this machine")
        self.engine_label.hide()  # until the machine is known
        grid.addWidget(title, 0, 0)
        grid.addWidget(meta, 1, 0)
        grid.addWidget(notes, 2, 0)
        grid.addWidget(self.engine_label, 4, 0)
        self.note: QLabel | None = None
        self._state, self._where, self._fits = "download", "", True
        if not entry.checked:
            self.note = text_label(
                "⚠ Not yet checked against the hub: the repo or its file names may differ.",
                "note",
                self,
            )
            self.note.setWordWrap(True)
            self.note.setAccessibleName("Unchecked entry")
            grid.addWidget(self.note, 3, 0)
        side = QVBoxLayout()
        side.setSpacing(6)
        side.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignRight)
        side.addWidget(self.size_label, 0, Qt.AlignmentFlag.AlignRight)
        side.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)
        side.addStretch(1)
        grid.addLayout(side, 0, 1, 5, 1)
        grid.setColumnStretch(0, 1)

    def set_fit(self, text: str) -> None:
        """Show the verdict; a model that cannot run here still downloads, less loudly."""
        self.badge.set_verdict(text)
        self.download_button.setObjectName("" if text == DOES_NOT_FIT else "primary")
        self.download_button.style().unpolish(self.download_button)
        self.download_button.style().polish(self.download_button)
        self._fits = text != DOES_NOT_FIT
        self.set_available(self._state, self._where)

    @property
    def fits(self) -> bool:
        """False once the badge says the model does not fit this machine."""
        return self._fits

    def set_available(self, state: str, where: str = "") -> None:
        """State is one of download, downloading, or have (already in the library)."""
        self._state, self._where = state, where
        button = self.download_button
        button.setEnabled(state == "download")
        button.setText(
            {"download": "Download", "downloading": "Downloading…"}.get(state, "In library")
        )
        if state == "have":
            button.setToolTip(f"Already downloaded to {where}")
        elif state == "downloading":
            button.setToolTip("Being downloaded: see the Downloads tab")
        else:
            entry = self.entry
            tip = f"Download {decimal_bytes(entry.size_bytes)} from {entry.repo}"
            if not self._fits:
                tip += " (it does not fit this machine: for another computer or a bigger one)"
            button.setToolTip(tip)


class CatalogTab:
    """The Catalog tab's widgets and verdicts (see the module's docstring)."""

    def _build_catalog(self) -> QWidget:
        page, column = tab_page(self, 8)
        self.machine_label = text_label("Looking at this machine…", "muted", page)
        self.machine_label.setAccessibleName("This machine")
        self.machine_label.setToolTip("What the fit badges are measured against")
        column.addWidget(self.machine_label)
        scroll = QScrollArea(page)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setAccessibleName("Catalog")
        body = QWidget(scroll)
        body.setObjectName("scroll-body")
        cards = QVBoxLayout(body)
        cards.setContentsMargins(0, 0, 4, 0)
        cards.setSpacing(8)
        self.cards: dict[str, CatalogCard] = {}
        family = None
        for entry in self.catalog:
            if entry.family != family:
                family = entry.family
                cards.addWidget(text_label(family.upper(), "section", body))
            card = CatalogCard(entry, body)
            card.download_button.clicked.connect(
                lambda _=False, e=entry: self._download_clicked(e.id)
            )
            self.cards[entry.id] = card
            cards.addWidget(card)
        cards.addStretch(1)
        scroll.setWidget(body)
        column.addWidget(scroll, 1)
        return page

    def _download_clicked(self, entry_id: str) -> None:
        card = self.cards[entry_id]
        if card.fits or download_anyway(self, card.entry.name, card.entry.size_bytes):
            self.download_entry(entry_id)

    def download_entry(self, entry_id: str) -> DownloadRow:
        entry = self.cards[entry_id].entry
        return self.start_download(
            entry.repo,
            entry.files or None,
            quant=None if entry.files else entry.quant,
            title=entry.name,
        )

    def _hardware_found(self, hardware: Hardware) -> None:
        self.hardware = hardware
        self._update_badges()

    def _no_hardware(self, message: str) -> None:
        self._hardware_problem = f"Stoke could not look at this machine: {message}"
        self.machine_label.setText(self._hardware_problem)
        for card in self.cards.values():
            card.badge.set_verdict(None, self._hardware_problem)

    def _update_badges(self) -> None:
        """Plan each entry off the UI thread (the first plan reads DeepSeek's layout, seconds),
        then show the verdicts."""
        if self.hardware is None:
            return
        hardware = self.hardware
        entries = [card.entry for card in self.cards.values()]
        self._run(
            QThreadPool.globalInstance(),
            lambda: {e.id: assess(e, hardware) for e in entries},
            lambda fits: self._show_fits(hardware, fits),
            self._no_hardware,
        )

    def _show_fits(self, hardware: Hardware, fits: dict[str, Fit]) -> None:
        self.machine_label.setText(f"Fit for this machine — {machine_summary(hardware)}")
        for entry_id, fit in fits.items():
            card = self.cards[entry_id]
            card.set_fit(fit.verdict)
            if fit.engine:
                card.engine_label.setText(f"Runs on {fit.engine}: {fit.engine_reason}.")
                card.engine_label.show()
            notes = [card.badge.toolTip()]
            if fit.basis == "planner" and fit.detail:
                notes.append(f"Offload planner: {fit.detail}.")
            if fit.speed:
                notes.append(f"Predicted decode: {fit.speed}.")
            card.badge.setToolTip(" ".join(notes))

    def _update_catalog_buttons(self) -> None:
        active = {
            row.title.text() for row in self.download_rows() if row.state in ("starting", "running")
        }
        for card in self.cards.values():
            entry = card.entry
            where = self.downloads.destination(entry.repo)
            if entry.files and all((where / f).exists() for f in entry.files):
                card.set_available("have", str(where))
            elif entry.name in active:
                card.set_available("downloading")
            else:
                card.set_available("download")
