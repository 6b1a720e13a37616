"""The conversation list beside the chat: New chat, search, and the conversations by date.

Deleting is soft and undoable from a bar inside the sidebar, so a slip of the Delete key
costs nothing. Selecting a row (click or arrow keys) opens that conversation; the window
tells the sidebar which one is open through `select`, which never echoes a signal back.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from datetime import date, datetime

from PySide6.QtCore import (
    QAbstractItemModel,
    QEvent,
    QItemSelectionModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPoint,
    QRect,
    QRectF,
    QSignalBlocker,
    QSize,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QAction,
    QColor,
    QFont,
    QIcon,
    QKeyEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPalette,
    QPen,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStackedWidget,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Conversation, ConversationStore, SearchHit, StoreError
from app.ui import theme
from app.ui.conversation_files import imported_note, served_note

UNTITLED = "New conversation"
SEARCH_DEBOUNCE_MS = 200
UNDO_TIMEOUT_MS = 8000
PINNED = "Pinned"
GROUPS = ("Today", "Yesterday", "Previous 7 days", "Previous 30 days", "Older")

_KIND = Qt.ItemDataRole.UserRole
_ID = Qt.ItemDataRole.UserRole + 1
_TITLE = Qt.ItemDataRole.UserRole + 2  # the stored title; None for an untitled conversation
_SNIPPET = Qt.ItemDataRole.UserRole + 3  # a search hit's text, matches between « and »
_PINNED = Qt.ItemDataRole.UserRole + 4
_IN_TITLE = Qt.ItemDataRole.UserRole + 5  # a hit in the title: the snippet is the title
_TAG = Qt.ItemDataRole.UserRole + 6  # a small mark at the row's end: "API" for an API one
_MESSAGE = Qt.ItemDataRole.UserRole + 7  # the message a hit found in (None: in the title)
API_TAG = "API"
_HEADER, _ROW, _HIT = "header", "row", "hit"

_MARGIN = 6  # between a row's highlight and the list's edge
_PAD = 10  # between the highlight and the text
_SNIPPET_LINES = 2
_RENAME_KEY, _PIN_KEY, _DELETE_KEY = "F2", "Ctrl+Shift+P", "Delete"


def date_group(updated_at: float, today: date) -> str:
    """The heading a conversation last updated at `updated_at` sits under, seen on `today`."""
    age = (today - datetime.fromtimestamp(updated_at).date()).days
    if age <= 0:
        return GROUPS[0]
    if age == 1:
        return GROUPS[1]
    if age <= 7:
        return GROUPS[2]
    if age <= 30:
        return GROUPS[3]
    return GROUPS[4]


def snippet_html(snippet: str, match_color: QColor) -> str:
    """The store's snippet as HTML: escaped, with the words it marked « » in bold."""
    marked = html.escape(snippet)
    opening = f'<span style="font-weight:600; color:{match_color.name()}">'
    return marked.replace("«", opening).replace("»", "</span>")


class _RowDelegate(QStyledItemDelegate):
    """Paints headers, conversation rows and search hits; edits a title in place."""

    renamed = Signal(str, str)  # conversation id, new title

    def __init__(self, view: QListWidget) -> None:
        super().__init__(view)
        self._view = view

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = option.palette
        rect = option.rect.adjusted(_MARGIN, 1, -_MARGIN, -1)
        kind = index.data(_KIND)
        if kind == _HEADER:
            painter.setFont(_header_font(option.font))
            painter.setPen(palette.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(
                rect.adjusted(_PAD, 0, -_PAD, -4),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom,
                index.data(Qt.ItemDataRole.DisplayRole),
            )
        else:
            self._paint_background(painter, option, rect)
            text_rect = rect.adjusted(_PAD, 0, -_PAD, 0)
            if kind == _ROW:
                self._paint_title(painter, option, text_rect, index, vertical_center=True)
            else:
                self._paint_hit(painter, option, text_rect, index)
        painter.restore()

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        line = option.fontMetrics.height()
        kind = index.data(_KIND)
        if kind == _HEADER:
            return QSize(0, line + 14)
        if kind == _ROW:
            return QSize(0, line + 16)
        width = self._view.viewport().width() - 2 * (_MARGIN + _PAD)
        document = self._snippet_document(option, index, max(width, 40))
        title_line = 0 if index.data(_IN_TITLE) else line + 2
        return QSize(0, title_line + math.ceil(_snippet_height(document)) + 16)

    def createEditor(
        self,
        parent: QWidget,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> QWidget:
        editor = QLineEdit(parent)
        editor.setPlaceholderText(UNTITLED)
        editor.setAccessibleName("Conversation title")
        editor.setToolTip("Enter keeps the new title, Esc cancels")
        return editor

    def setEditorData(self, editor: QWidget, index: QModelIndex | QPersistentModelIndex) -> None:
        assert isinstance(editor, QLineEdit)
        editor.setText(index.data(_TITLE) or "")
        editor.selectAll()

    def setModelData(
        self,
        editor: QWidget,
        model: QAbstractItemModel,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        """Hand the title to the sidebar, which saves it; an empty title changes nothing."""
        assert isinstance(editor, QLineEdit)
        title = editor.text().strip()
        if title and title != index.data(_TITLE):
            self.renamed.emit(index.data(_ID), title)

    def updateEditorGeometry(
        self,
        editor: QWidget,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        editor.setGeometry(option.rect.adjusted(_MARGIN, 1, -_MARGIN, -1))

    def _paint_background(
        self, painter: QPainter, option: QStyleOptionViewItem, rect: QRect
    ) -> None:
        state = option.state
        if state & QStyle.StateFlag.State_Selected:
            color = QColor(option.palette.color(QPalette.ColorRole.Highlight))
            color.setAlpha(85 if state & QStyle.StateFlag.State_HasFocus else 55)
        elif state & QStyle.StateFlag.State_HasFocus:  # the keyboard's row, not open yet
            painter.setPen(QPen(option.palette.color(QPalette.ColorRole.Highlight), 1.5))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(rect).adjusted(1, 1, -1, -1), 6, 6)
            return
        elif state & QStyle.StateFlag.State_MouseOver:
            color = QColor(option.palette.color(QPalette.ColorRole.Text))
            color.setAlpha(16)
        else:
            return
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(color)
        painter.drawRoundedRect(QRectF(rect), 6, 6)

    def _paint_title(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        rect: QRect,
        index: QModelIndex | QPersistentModelIndex,
        *,
        vertical_center: bool,
    ) -> None:
        font = QFont(option.font)
        if index.data(_TITLE) is None:
            font.setItalic(True)
        painter.setFont(font)
        painter.setPen(option.palette.color(QPalette.ColorRole.Text))
        title = index.data(Qt.ItemDataRole.DisplayRole)
        vertical = Qt.AlignmentFlag.AlignVCenter if vertical_center else Qt.AlignmentFlag.AlignTop
        if tag := index.data(_TAG):
            painter.setPen(option.palette.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(rect, Qt.AlignmentFlag.AlignRight | vertical, tag)
            rect = rect.adjusted(0, 0, -painter.fontMetrics().horizontalAdvance(tag) - _PAD, 0)
            painter.setPen(option.palette.color(QPalette.ColorRole.Text))
        elided = painter.fontMetrics().elidedText(title, Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | vertical, elided)

    def _paint_hit(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        rect: QRect,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        body = rect.adjusted(0, 8, 0, -8)
        top = body.top()
        if not index.data(_IN_TITLE):
            self._paint_title(painter, option, body, index, vertical_center=False)
            top += option.fontMetrics.height() + 2
        document = self._snippet_document(option, index, body.width())
        painter.translate(body.left(), top)
        document.drawContents(painter, QRectF(0, 0, body.width(), _snippet_height(document)))

    def _snippet_document(
        self,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
        width: int,
    ) -> QTextDocument:
        palette = option.palette
        text = palette.color(QPalette.ColorRole.Text)
        color = text if index.data(_IN_TITLE) else palette.color(QPalette.ColorRole.PlaceholderText)
        document = QTextDocument()
        document.setDocumentMargin(0)
        document.setDefaultFont(option.font)
        document.setDefaultStyleSheet(f"body {{ color: {color.name()}; }}")
        snippet = snippet_html(index.data(_SNIPPET), text)
        document.setHtml(f"<body>{snippet}</body>")
        document.setTextWidth(width)
        return document


class Sidebar(QWidget):
    """The conversations of one store: pinned first, then by date; search over all of them."""

    conversation_selected = Signal(str)
    message_selected = Signal(str)  # a hit in a message opened, after its conversation
    new_requested = Signal()
    conversation_deleted = Signal(str)
    conversation_renamed = Signal(str)

    def __init__(
        self,
        store: ConversationStore,
        parent: QWidget | None = None,
        *,
        undo_timeout_ms: int = UNDO_TIMEOUT_MS,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setMinimumWidth(220)
        self.setStyleSheet(theme.stylesheet("sidebar.qss"))
        self._store = store
        self._current_id: str | None = None
        self._deleted: tuple[str, bool] | None = None  # (id, was open) while Undo is offered
        self._menu_id: str | None = None  # the conversation a context menu is open on

        self.new_button = QPushButton("New chat", self)
        self.new_button.setObjectName("new-chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("Start a new conversation")
        _set_theme_icon(self.new_button, QIcon.ThemeIcon.DocumentNew)

        self.search = QLineEdit(self)
        self.search.setObjectName("search-field")
        self.search.setPlaceholderText("Search conversations")
        self.search.setAccessibleName("Search conversations")
        self.search.setToolTip(
            f"Search titles and messages ({_keys(QKeySequence.StandardKey.Find)}); Esc clears"
        )
        self.search.setClearButtonEnabled(True)
        search_icon = QIcon.fromTheme(QIcon.ThemeIcon.EditFind)
        if not search_icon.isNull():
            self.search.addAction(search_icon, QLineEdit.ActionPosition.LeadingPosition)

        self.list = QListWidget(self)
        self.list.setObjectName("conversation-list")
        self.list.setAccessibleName("Conversations")
        self.list.setAccessibleDescription(
            f"Select a conversation to open it. {_keys(_RENAME_KEY)} renames, "
            f"{_keys(_PIN_KEY)} pins or unpins, {_keys(_DELETE_KEY)} deletes; "
            "the context menu has the same."
        )
        self.list.setFrameShape(QFrame.Shape.NoFrame)
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.list.setMouseTracking(True)
        self.list.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.viewport().setAutoFillBackground(False)
        self._delegate = _RowDelegate(self.list)
        self.list.setItemDelegate(self._delegate)

        self.empty_label = QLabel(self)
        self.empty_label.setObjectName("sidebar-empty")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        self.empty_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.empty_label.setContentsMargins(16, 24, 16, 24)
        self._pages = QStackedWidget(self)
        self._pages.addWidget(self.list)
        self._pages.addWidget(self.empty_label)

        self.undo_bar = QFrame(self)
        self.undo_bar.setObjectName("undo-bar")
        self.undo_bar.setAccessibleName("Conversation deleted")
        undo_text = QLabel("Conversation deleted ·", self.undo_bar)
        undo_text.setAccessibleName("Conversation deleted")
        self.undo_button = QPushButton("Undo", self.undo_bar)
        self.undo_button.setObjectName("undo-button")
        self.undo_button.setAccessibleName("Undo delete")
        self.undo_button.setToolTip("Bring the deleted conversation back")
        self.undo_button.setCursor(Qt.CursorShape.PointingHandCursor)
        undo_row = QHBoxLayout(self.undo_bar)
        undo_row.setContentsMargins(10, 4, 4, 4)
        undo_row.setSpacing(0)
        undo_row.addWidget(undo_text)
        undo_row.addWidget(self.undo_button)
        undo_row.addStretch(1)
        self.undo_bar.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 10, 8, 8)
        layout.setSpacing(8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self._pages, 1)
        layout.addWidget(self.undo_bar)

        self._rename_action = self._list_action("Rename", "Rename the conversation", [_RENAME_KEY])
        self._pin_action = self._list_action(
            "Pin", "Keep the conversation at the top, or stop keeping it there", [_PIN_KEY]
        )
        # Backspace too: it is the key labelled Delete on a Mac.
        self._delete_action = self._list_action(
            "Delete", "Delete the conversation; you can undo it", [_DELETE_KEY, "Backspace"]
        )

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DEBOUNCE_MS)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(undo_timeout_ms)

        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self._search_changed)
        self.search.returnPressed.connect(self._open_first_hit)
        self.search.installEventFilter(self)
        self.list.viewport().installEventFilter(self)
        self.list.itemSelectionChanged.connect(self._selection_changed)
        self.list.itemActivated.connect(self._activated)
        self.list.currentItemChanged.connect(lambda *_: self._update_actions())
        self.list.customContextMenuRequested.connect(self._show_menu)
        self._delegate.renamed.connect(self._rename)
        # Queued: the view is still closing the editor when the delegate says it closes.
        self._delegate.closeEditor.connect(lambda *_: QTimer.singleShot(0, self, self.refresh))
        self._rename_action.triggered.connect(self._start_rename)
        self._pin_action.triggered.connect(self._toggle_pin)
        self._delete_action.triggered.connect(self._delete)
        self._search_timer.timeout.connect(self.refresh)
        self._undo_timer.timeout.connect(self._dismiss_undo)
        self.undo_button.clicked.connect(self._undo)

        self.refresh()

    # Public

    def refresh(self) -> None:
        """Rebuild from the store: the search results while searching, else the list. While
        a title is being edited this waits: the editor's closing rebuilds."""
        if self.list.state() == QAbstractItemView.State.EditingState:
            return
        query = self.search.text().strip()
        hits: list[SearchHit] = []
        conversations: list[Conversation] = []
        if query:
            self._try(lambda: hits.extend(self._store.search(query)))
            self.empty_label.setText(f"No matches for “{query}”")
        else:
            self._try(lambda: conversations.extend(self._store.list_conversations()))
            self.empty_label.setText("No conversations yet\n\nStart one with New chat.")
        with QSignalBlocker(self.list):
            self.list.clear()
            for hit in hits:
                self._add_hit(hit)
            self._add_conversations(conversations)
            self._highlight_current()
        self._pages.setCurrentWidget(self.list if self.list.count() else self.empty_label)
        self._update_actions()

    def select(self, conversation_id: str | None) -> None:
        """Show `conversation_id` as the open one (None: none); emits nothing. A search that
        hides it is forgotten: a chat just made or imported must show in the list."""
        self._current_id = conversation_id
        if self.search.text().strip() and conversation_id not in self._shown_ids():
            self._clear_search()
            self.refresh()
        with QSignalBlocker(self.list):
            self.list.clearSelection()
            self._highlight_current()
        self._update_actions()

    def current_id(self) -> str | None:
        return self._current_id

    def _clear_search(self) -> None:
        """Forget the search without a refresh of its own: the caller refreshes."""
        self._search_timer.stop()
        with QSignalBlocker(self.search):
            self.search.clear()

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    # Building the list

    def _shown_ids(self) -> set[str]:
        return {self.list.item(row).data(_ID) for row in range(self.list.count())}

    def _add_conversations(self, conversations: list[Conversation]) -> None:
        today = date.today()
        heading = None
        for conversation in conversations:
            group = PINNED if conversation.pinned else date_group(conversation.updated_at, today)
            if group != heading:
                self._add_header(group)
                heading = group
            title = conversation.title or UNTITLED
            item = QListWidgetItem(title, self.list)
            item.setData(_KIND, _ROW)
            item.setData(_ID, conversation.id)
            item.setData(_TITLE, conversation.title)
            item.setData(_PINNED, conversation.pinned)
            updated = datetime.fromtimestamp(conversation.updated_at)
            imported, served = imported_note(conversation), served_note(conversation)
            note = "".join(f"\n{words}" for words in (imported, served) if words)
            item.setToolTip(f"{title}\nUpdated {updated:%Y-%m-%d %H:%M}{note}")
            item.setData(_TAG, API_TAG if served else None)
            flags = {"pinned": conversation.pinned, "imported": imported, "from the API": served}
            marks = "".join(f", {mark}" for mark, on in flags.items() if on)
            item.setData(Qt.ItemDataRole.AccessibleTextRole, f"{title}{marks}")
            item.setFlags(
                Qt.ItemFlag.ItemIsEnabled
                | Qt.ItemFlag.ItemIsSelectable
                | Qt.ItemFlag.ItemIsEditable
            )

    def _add_header(self, text: str) -> None:
        item = QListWidgetItem(text, self.list)
        item.setData(_KIND, _HEADER)
        item.setData(Qt.ItemDataRole.AccessibleTextRole, f"{text}:")
        item.setFlags(Qt.ItemFlag.NoItemFlags)

    def _add_hit(self, hit: SearchHit) -> None:
        title = hit.title or UNTITLED
        item = QListWidgetItem(title, self.list)
        item.setData(_KIND, _HIT)
        item.setData(_ID, hit.conversation_id)
        item.setData(_TITLE, hit.title)
        item.setData(_SNIPPET, hit.snippet)
        item.setData(_IN_TITLE, hit.message_id is None)
        item.setData(_MESSAGE, hit.message_id)
        plain = hit.snippet.replace("«", "").replace("»", "")
        item.setToolTip(f"{title}\n{plain}")
        item.setData(Qt.ItemDataRole.AccessibleTextRole, f"{title}: {plain}")
        item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)

    def _highlight_current(self) -> None:
        """Select the open conversation's row, if shown; the caller blocks signals."""
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(_ID) is not None and item.data(_ID) == self._current_id:
                self.list.setCurrentItem(item)
                self.list.scrollToItem(item)
                return

    # Reacting to the user

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """A right click opens the menu without opening the conversation under it; Down and
        Esc in the search field move into the results and clear the search. Esc is the
        window's Stop shortcut too: the field claims it while it has a search to clear."""
        if watched is self.list.viewport() and isinstance(event, QMouseEvent):
            pressed = event.type() in (
                QEvent.Type.MouseButtonPress,
                QEvent.Type.MouseButtonDblClick,
            )
            return pressed and event.button() == Qt.MouseButton.RightButton
        if (
            watched is self.search
            and isinstance(event, QKeyEvent)
            and event.type() == QEvent.Type.ShortcutOverride
            and event.key() == Qt.Key.Key_Escape
            and self.search.text()
        ):
            event.accept()  # a key press for the field, not the Stop shortcut
            return True
        if (
            watched is self.search
            and isinstance(event, QKeyEvent)
            and event.type() == QEvent.Type.KeyPress
        ):
            if event.key() == Qt.Key.Key_Down and self.list.count():
                self._focus_first_row()
                return True
            if event.key() == Qt.Key.Key_Escape and self.search.text():
                self.search.clear()
                return True
        return super().eventFilter(watched, event)

    def _search_changed(self, text: str) -> None:
        if text.strip():
            self._search_timer.start()
        else:
            self._search_timer.stop()
            self.refresh()

    def _open_first_hit(self) -> None:
        self._search_timer.stop()
        self.refresh()
        for row in range(self.list.count()):
            if self.list.item(row).flags() & Qt.ItemFlag.ItemIsSelectable:
                self.list.setCurrentRow(row)
                return

    def _focus_first_row(self) -> None:
        """Into the list at its first row, shown as current (a ring), not opened yet."""
        self.list.setFocus(Qt.FocusReason.TabFocusReason)
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.flags() & Qt.ItemFlag.ItemIsSelectable:
                self.list.setCurrentRow(row, QItemSelectionModel.SelectionFlag.NoUpdate)
                self.list.scrollToItem(item)
                return

    def _activated(self, item: QListWidgetItem) -> None:
        """Enter on a row opens it, also when it is only current."""
        if item.flags() & Qt.ItemFlag.ItemIsSelectable:
            self.list.setCurrentItem(item)

    def _selection_changed(self) -> None:
        selected = self.list.selectedItems()
        if not selected:
            return
        conversation_id = selected[0].data(_ID)
        if conversation_id != self._current_id:
            self._current_id = conversation_id
            self.conversation_selected.emit(conversation_id)
        if selected[0].data(_MESSAGE):
            self.message_selected.emit(selected[0].data(_MESSAGE))

    def _list_action(self, text: str, tip: str, keys: list[str]) -> QAction:
        """An action of the selected row, on its key while the list has focus and in the
        context menu."""
        action = QAction(text, self.list)
        action.setToolTip(f"{tip} ({_keys(keys[0])})")
        action.setShortcuts([QKeySequence(key) for key in keys])
        action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.list.addAction(action)
        return action

    def _target(self) -> QListWidgetItem | None:
        """The row the actions apply to: the one right-clicked, else the selected one. Found
        by id, since an action may rebuild the list while the menu is open."""
        if self._menu_id is None:
            item = self.list.currentItem()
            return item if item is not None and item.data(_KIND) == _ROW else None
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(_KIND) == _ROW and item.data(_ID) == self._menu_id:
                return item
        return None

    def _update_actions(self) -> None:
        item = self._target()
        for action in (self._rename_action, self._pin_action, self._delete_action):
            action.setEnabled(item is not None)
        pinned = item is not None and item.data(_PINNED)
        self._pin_action.setText("Unpin" if pinned else "Pin")

    def _show_menu(self, position: QPoint) -> None:
        item = self.list.itemAt(position)
        if item is None or item.data(_KIND) != _ROW:
            return
        self._menu_id = item.data(_ID)
        self._update_actions()
        menu = QMenu(self)
        menu.setAccessibleName("Conversation actions")
        menu.setToolTipsVisible(True)
        menu.addActions([self._rename_action, self._pin_action])
        menu.addSeparator()
        menu.addAction(self._delete_action)
        menu.exec(self.list.viewport().mapToGlobal(position))
        self._menu_id = None
        self._update_actions()

    def _start_rename(self) -> None:
        item = self._target()
        if item is not None:
            self.list.editItem(item)

    def _rename(self, conversation_id: str, title: str) -> None:
        if self._try(lambda: self._store.rename(conversation_id, title)):
            self.conversation_renamed.emit(conversation_id)

    def _toggle_pin(self) -> None:
        item = self._target()
        if item is not None:
            self._try(lambda: self._store.set_pinned(item.data(_ID), not item.data(_PINNED)))
            self.refresh()

    def _delete(self) -> None:
        item = self._target()
        if item is None:
            return
        conversation_id = item.data(_ID)
        if not self._try(lambda: self._store.delete(conversation_id)):
            return
        was_open = conversation_id == self._current_id
        if was_open:
            self._current_id = None
        self._deleted = (conversation_id, was_open)
        self.refresh()
        self.undo_bar.show()
        self._undo_timer.start()
        self.conversation_deleted.emit(conversation_id)

    def _undo(self) -> None:
        """Restore the last deleted conversation and, if it was open, open it again."""
        if self._deleted is None:
            return
        conversation_id, was_open = self._deleted
        self._dismiss_undo()
        if not self._try(lambda: self._store.restore(conversation_id)):
            return
        if was_open:
            self._current_id = conversation_id
        self.refresh()
        if was_open:
            self.conversation_selected.emit(conversation_id)

    def _dismiss_undo(self) -> None:
        """The delete stands: it stays soft, hidden from lists and search."""
        self._undo_timer.stop()
        self._deleted = None
        self.undo_bar.hide()

    def _try(self, change: Callable[[], object]) -> bool:
        """Run a store call; on a StoreError, show its message (written for the user)."""
        try:
            change()
        except StoreError as error:
            QMessageBox.warning(self, "Stoke", str(error))
            return False
        return True


def _snippet_height(document: QTextDocument) -> float:
    """The height of the snippet's first lines, where it is cut (it is a fragment anyway)."""
    document.documentLayout().documentSize()  # lays the text out
    layout = document.firstBlock().layout()
    shown = min(layout.lineCount(), _SNIPPET_LINES)
    return layout.lineAt(shown - 1).rect().bottom() if shown else 0.0


def _keys(sequence: str | QKeySequence.StandardKey) -> str:
    """A shortcut as this platform writes it (⌘ on a Mac)."""
    return QKeySequence(sequence).toString(QKeySequence.SequenceFormat.NativeText)


def _header_font(base: QFont) -> QFont:
    font = QFont(base)
    font.setPointSizeF(max(base.pointSizeF() * 0.85, 7.0))
    font.setWeight(QFont.Weight.DemiBold)
    return font


def _set_theme_icon(button: QPushButton, icon: QIcon.ThemeIcon) -> None:
    """Use the platform's icon where it has one; the text alone reads fine without."""
    themed = QIcon.fromTheme(icon)
    if not themed.isNull():
        button.setIcon(themed)
