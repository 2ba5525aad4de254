"""Conversations and the cycle records of their answers, one JSON file each.

Files live under ``data_dir()/conversations``. Every write goes to a temporary file
that is synced and then renamed over the old one, so a crash or kill leaves either
the previous version or the new one, never half a file.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import paths
from .engine.vocabulary import Finish
from .records import RecordError, typed_fields

DEFAULT_TITLE = "New conversation"
# A conversation's id names its file: letters, digits, '_', '-' and '.', never a path.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def valid_id(conversation_id) -> bool:
    return isinstance(conversation_id, str) and ID_PATTERN.fullmatch(conversation_id) is not None


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

    @property
    def unwritten(self) -> bool:
        """An answer stopped before it wrote anything (while its prompt was read): only its note."""
        return self.role == "assistant" and self.finish == Finish.STOPPED and not self.content and not self.cycles


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = DEFAULT_TITLE
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[Message] = field(default_factory=list)
    document: str = ""
    document_name: str = ""
    # Where the document's passages that the summary copied (accepted lookup drafts) sit in it:
    # [start, end) character spans, highlighted again when the conversation is opened.
    document_copies: list[list[int]] = field(default_factory=list)

    def history(self, before: int | None = None) -> list[dict]:
        """The turns the model sees next time, oldest first (those before message ``before``)."""
        return [{"role": m.role, "content": m.content} for m in self.messages[:before] if m.in_history and m.content]

    def json_text(self) -> str:
        """The conversation as JSON text, for its file. Saved after every question and answer, on
        the UI thread: each answer's cycle records (most of the file, and never changed once
        the answer is finished) are encoded once and their text reused."""
        head = {f.name: vars(self)[f.name] for f in fields(self) if f.name != "messages"}
        messages = ",".join(_message_text(m) for m in self.messages)
        return paths.json_text(head)[:-1] + ',"messages":[' + messages + "]}"

    @classmethod
    def from_json(cls, d: dict, problems: list[str] | None = None) -> "Conversation":
        """A saved conversation, keeping what is valid: a field of the wrong type takes its
        default, a message that is not a message is dropped, an answer whose cycle records are
        damaged keeps its text but not its replay. What was left out is added to ``problems``."""
        problems = [] if problems is None else problems
        fields, wrong = typed_fields(cls, {k: v for k, v in d.items() if k != "messages"})
        problems += wrong
        if "id" in fields and not valid_id(fields["id"]):
            problems.append("its id was not a plain name")
            del fields["id"]
        copies = fields.get("document_copies", [])
        kept = [span for span in copies
                if len(span) == 2 and 0 <= span[0] < span[1] <= len(fields.get("document", ""))]
        if len(kept) != len(copies):
            problems.append("some of its document's copied passages lay outside the document")
            fields["document_copies"] = kept
        raw = d.get("messages", [])
        if not isinstance(raw, list):
            problems.append("'messages' was not a list")
            raw = []
        messages = []
        for i, m in enumerate(raw):
            message = _message(m, i + 1, problems)
            if message is not None:
                messages.append(message)
        return cls(messages=messages, **fields)


def _message_text(m: Message) -> str:
    rest = paths.json_text({f.name: vars(m)[f.name] for f in fields(Message) if f.name != "cycles"})
    cached = vars(m).get("_cycles_text")  # (the list, its length, its text), once encoded
    if cached is None or cached[0] is not m.cycles or cached[1] != len(m.cycles):
        cached = (m.cycles, len(m.cycles), paths.json_text(m.cycles))
        m._cycles_text = cached  # not a field: never compared, shown or saved
    return rest[:-1] + ',"cycles":' + cached[2] + "}"


def _message(m, number: int, problems: list[str]) -> Message | None:
    from .engine.cycle import Cycle  # a plain record type

    if not isinstance(m, dict):
        problems.append(f"message {number} was not an object")
        return None
    fields, wrong = typed_fields(Message, m)
    if fields.get("role") not in ("user", "assistant") or "content" not in fields:
        problems.append(f"message {number} had no role or text")
        return None
    problems += [f"message {number}: {w}" for w in wrong]
    stats = fields.get("stats", {})
    numbers = {k: v for k, v in stats.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if len(numbers) != len(stats):
        problems.append(f"message {number}: some of its statistics were not numbers")
        fields["stats"] = numbers
    try:
        for record in fields.get("cycles", []):
            Cycle.from_json(record)
    except RecordError as exc:
        problems.append(f"message {number}: {exc}; its replay is left out")
        fields["cycles"] = []
    return Message(**fields)


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or paths.data_dir() / "conversations"

    def _path(self, conversation_id: str) -> Path:
        """The conversation's file, always directly inside the folder (an id is never a path)."""
        path = self.folder / f"{conversation_id}.json"
        if not valid_id(conversation_id) or path.resolve().parent != self.folder.resolve():
            raise ValueError(f"{conversation_id!r} is not a conversation id")
        return path

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first. A file of the wrong shape is
        set aside (``paths.set_aside``); one that is partly damaged keeps its valid part."""
        found = []
        if self.folder.is_dir():
            for path in sorted(self.folder.glob("*.json")):
                conversation = self._read(path)
                if conversation is not None:
                    found.append(conversation)
        return sorted(found, key=lambda c: c.updated, reverse=True)

    def _read(self, path: Path) -> Conversation | None:
        data = paths.read_json_object(path)
        if data is None:
            return None
        problems: list[str] = []
        conversation = Conversation.from_json(data, problems)
        if valid_id(path.stem):
            conversation.id = path.stem  # the file's name is its id: saving writes back to it
        elif not valid_id(data.get("id")) or (self.folder / f"{data['id']}.json").exists():
            conversation.id = Conversation().id
        if conversation.id != path.stem:
            paths.set_aside(path, "its name is not a conversation id; saved again under a new one")
        elif problems:
            paths.set_aside(path, "; ".join(problems[:3]) + (" …" if len(problems) > 3 else ""),
                            keep_original=True)
        else:
            return conversation
        try:
            paths.write_text_atomic(self._path(conversation.id), conversation.json_text())
        except OSError:
            pass  # the valid part is still shown; it is saved with the next change
        return conversation

    def save(self, conversation: Conversation) -> None:
        conversation.updated = time.time()
        paths.write_text_atomic(self._path(conversation.id), conversation.json_text())

    def delete(self, conversation_id: str) -> None:
        from .engine.drafting import ngrammemory  # numpy only: no model is loaded here

        self._path(conversation_id).unlink(missing_ok=True)
        ngrammemory.forget(conversation_id)  # what it wrote and read is not drafted from again
