"""Which Hub names are safe to download into the library: repositories, revisions, file
paths, checksums. Pure rules, no network: the catalog checks its entries with them and
``remote`` every file it is asked for.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# The Hub's own rules for repository names; '--' is refused too because the library folder of
# OWNER/NAME is OWNER--NAME, and 'a--b/c' and 'a/b--c' must not share one.
_REPO_PART = re.compile(r"[A-Za-z0-9_.\-]{1,96}")
_REVISION = re.compile(r"[A-Za-z0-9_.\-/]{1,256}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Names Windows gives to devices whatever the folder or extension: 'nul.gguf' is no file there.
_DEVICES = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}


def _shown(text: str) -> str:
    return _CONTROL.sub("?", text)[:200]


def _path_problem(path: str) -> str | None:
    """Why a file path inside a repository could land outside its folder on some system, or None."""
    if not path:
        return "the file path is empty"
    for text in {path, unquote(path)}:  # '%5C' is a backslash to the server, and on Windows
        if _CONTROL.search(text):
            return "the file path holds control characters"
        if "\\" in text or ":" in text:
            return "the file path holds a backslash or a colon (a drive letter on Windows)"
        for part in text.split("/"):
            if part in ("", ".", ".."):
                return "the file path has an empty, '.' or '..' part"
            if part[-1] in ". " or part.split(".")[0].lower() in _DEVICES or len(part.encode()) > 255:
                return f"'{part}' is not a file name every system can store"
    return None


def ref_problem(repo: str, path: str, revision: str) -> str | None:
    """Why a Hub file's names are unsafe to download into the library, or None."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) and p[0] not in ".-" and p[-1] not in ".-"
                                  and "--" not in p and ".." not in p for p in parts):
        return "the repository is not OWNER/NAME in letters, digits, '-', '_' and '.'"
    if (not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision
            or revision[0] in "/." or revision[-1] in "/."):
        return "the revision is not a branch, tag or commit name"
    return _path_problem(path)
