"""Turning what the user typed (and a document) into chat messages."""

from __future__ import annotations

SUMMARY_INSTRUCTION = "Summarise the document above in a few short paragraphs."


def document_message(document: str, request: str | None = None) -> str:
    """The user turn for a document task: the document first, the request after it."""
    return f"<document>\n{document.strip()}\n</document>\n\n{(request or SUMMARY_INSTRUCTION).strip()}"


def build_messages(user: str, system: str | None = None, document: str | None = None,
                   history: list[dict] | None = None) -> list[dict]:
    messages: list[dict] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.extend(history or [])
    content = document_message(document, user) if document is not None else user
    messages.append({"role": "user", "content": content})
    return messages
