"""The conversations in the sidebar: the list, New / Rename / Delete, titles, and saving them.

The list owns the conversations and their store. Opening one (showing its messages, its
document, its last answer's replay) is the window's: the list asks for it with ``picked``
and ``created``.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QPushButton, QVBoxLayout, QWidget

from ...conversations import DEFAULT_TITLE, Conversation, ConversationStore
from .richtext import ask

TITLE_CHARS = 48


def distinct_title(base: str, taken) -> str:
    """``base``, or "base (2)", "base (3)", … : the first no other conversation has (five chats
    that began with the same words were five identical rows)."""
    taken = set(taken)
    title, n = base, 1
    while title in taken:
        n += 1
        title = f"{base} ({n})"
    return title


class ConversationList(QWidget):
    picked = Signal(str)  # the user chose a conversation in the list
    created = Signal(str)  # a new, empty conversation is in the list
    deleteRequested = Signal()  # the Delete button: the window knows whether an answer is being written to it
    error = Signal(str)  # a conversation could not be saved; it stays open

    def __init__(self, store: ConversationStore, parent=None):
        super().__init__(parent)
        self.store = store
        self.conversations: list[Conversation] = []
        self.current: Conversation | None = None
        self.view = QListWidget(objectName="conversationList")
        self.view.setTextElideMode(Qt.ElideRight)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.new_button = QPushButton("New")
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        buttons = QHBoxLayout()
        for b in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(b)
        title = QLabel("Conversations")
        title.setObjectName("paneTitle")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)  # it sits in the sidebar's own margins
        lay.addWidget(title)
        lay.addWidget(self.view, 1)
        lay.addLayout(buttons)
        self.new_button.clicked.connect(self.create)
        self.rename_button.clicked.connect(self._edit_title)
        self.delete_button.clicked.connect(self.deleteRequested)
        self.view.currentItemChanged.connect(self._on_picked)
        self.view.itemChanged.connect(self._on_title_edited)

    def load(self, wanted_id: str) -> str:
        """Read the stored conversations; the id of the one to open (``wanted_id`` when it is there)."""
        self.conversations = self.store.load_all()
        if not self.conversations:
            self.conversations = [Conversation()]
        self.fill()
        return next((c for c in self.conversations if c.id == wanted_id), self.conversations[0]).id

    def fill(self) -> None:
        self.view.blockSignals(True)
        self.view.clear()
        for c in self.conversations:
            item = QListWidgetItem(c.title)
            item.setData(Qt.UserRole, c.id)
            item.setFlags(item.flags() | Qt.ItemIsEditable)
            self.view.addItem(item)
            if self.current is not None and c.id == self.current.id:
                self.view.setCurrentItem(item)
        self.view.blockSignals(False)

    def _item(self, conversation_id: str) -> QListWidgetItem | None:
        for row in range(self.view.count()):
            item = self.view.item(row)
            if item.data(Qt.UserRole) == conversation_id:
                return item
        return None

    def _set_item_text(self, conversation_id: str, text: str) -> None:
        item = self._item(conversation_id)
        if item is not None and item.text() != text:
            self.view.blockSignals(True)
            item.setText(text)
            self.view.blockSignals(False)

    def conversation(self, conversation_id: str) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conversation_id), None)

    def open(self, conversation_id: str) -> Conversation | None:
        """Make ``conversation_id`` the current one and select it, without asking the window again."""
        conv = self.conversation(conversation_id)
        if conv is None:
            return None
        self.current = conv
        item = self._item(conv.id)
        if item is not None and self.view.currentItem() is not item:
            self.view.blockSignals(True)
            self.view.setCurrentItem(item)
            self.view.blockSignals(False)
        return conv

    def _on_picked(self, item, _previous=None) -> None:
        if item is not None:
            self.picked.emit(item.data(Qt.UserRole))

    def create(self) -> Conversation:
        conv = Conversation()
        self.conversations.insert(0, conv)
        self.fill()
        self.created.emit(conv.id)
        return conv

    def set_generating(self, on: bool) -> None:
        """While an answer is written, the conversation it goes to stays open and in the list."""
        self.view.setEnabled(not on)
        self.new_button.setEnabled(not on)
        self.delete_button.setEnabled(not on)

    # -- titles --

    def title_from_question(self, conv: Conversation, text: str) -> None:
        """A new conversation is named after its first question."""
        words = " ".join(text.split())
        self._name(conv, words[:TITLE_CHARS] + ("…" if len(words) > TITLE_CHARS else ""))

    def title_from_document(self, conv: Conversation, name: str) -> None:
        self._name(conv, f"Summary of {name}"[:TITLE_CHARS])

    def _name(self, conv: Conversation, title: str) -> None:
        if conv.title == DEFAULT_TITLE:
            conv.title = distinct_title(title, (c.title for c in self.conversations if c is not conv))
            self._set_item_text(conv.id, conv.title)

    def _edit_title(self) -> None:
        item = self.view.currentItem()
        if item is not None:
            self.view.editItem(item)

    def rename(self, conversation_id: str, title: str) -> None:
        conv = self.conversation(conversation_id)
        title = title.strip()
        if conv is None or not title:
            return
        conv.title = title
        self.save(conv)
        self._set_item_text(conversation_id, title)

    def _on_title_edited(self, item: QListWidgetItem) -> None:
        conv = self.conversation(item.data(Qt.UserRole))
        if conv is not None and item.text().strip() and item.text() != conv.title:
            self.rename(conv.id, item.text())
        elif conv is not None:
            self.view.blockSignals(True)
            item.setText(conv.title)
            self.view.blockSignals(False)

    # -- deleting and saving --

    def delete(self, conv: Conversation, confirm: bool = True) -> str | None:
        """Delete ``conv`` (asking first when it has messages); the id of the conversation to open next."""
        if confirm and conv.messages:
            if not ask(self.window(), "Delete conversation",
                       f"Delete “{conv.title}” and its {len(conv.messages)} messages?"):
                return None
        self.store.delete(conv.id)
        self.conversations.remove(conv)
        if not self.conversations:
            self.conversations.append(Conversation())
        if self.current is conv:
            self.current = None
        self.fill()
        return (self.current or self.conversations[0]).id

    def save(self, conv: Conversation) -> None:
        if not conv.messages and conv.title == DEFAULT_TITLE and not conv.document:
            return  # an empty new conversation is kept in the list, written once it has content
        try:
            self.store.save(conv)
        except OSError as exc:
            self.error.emit(f"Could not save the conversation: {exc.strerror or exc}. It stays open here.")
