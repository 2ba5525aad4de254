"""Documents from disk: encodings told apart, a stated size limit, read off the UI thread."""

from __future__ import annotations

import threading
import time

import pytest

from speculum import documents
from speculum.documents import read_document
from speculum.errors import SpeculumError

TEXT = "Die Bücher der Leuchtturmwärter — ein Logbuch.\nZeile zwei: naïve café, 東京.\n" * 20


@pytest.mark.parametrize("encoding, bom", [
    ("utf-8", b""), ("utf-8", b"\xef\xbb\xbf"), ("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff"),
    ("utf-16-le", b""), ("utf-16-be", b""), ("utf-32-le", b"\xff\xfe\x00\x00"),
])
def test_text_files_are_read_in_their_own_encoding(tmp_path, encoding, bom):
    path = tmp_path / "log.txt"
    path.write_bytes(bom + TEXT.encode(encoding))
    assert read_document(path) == TEXT


def test_legacy_western_text_is_still_read(tmp_path):
    path = tmp_path / "old.txt"
    path.write_bytes("Caf\u00e9 \u201cquoted\u201d".encode("cp1252"))
    assert read_document(path) == "Caf\u00e9 \u201cquoted\u201d"


def test_binary_data_and_oversized_files_are_refused_in_plain_words(tmp_path):
    binary = tmp_path / "photo.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SpeculumError, match="not a text file"):
        read_document(binary)
    big = tmp_path / "big.md"
    with big.open("wb") as f:  # sparse: 21 MB on paper, nothing on disk
        f.truncate(documents.MAX_FILE_BYTES + 1_000_000)
    started = time.monotonic()
    with pytest.raises(SpeculumError, match="larger than 20 MB"):
        read_document(big)
    assert time.monotonic() - started < 1  # refused before reading


def test_text_past_the_character_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "MAX_CHARS", 1000)
    path = tmp_path / "long.html"
    path.write_text("<p>" + "word " * 400 + "</p>", encoding="utf-8")
    with pytest.raises(SpeculumError, match="more than 1,000 characters"):
        read_document(path)


def test_the_pane_reads_files_off_the_ui_thread(qtbot, tmp_path, monkeypatch):
    from speculum.ui.chat import document as pane_module
    from speculum.ui.chat.document import DocumentPane

    release = threading.Event()
    readers = []

    def slow_read(path):  # a large PDF takes seconds
        readers.append(threading.current_thread())
        release.wait(10)
        return "the text of " + path.name

    monkeypatch.setattr(pane_module, "read_document", slow_read)
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.show()
    started = time.monotonic()
    pane.open_path(tmp_path / "first.pdf")
    pane.open_path(tmp_path / "second.pdf")  # asked for while the first is still being read
    assert time.monotonic() - started < 1  # the UI thread did not wait
    assert "Reading second.pdf" in pane.progress.text() and pane.progress.isVisibleTo(pane)
    with qtbot.waitSignal(pane.documentOpened, timeout=10_000) as opened:
        release.set()
    assert opened.args == ["second.pdf"]
    qtbot.wait(100)
    assert pane.text() == "the text of second.pdf" and not pane.progress.isVisibleTo(pane)
    assert readers and all(t is not threading.main_thread() for t in readers)

    monkeypatch.setattr(pane_module, "read_document", documents.read_document)
    with qtbot.waitSignal(pane.error, timeout=10_000) as failed:
        pane.open_path(tmp_path / "missing.txt")
    assert failed.args[0].startswith("Document not found")
    assert pane.text() == "the text of second.pdf"
