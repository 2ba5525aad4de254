"""Reading a document the user dropped or opened: .txt, .md, .html, .pdf."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from .errors import SpeculumError

SUPPORTED = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")


class _TextOfHtml(HTMLParser):
    SKIP = {"script", "style", "head", "noscript"}
    BLOCK = {"p", "div", "br", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "pre", "section", "article"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self._skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self._skip:
            self._skip -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(source: str) -> str:
    parser = _TextOfHtml()
    parser.feed(source)
    text = "".join(parser.parts)  # the parser already turned &amp; and friends into characters
    return re.sub(r"\n\s*\n+", "\n\n", text).strip()


def read_document(path: str | Path) -> str:
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise SpeculumError(f"Document not found: {path}")
    if suffix not in SUPPORTED:
        raise SpeculumError(f"{path.name}: Speculum reads {', '.join(SUPPORTED)} files, not '{suffix}'.")
    if suffix == ".pdf":
        try:
            from pypdf import PdfReader

            reader = PdfReader(str(path))
            text = "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
        except Exception as exc:  # pypdf raises many types for damaged files
            raise SpeculumError(f"Could not read the PDF {path.name}: {exc}") from None
        if not text.strip():
            raise SpeculumError(f"{path.name} has no text layer (a scanned PDF?); nothing to summarise.")
        return text.strip()
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return html_to_text(text) if suffix in (".html", ".htm") else text
