"""Reading a document the user dropped or opened: .txt, .md, .html, .pdf."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

from .errors import SpeculumError

SUPPORTED = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")
MAX_FILE_BYTES = 20 * 1000 * 1000  # a document larger than this is refused before it is read
MAX_CHARS = 5_000_000  # about a thousand pages: far past any model's context, even in parts
BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


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


def _utf16_without_bom(raw: bytes) -> str | None:
    """'utf-16-le' or '-be' when NUL bytes sit mostly at odd or even offsets, as in mostly-ASCII
    UTF-16 text; None otherwise."""
    sample = raw[:65536]
    if len(sample) < 2:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    if odd > 0.3 * half and even < 0.05 * half:
        return "utf-16-le"
    if even > 0.3 * half and odd < 0.05 * half:
        return "utf-16-be"
    return None


def decode_text(raw: bytes, name: str) -> str:
    """A text file's bytes as text: a BOM names the encoding; UTF-16 without one is told by its NUL
    bytes; then UTF-8, then Windows-1252 (legacy Western text). Other binary data is refused."""
    for bom, encoding in BOMS:
        if raw.startswith(bom):
            try:
                return raw[len(bom):].decode(encoding)
            except UnicodeDecodeError:
                raise SpeculumError(f"{name} starts like {encoding.upper()} text but is not valid "
                                    f"{encoding.upper()}.") from None
    guess = _utf16_without_bom(raw)
    if guess:
        try:
            return raw.decode(guess)
        except UnicodeDecodeError:
            pass
    if b"\0" in raw:
        raise SpeculumError(f"{name} is not a text file (it holds binary data).")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def _too_long(name: str) -> SpeculumError:
    return SpeculumError(f"{name} holds more than {MAX_CHARS:,} characters of text; Speculum summarises "
                         "documents up to that length. Split it, or paste the part you need.")


def _pdf_text(path: Path) -> str:
    try:
        from pypdf import PdfReader

        reader = PdfReader(str(path))
        pages, length = [], 0
        for page in reader.pages:
            pages.append((page.extract_text() or "").strip())
            length += len(pages[-1]) + 2
            if length > MAX_CHARS:
                raise _too_long(path.name)
    except SpeculumError:
        raise
    except Exception as exc:  # pypdf raises many types for damaged files
        raise SpeculumError(f"Could not read the PDF {path.name}: {exc}") from None
    text = "\n\n".join(pages).strip()
    if not text:
        raise SpeculumError(f"{path.name} has no text layer (a scanned PDF?); nothing to summarise.")
    return text


def read_document(path: str | Path) -> str:
    """A document's text. Slow for a large PDF: the window calls it off its UI thread."""
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise SpeculumError(f"Document not found: {path}")
    if suffix not in SUPPORTED:
        raise SpeculumError(f"{path.name}: Speculum reads {', '.join(SUPPORTED)} files, not '{suffix}'.")
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
                raise SpeculumError(f"{path.name} is larger than {MAX_FILE_BYTES // 1000 // 1000} MB; Speculum "
                                    "reads documents up to that size. Split it, or paste the part you need.")
            raw = f.read(MAX_FILE_BYTES + 1) if suffix != ".pdf" else b""
    except OSError as exc:
        raise SpeculumError(f"Could not read {path.name}: {exc.strerror or exc}.") from None
    if suffix == ".pdf":
        return _pdf_text(path)
    if len(raw) > MAX_FILE_BYTES:  # the file grew while it was read
        raise SpeculumError(f"{path.name} is larger than {MAX_FILE_BYTES // 1000 // 1000} MB.")
    text = decode_text(raw, path.name)
    text = html_to_text(text) if suffix in (".html", ".htm") else text
    if len(text) > MAX_CHARS:
        raise _too_long(path.name)
    return text
