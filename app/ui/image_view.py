"""A picture of a message shown large: clicking an image's chip opens it, scaled to fit the
screen with its aspect kept (Pillow makes the PNG, so every format Stoke takes shows)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QDialog, QLabel, QVBoxLayout, QWidget

from app.conversations.images import thumbnail_png
from app.ui.fit import available_geometry, fit_to_screen

MARGIN_PX = 80  # room left around the picture for the frame and the screen's edges


class ImageView(QDialog):
    """One picture, as large as the screen allows (never larger than it is)."""

    def __init__(self, name: str, data: bytes, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("image-view")
        self.setWindowTitle(name)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        area = available_geometry(self)
        side = max(64, min(area.width(), area.height()) - MARGIN_PX)
        pixmap = QPixmap()
        pixmap.loadFromData(thumbnail_png(data, side), "PNG")
        self.picture = QLabel(self)
        self.picture.setObjectName("image-view-picture")
        self.picture.setAccessibleName(name)
        self.picture.setPixmap(pixmap)
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout = QVBoxLayout(self)
        layout.addWidget(self.picture)
        fit_to_screen(self)
