"""PySide6 widgets. Renders Cycle events; no numerics, no direct engine calls from widgets."""
