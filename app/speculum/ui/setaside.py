"""What the app set aside of its saved files at start, said once, in plain words."""

from __future__ import annotations

from .. import paths


def saved_state_notice() -> str:
    """Read the saved files the window does not read at start itself (the model library's state),
    then take every notice of a file set aside so far: one message, or "" when all was well."""
    try:
        from ..models.library import Library

        Library(pairs=[]).check_state()
    except Exception:  # noqa: BLE001 - the library is optional to the window; its dialog reports
        pass
    notices = list(paths.set_aside_notices)
    paths.set_aside_notices.clear()
    if not notices:
        return ""
    return ("Some saved files were damaged or written by another version. What could be used is kept; "
            "the rest was set aside:\n" + "\n".join(f"• {n}" for n in notices))
