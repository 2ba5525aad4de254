"""Text from models, files and saved state, shown without letting it load anything.

Qt guesses that a QLabel, a tooltip or a message box holds rich text when it looks like
HTML, and its rich-text engine loads every image it names: ``<img src="/dev/zero">`` reads
until memory runs out, ``//host/share/a.png`` opens an SMB connection on Windows. Model
answers are Markdown, which has image syntax of its own. So:

- Markdown is parsed with raw HTML off and its image syntax escaped; any image the parser
  still made is put back as the literal text it came from, before anything lays it out;
- documents that render it refuse every resource load (``RefusingResources``);
- labels and message boxes that show file, model or document text are plain text, and
  tooltips (which have no plain-text switch) are escaped.
"""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QTextCursor, QTextDocument, QTextDocumentFragment, QTextFormat
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget

MARKDOWN = QTextDocument.MarkdownFeature(QTextDocument.MarkdownDialectGitHub.value
                                         | QTextDocument.MarkdownNoHTML.value)
ALT_TEXT = getattr(QTextFormat, "ImageAltText", None)  # library: Qt 6.8 and later keep an image's alt text


def _blank_image() -> QImage:
    # Not a null image: Qt's image handler falls back to reading the file itself when the
    # document's answer is null, so a refusal has to be a real (empty-looking) picture.
    image = QImage(1, 1, QImage.Format_ARGB32)
    image.fill(0)
    return image


class RefusingResources:
    """Mix into a QTextDocument or QTextBrowser subclass (first base): no resource of any kind,
    from any URL, is ever loaded; images get a transparent pixel, everything else nothing."""

    def loadResource(self, kind, url):  # noqa: N802 - Qt's name
        return _blank_image() if kind == QTextDocument.ImageResource else None


class SafeDocument(RefusingResources, QTextDocument):
    """A scratch document that parses Markdown and loads nothing."""


def _neutralise(document: QTextDocument) -> None:
    """Replace each image object with the Markdown it was written as, ``![alt](url)``, and drop
    link titles (Markdown's ``[a](url "title")`` becomes a tooltip, and tooltips guess HTML)."""
    images, titled = [], []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.isImageFormat() or fmt.objectType() != QTextFormat.NoObject:
                image = fmt.toImageFormat()
                alt = image.stringProperty(ALT_TEXT) if ALT_TEXT is not None else ""
                images.append((frag.position(), frag.length(), f"![{alt}]({image.name()})"))
            elif fmt.hasProperty(QTextFormat.TextToolTip):
                titled.append((frag.position(), frag.length()))
            it += 1
        block = block.next()
    for position, length in titled:
        cursor = QTextCursor(document)
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.KeepAnchor)
        fmt = cursor.charFormat()
        fmt.clearProperty(QTextFormat.TextToolTip)
        cursor.setCharFormat(fmt)
    for position, length, text in reversed(images):
        cursor = QTextCursor(document)
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.KeepAnchor)
        plain = cursor.charFormat()
        for prop in (QTextFormat.ObjectType, QTextFormat.ImageName, QTextFormat.TextToolTip):
            plain.clearProperty(prop)
        cursor.insertText(text * length, plain)  # equal images side by side share one fragment


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.*?[^`])?\1(?!`)", re.S)


def images_as_text(markdown: str) -> str:
    """Escape the ``![`` that opens a Markdown image, so ``![x](url)`` reads as those characters
    (even with no alt text, which Qt would otherwise drop silently), and keep each line break the
    model wrote (Markdown joins a paragraph's lines: a poem, an address or steps without list
    markers read as one run-on line). Code is left as written: fenced blocks and inline code
    spans show their text literally anyway."""
    out, fence, indented = [], "", False
    for line in markdown.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        if line.startswith(("    ", "\t")) and (indented or not out or not out[-1].strip()):
            indented = True  # an indented code block (a list's indented paragraph looks the same:
            out.append(line)  # its image, if any, is made text after parsing)
            continue
        if line.strip():
            indented = False
        pieces, at = [], 0
        for span in _CODE_SPAN.finditer(line):
            pieces.append(line[at:span.start()].replace("![", "!\\["))
            pieces.append(span.group(0))
            at = span.end()
        pieces.append(line[at:].replace("![", "!\\["))
        text = "".join(pieces)
        body = text.rstrip("\r\n")
        if body.strip() and body != text and not body.endswith(("  ", "\\")):
            text = body + "  " + text[len(body):]  # a hard line break; ignored where a block ends
        out.append(text)
    return "".join(out)


def opening_code(markdown: str) -> str | None:
    """The language of the code block a Markdown text opens with ("" where it names none); None
    when it opens with anything else. (Inserted into a document, a fragment's first block merges
    into the block at the cursor and takes that block's format: a code block's fence is lost.)"""
    for line in markdown.splitlines():
        if not line.strip():
            continue
        fence = _FENCE.match(line)
        if fence:
            info = line[fence.end():].split()
            return info[0] if info else ""
        return "" if line.startswith(("    ", "\t")) else None
    return None


def markdown_fragment(markdown: str) -> QTextDocumentFragment:
    """Markdown as a fragment to insert: no raw HTML, no images, nothing that loads a resource."""
    scratch = SafeDocument()
    fragment = QTextDocumentFragment.fromMarkdown(images_as_text(markdown), MARKDOWN)
    QTextCursor(scratch).insertFragment(fragment)
    _neutralise(scratch)
    return QTextDocumentFragment(scratch)


def plain_label(text: str = "", parent: QWidget | None = None, **kwargs) -> QLabel:
    """A QLabel that never reads its text as HTML."""
    label = QLabel(parent, **kwargs)
    label.setTextFormat(Qt.PlainText)
    label.setText(text)
    return label


def escaped_tooltip(text: str) -> str:
    """A tooltip showing ``text`` literally (tooltips guess rich text and have no plain switch)."""
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>" if text else ""


def _box(parent, icon, title: str, text: str, buttons) -> QMessageBox:
    box = QMessageBox(icon, title, text, buttons, parent)
    box.setTextFormat(Qt.PlainText)
    return box


def ask(parent, title: str, text: str) -> bool:
    """A Yes/No question whose text is shown as plain text; True for Yes."""
    box = _box(parent, QMessageBox.Question, title, text, QMessageBox.Yes | QMessageBox.No)
    box.setDefaultButton(QMessageBox.No)
    return box.exec() == QMessageBox.Yes


def warn(parent, title: str, text: str) -> None:
    """A warning whose text is shown as plain text."""
    _box(parent, QMessageBox.Warning, title, text, QMessageBox.Ok).exec()
