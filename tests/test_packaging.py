"""What can be checked about the bundle recipes without building one.

The PyInstaller spec is executed with PyInstaller's build classes replaced by recorders,
once per platform, so the Windows and macOS branches are checked here too. Building
and running the Linux bundle is done by packaging/build-linux.sh (see packaging/README.md).
"""

import ast
import configparser
import re
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGING = REPO / "packaging"
SPEC = PACKAGING / "speculum.spec"
RESOURCES = REPO / "resources"


class Recorder:
    """Stands in for Analysis, PYZ, EXE, COLLECT, BUNDLE: keeps its arguments."""

    made: list = []

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        Recorder.made.append(self)
        # What Analysis exposes to the rest of the spec.
        self.binaries = [(dest, "/venv/" + dest, "BINARY") for dest in (
            "llama_cpp/lib/libllama.so",
            "PySide6/Qt/lib/libQt6Widgets.so.6",
            "PySide6/Qt/plugins/platforms/libqxcb.so",
            "PySide6/Qt/plugins/platforms/libqeglfs.so",
            "PySide6/Qt/plugins/imageformats/libqpdf.so",
            "PySide6/Qt/plugins/generic/libqevdevmouseplugin.so",
        )]
        self.datas, self.scripts, self.pure = [], [], []


def _kind(name):
    return type(name, (Recorder,), {})


def run_spec(monkeypatch, platform: str) -> dict:
    """Execute the spec as PyInstaller would on ``platform``; return the recorded calls by kind."""
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_submodules = lambda package: [f"{package}.cli", f"{package}.selftest"]
    qt = types.ModuleType("PyInstaller.utils.hooks.qt")
    qt.QtLibraryInfo = type("QtLibraryInfo", (), {"collect_plugins": _all_plugins})
    hooks.qt = qt
    win32 = types.ModuleType("PyInstaller.utils.win32")
    versioninfo = types.ModuleType("PyInstaller.utils.win32.versioninfo")
    for name in ("VSVersionInfo", "FixedFileInfo", "StringFileInfo", "StringTable", "StringStruct",
                 "VarFileInfo", "VarStruct"):
        setattr(versioninfo, name, _kind(name))
    win32.versioninfo = versioninfo
    for name, module in {"PyInstaller": types.ModuleType("PyInstaller"),
                         "PyInstaller.utils": types.ModuleType("PyInstaller.utils"),
                         "PyInstaller.utils.hooks": hooks, "PyInstaller.utils.hooks.qt": qt,
                         "PyInstaller.utils.win32": win32,
                         "PyInstaller.utils.win32.versioninfo": versioninfo}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the spec prepends app/
    Recorder.made = []
    namespace = {"SPECPATH": str(PACKAGING), "__file__": str(SPEC)}
    for name in ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE"):
        namespace[name] = _kind(name)
    exec(compile(SPEC.read_text(), str(SPEC), "exec"), namespace)
    calls: dict = {}
    for made in Recorder.made:
        calls.setdefault(type(made).__name__, []).append(made)
    calls["namespace"] = namespace
    calls["qt"] = qt.QtLibraryInfo
    return calls


# What PyInstaller's Qt helper would collect, per plugin type, from a PySide6 wheel.
QT_PLUGINS = {
    "platforms": ["libqxcb.so", "libqwayland.so", "libqoffscreen.so", "libqminimal.so", "libqeglfs.so",
                  "libqlinuxfb.so", "libqvnc.so", "libqminimalegl.so", "libqvkkhrdisplay.so"],
    "platformthemes": ["libqgtk3.so", "libqxdgdesktopportal.so"],
    "platforminputcontexts": ["libqtvirtualkeyboardplugin.so", "libibusplatforminputcontextplugin.so"],
    "imageformats": ["libqpdf.so", "libqsvg.so", "libqico.so"],
    "generic": ["libqevdevmouseplugin.so"],
    "egldeviceintegrations": ["libqeglfs-kms-integration.so"],
}


def _all_plugins(self, plugin_type):
    return [(f"/qt/plugins/{plugin_type}/{name}", f"PySide6/Qt/plugins/{plugin_type}")
            for name in QT_PLUGINS.get(plugin_type, [])]


def test_spec_bundles_resources_hooks_and_every_speculum_module(monkeypatch):
    calls = run_spec(monkeypatch, "linux")
    (analysis,) = calls["Analysis"]
    kw = analysis.kwargs
    assert analysis.args[0] == [str(PACKAGING / "speculum_main.py")]
    assert (str(RESOURCES), "resources") in kw["datas"]
    assert kw["pathex"] == [str(REPO / "app")]
    assert "speculum.selftest" in kw["hiddenimports"]
    assert kw["hookspath"] == [str(PACKAGING / "hooks")]
    assert (PACKAGING / "hooks" / "hook-llama_cpp.py").is_file()
    assert "PySide6.QtWebEngineCore" in kw["excludes"] and "PySide6.QtQml" in kw["excludes"]
    assert "PySide6.QtWidgets" not in kw["excludes"] and "PySide6.QtGui" not in kw["excludes"]


def test_spec_keeps_desktop_qt_plugins_and_skips_the_rest_before_dependency_analysis(monkeypatch):
    qt = run_spec(monkeypatch, "linux")["qt"]
    kept = {kind: [src.rsplit("/", 1)[1] for src, _ in qt().collect_plugins(kind)] for kind in QT_PLUGINS}
    assert kept["platforms"] == ["libqxcb.so", "libqwayland.so", "libqoffscreen.so", "libqminimal.so"]
    assert kept["platformthemes"] == ["libqxdgdesktopportal.so"]
    assert kept["platforminputcontexts"] == ["libibusplatforminputcontextplugin.so"]
    assert kept["imageformats"] == ["libqsvg.so", "libqico.so"]
    assert kept["generic"] == [] and kept["egldeviceintegrations"] == []


def test_spec_filters_collected_binaries_the_same_way(monkeypatch):
    calls = run_spec(monkeypatch, "linux")
    kept = [dest for dest, _src, _kind in calls["Analysis"][0].binaries]
    assert kept == ["llama_cpp/lib/libllama.so", "PySide6/Qt/lib/libQt6Widgets.so.6",
                    "PySide6/Qt/plugins/platforms/libqxcb.so"]


def test_spec_stops_when_llama_cpp_was_not_collected(monkeypatch):
    monkeypatch.setattr(Recorder, "__init__", _without_llama(Recorder.__init__))
    with pytest.raises(SystemExit, match="llama.cpp's shared library was not collected"):
        run_spec(monkeypatch, "linux")


def _without_llama(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.binaries = [b for b in self.binaries if not b[0].startswith("llama_cpp/")]
    return patched


def test_linux_gets_one_console_executable_named_speculum(monkeypatch):
    calls = run_spec(monkeypatch, "linux")
    (exe,) = calls["EXE"]
    assert exe.kwargs["name"] == "speculum" and exe.kwargs["console"] is True
    assert calls["COLLECT"][0].kwargs["name"] == "speculum"
    assert "BUNDLE" not in calls


def test_windows_gets_a_window_launcher_and_a_console_launcher(monkeypatch):
    calls = run_spec(monkeypatch, "win32")
    exes = {e.kwargs["name"]: e.kwargs for e in calls["EXE"]}
    assert exes["Speculum"]["console"] is False and exes["speculum-cli"]["console"] is True
    for kw in exes.values():
        assert kw["icon"].endswith("speculum.ico") and Path(kw["icon"]).is_file()
        assert type(kw["version"]).__name__ == "VSVersionInfo"
    collect = calls["COLLECT"][0]
    assert collect.kwargs["name"] == "Speculum" and len(collect.args) == 4  # two exes, binaries, datas
    fixed = calls["FixedFileInfo"][0].kwargs
    assert len(fixed["filevers"]) == 4 and all(isinstance(n, int) for n in fixed["filevers"])


def test_macos_gets_an_arm64_app_with_icon_and_info_plist(monkeypatch):
    from speculum import __version__

    calls = run_spec(monkeypatch, "darwin")
    (exe,) = calls["EXE"]
    assert exe.kwargs["target_arch"] == "arm64"
    # A console EXE would make PyInstaller mark the app LSBackgroundOnly (no Dock icon).
    assert exe.kwargs["console"] is False
    assert Path(exe.kwargs["entitlements_file"]).is_file()
    (bundle,) = calls["BUNDLE"]
    kw = bundle.kwargs
    assert kw["name"] == "Speculum.app" and kw["icon"].endswith("speculum.icns")
    assert kw["info_plist"]["CFBundleShortVersionString"] == __version__
    assert kw["info_plist"]["NSHighResolutionCapable"] is True


def _qt_modules_imported_by_speculum() -> set[str]:
    found = set()
    for path in (REPO / "app" / "speculum").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("PySide6.")}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "PySide6":
                    found |= {f"PySide6.{a.name}" for a in node.names}
                elif node.module.startswith("PySide6."):
                    found.add(".".join(node.module.split(".")[:2]))
    return found


def test_no_excluded_qt_module_is_imported_by_speculum(monkeypatch):
    excluded = set(run_spec(monkeypatch, "linux")["namespace"]["QT_EXCLUDES"])
    used = _qt_modules_imported_by_speculum()
    assert not used & excluded, f"app/speculum imports Qt modules the bundle excludes: {used & excluded}"


# --- the llama_cpp hook ---------------------------------------------------------------------

def run_hook(monkeypatch, tmp_path, platform: str, files: list[str]) -> dict:
    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    for name in files:
        (package / "lib" / name).write_bytes(b"\0")
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.get_package_paths = lambda name: (str(tmp_path), str(package))
    monkeypatch.setitem(sys.modules, "PyInstaller", types.ModuleType("PyInstaller"))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils", types.ModuleType("PyInstaller.utils"))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    monkeypatch.setattr(sys, "platform", platform)
    namespace: dict = {}
    hook = PACKAGING / "hooks" / "hook-llama_cpp.py"
    exec(compile(hook.read_text(), str(hook), "exec"), namespace)
    return namespace


def test_llama_hook_takes_each_linux_library_once_under_llama_cpp_lib(monkeypatch, tmp_path):
    files = ["libllama.so", "libllama.so.0", "libllama.so.0.5.0", "libggml.so", "libggml.so.0",
             "libggml-base.so", "libggml-base.so.0", "libggml-cpu.so", "libmtmd.so"]
    ns = run_hook(monkeypatch, tmp_path, "linux", files)
    assert sorted(Path(src).name for src, _ in ns["binaries"]) == ["libggml.so", "libllama.so"]
    assert {dest for _, dest in ns["binaries"]} == {"llama_cpp/lib"}
    assert "llama_cpp.server" in ns["excludedimports"]


def test_llama_hook_takes_the_windows_dlls_but_mtmd(monkeypatch, tmp_path):
    files = ["llama.dll", "ggml.dll", "ggml-base.dll", "ggml-cpu.dll", "ggml-cuda.dll", "mtmd.dll"]
    ns = run_hook(monkeypatch, tmp_path, "win32", files)
    assert sorted(Path(src).name for src, _ in ns["binaries"]) == sorted(files[:-1])


def test_llama_hook_keeps_a_metal_shader_file_as_data_on_macos(monkeypatch, tmp_path):
    files = ["libllama.dylib", "libllama.0.dylib", "libggml.dylib", "libggml-metal.dylib", "ggml-metal.metal"]
    ns = run_hook(monkeypatch, tmp_path, "darwin", files)
    assert sorted(Path(src).name for src, _ in ns["binaries"]) == ["libggml.dylib", "libllama.dylib"]
    assert [(Path(s).name, d) for s, d in ns["datas"]] == [("ggml-metal.metal", "llama_cpp/lib")]


# --- build scripts --------------------------------------------------------------------------

@pytest.mark.parametrize("script", ["build-linux.sh", "build-macos.sh", "build-env.sh", "linux/install-desktop-entry.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(PACKAGING / script)], check=True)


def _script(name):
    """A build script's text, with the shared part it sources."""
    text = (PACKAGING / name).read_text()
    if 'packaging/build-env.sh"' in text:
        text += (PACKAGING / "build-env.sh").read_text()
    return text


def test_every_build_compiles_llama_cpp_portably_and_bypasses_the_wheel_cache():
    for name in ("build-linux.sh", "build-macos.sh", "build-windows.ps1"):
        text = _script(name)
        assert "-DGGML_NATIVE=OFF" in text, name
        assert "--no-cache-dir --force-reinstall" in text, name
        assert "packaging/speculum.spec" in text.replace("\\", "/"), name


def test_gpu_variants_ask_for_their_backend():
    assert "-DGGML_METAL=on -DGGML_METAL_EMBED_LIBRARY=on" in _script("build-macos.sh")
    assert "-DGGML_CUDA=on" in _script("build-linux.sh")
    windows = _script("build-windows.ps1")
    assert '[ValidateSet("cpu", "cuda")]' in windows and "-DGGML_CUDA=on" in windows


def test_constraints_satisfy_pyproject():
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    declared = {Requirement(r).name.lower(): Requirement(r).specifier
                for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    pins = {}
    for line in (PACKAGING / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    for name in ("llama-cpp-python", "pyside6-essentials", "pyside6-addons"):
        assert pins[name] in declared[name], f"{name}=={pins[name]} is outside pyproject's {declared[name]}"


# --- icons and the desktop entry -------------------------------------------------------------

def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_png_icon_is_512_pixels_square():
    assert _png_size((RESOURCES / "icons" / "speculum.png").read_bytes()) == (512, 512)


def test_ico_holds_png_images_from_16_to_256_pixels():
    data = (RESOURCES / "icons" / "speculum.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind) == (0, 1)
    sizes = []
    for i in range(count):
        w, h, _, _, _, _, length, offset = struct.unpack("<BBBBHHII", data[6 + 16 * i: 22 + 16 * i])
        png = data[offset:offset + length]
        actual = _png_size(png)
        assert actual == (w or 256, h or 256)
        sizes.append(actual[0])
    assert {16, 32, 48, 256} <= set(sizes)


def test_icns_holds_every_size_macos_asks_for():
    data = (RESOURCES / "icons" / "speculum.icns").read_bytes()
    assert data[:4] == b"icns" and struct.unpack(">I", data[4:8])[0] == len(data)
    entries, pos = {}, 8
    while pos < len(data):
        kind, length = data[pos:pos + 4].decode(), struct.unpack(">I", data[pos + 4:pos + 8])[0]
        entries[kind] = _png_size(data[pos + 8:pos + length])[0]
        pos += length
    assert pos == len(data)
    assert entries["ic10"] == 1024 and entries["ic07"] == 128 and entries["icp4"] == 16
    assert entries["ic14"] == 512 and entries["ic11"] == 32  # the @2x entries


def test_desktop_entry_launches_speculum_with_its_icon():
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str
    entry.read(RESOURCES / "speculum.desktop")
    d = entry["Desktop Entry"]
    assert d["Type"] == "Application" and d["Name"] == "Speculum"
    assert d["Exec"] == "speculum" and d["Icon"] == "speculum" and d["Terminal"] == "false"
    assert d["Categories"].endswith(";") and d["Keywords"].endswith(";")
    # Qt's X11 window class is the application name set in ui/app.py.
    assert d["StartupWMClass"] == "Speculum"
    assert 'setApplicationName("Speculum")' in (REPO / "app" / "speculum" / "ui" / "app.py").read_text()


def test_install_desktop_entry_points_the_menu_at_the_unpacked_bundle(tmp_path):
    bundle = tmp_path / "opt" / "speculum bundle"
    (bundle / "_internal" / "resources" / "icons").mkdir(parents=True)
    (bundle / "_internal" / "resources" / "icons" / "speculum.png").write_bytes(
        (RESOURCES / "icons" / "speculum.png").read_bytes())
    (bundle / "_internal" / "resources" / "speculum.desktop").write_text((RESOURCES / "speculum.desktop").read_text())
    script = bundle / "install-desktop-entry.sh"
    script.write_text(_script("linux/install-desktop-entry.sh"))
    data = tmp_path / "share"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_DATA_HOME": str(data)}
    subprocess.run(["sh", str(script)], check=True, env=env, capture_output=True)
    installed = (data / "applications" / "speculum.desktop").read_text()
    assert f'Exec="{bundle}/speculum"' in installed.splitlines()
    assert re.search(r"^Icon=speculum$", installed, re.M)
    assert (data / "icons" / "hicolor" / "512x512" / "apps" / "speculum.png").is_file()


def test_bundle_icons_are_the_windows_svg_icon(qapp):
    # The window shows resources/icons/speculum.svg; the bundles' raster icons must be
    # renders of it (rerun packaging/make_icons.py after changing the SVG).
    import numpy as np
    from PySide6.QtGui import QImage
    from PySide6.QtSvg import QSvgRenderer

    sys.path.insert(0, str(PACKAGING))
    try:
        from make_icons import SOURCE, draw
    finally:
        sys.path.remove(str(PACKAGING))

    def pixels(image):
        image = image.convertToFormat(QImage.Format.Format_RGBA8888)
        return np.frombuffer(bytes(image.constBits()), dtype=np.uint8).astype(int)

    fresh = pixels(draw(512, QSvgRenderer(str(SOURCE))))
    committed = pixels(QImage(str(RESOURCES / "icons" / "speculum.png")))
    assert np.abs(fresh - committed).mean() < 2.0
