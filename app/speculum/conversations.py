"""Conversations and the cycle records of their answers, one JSON file each.

Files live under ``data_dir()/conversations``. Every write goes to a temporary file
that is synced and then renamed over the old one, so a crash or kill leaves either
the previous version or the new one, never half a file.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import paths

DEFAULT_TITLE = "New conversation"


@dataclass
class Message:
    role: str  # "user" or "assistant"
    content: str  # what the model sees
    display: str = ""  # what the transcript shows when it differs (a document turn)
    cycles: list[dict] = field(default_factory=list)  # Cycle.to_json() per target pass, for replay
    stats: dict = field(default_factory=dict)  # the generation's final statistics
    mode: str = ""
    finish: str | None = None
    note: str = ""  # why the answer ended early, in plain words
    in_history: bool = True  # False: shown, but not sent back to the model (a part summary)

    @property
    def shown(self) -> str:
        return self.display or self.content


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = DEFAULT_TITLE
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[Message] = field(default_factory=list)
    document: str = ""
    document_name: str = ""

    def history(self) -> list[dict]:
        """The turns the model sees next time, oldest first."""
        return [{"role": m.role, "content": m.content} for m in self.messages if m.in_history and m.content]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Conversation":
        names = Message.__dataclass_fields__.keys()
        messages = [Message(**{k: v for k, v in m.items() if k in names}) for m in d.get("messages", [])]
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "messages"}
        return cls(messages=messages, **fields)


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or paths.data_dir() / "conversations"

    def _path(self, conversation_id: str) -> Path:
        return self.folder / f"{conversation_id}.json"

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first; a damaged file is skipped."""
        found = []
        if self.folder.is_dir():
            for path in self.folder.glob("*.json"):
                try:
                    found.append(Conversation.from_json(json.loads(path.read_text(encoding="utf-8"))))
                except (OSError, ValueError, TypeError):
                    continue
        return sorted(found, key=lambda c: c.updated, reverse=True)

    def save(self, conversation: Conversation) -> None:
        conversation.updated = time.time()
        paths.write_json_atomic(self._path(conversation.id), conversation.to_json())

    def delete(self, conversation_id: str) -> None:
        self._path(conversation_id).unlink(missing_ok=True)
