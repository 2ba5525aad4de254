"""Before the window opens: are the system libraries Qt's X11 plugin needs installed?

Qt 6.5+ links its xcb platform plugin against X11 libraries (``libxcb-cursor0`` first of all)
that common Linux distributions do not install by default. Without them Qt ends with "no Qt
platform plugin could be initialized" and no hint of what to install; this module finds
what is missing (with ``ldd``, without loading Qt) and names the one command that installs it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora package)
PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libICE.so.6": ("libice6", "libICE"),
    "libSM.so.6": ("libsm6", "libSM"),
}


def uses_xcb(environ=os.environ) -> bool:
    """Whether Qt will try its X11 (xcb) plugin: on Linux, unless told otherwise or on Wayland."""
    if not sys.platform.startswith("linux"):
        return False
    platform = environ.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0].split(";")[0] == "xcb"
    return not environ.get("WAYLAND_DISPLAY")


def _xcb_plugin_files() -> list[Path]:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0]) / "Qt"
    return [p for p in (root / "plugins" / "platforms" / "libqxcb.so", root / "lib" / "libQt6XcbQpa.so.6")
            if p.is_file()]


def missing_libraries(files: list[Path] | None = None) -> list[str]:
    """The sonames the xcb plugin needs that the dynamic linker cannot find."""
    if not shutil.which("ldd"):
        return []
    missing: list[str] = []
    for path in _xcb_plugin_files() if files is None else files:
        try:
            out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            name, _, where = line.strip().partition(" => ")
            if where.strip() == "not found" and name not in missing:
                missing.append(name)
    return missing


def install_command(missing: list[str]) -> str:
    """The one command that installs what provides ``missing``, for this distribution's package manager."""
    fedora = shutil.which("dnf") is not None and shutil.which("apt-get") is None
    names: list[str] = []
    for soname in missing:
        debian, rpm = PACKAGES.get(soname, (soname, soname))
        name = rpm if fedora else debian
        if name not in names:
            names.append(name)
    return ("sudo dnf install " if fedora else "sudo apt-get install ") + " ".join(names)


def problem(environ=os.environ) -> str:
    """A plain-words message when the window cannot open for missing system libraries, else ''."""
    if not uses_xcb(environ):
        return ""
    missing = missing_libraries()
    if not missing:
        return ""
    return ("The window cannot open: Qt's X11 plugin needs system libraries that are not installed "
            f"({', '.join(missing)}). Install them with:\n    {install_command(missing)}")


def report() -> str:
    """For `speculum doctor`: what the X11 plugin lacks, wherever this session's display is."""
    if not sys.platform.startswith("linux"):
        return "not needed on this system"
    missing = missing_libraries()
    if not missing:
        return "all present"
    return f"X11 plugin lacks {', '.join(missing)}: {install_command(missing)}"
