"""What a fresh machine meets first: the llama.cpp the README's commands build, and the
system libraries the window needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speculum import cli, qtcheck
from speculum.engine.llama import native as llama  # the gate: what this build and machine can do

REPO = Path(__file__).resolve().parents[1]
NO_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")


def test_the_installed_llama_cpp_has_no_amx_kernels():
    # The README's test command installed this llama.cpp (scripts/setup-env.sh).
    assert not llama.has_amx_kernels(), llama.system_info()
    assert "AMX_INT8 = 1" not in llama.system_info()


def test_setup_env_builds_llama_cpp_with_amx_switched_off_even_on_an_amx_cpu():
    # The flags the venv's llama.cpp was compiled with, as setup-env.sh recorded them.
    stamp = Path(sys.prefix) / ".llama-cmake-args"
    assert stamp.is_file(), "tests run in the venv scripts/setup-env.sh made"
    flags = stamp.read_text()
    for option in ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF", "-DGGML_RPC=on"):
        assert option in flags
    for flag in NO_AMX:
        assert flag in flags
    # GGML_NATIVE compiles for this CPU; on one with AMX (Sapphire Rapids), the flags above must
    # still keep the AMX kernels out: their code is compiled only when __AMX_INT8__ is defined.
    cc = shutil.which("cc") or shutil.which("gcc")
    macros = subprocess.run([cc, *NO_AMX, "-march=sapphirerapids", "-dM", "-E", "-x", "c", "-"],
                            input="", capture_output=True, text=True, check=True).stdout
    assert "__AMX_INT8__" not in macros and "__AVX512VNNI__" in macros
    native = subprocess.run([cc, "-march=sapphirerapids", "-dM", "-E", "-x", "c", "-"],
                            input="", capture_output=True, text=True, check=True).stdout
    assert "__AMX_INT8__" in native  # without them, that CPU would get the kernels


def test_doctor_reports_amx_kernels_and_warns_when_present(capsys, monkeypatch):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr()
    assert "AMX kernels" in out.out and "none" in out.out and "warning" not in out.err
    monkeypatch.setattr(llama, "system_info", lambda: "CPU : AVX2 = 1 | AMX_INT8 = 1 | OPENMP = 1 |")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr()
    assert "compiled in" in out.out and "issue 20824" in out.out
    assert "warning" in out.err and "setup-env.sh" in out.err


def test_gpu_backend_is_none_for_a_cpu_build_with_rpc():
    # The RPC backend makes llama_supports_gpu_offload() true; only a local GPU device counts.
    if any(name in llama.system_info().upper() for name in ("CUDA", "METAL", "VULKAN", "HIP")):
        assert llama.gpu_backend() is not None
    else:
        assert llama.lc.llama_supports_gpu_offload()  # RPC is built in (scripts/setup-env.sh)
        assert llama.gpu_backend() is None


@pytest.fixture
def plugin_missing_a_library(tmp_path):
    """A plugin needing a library that is then taken away, as Qt's needs libxcb-cursor on a fresh distribution."""
    cc = shutil.which("cc") or shutil.which("gcc")
    dep = tmp_path / "libspeculum-absent.so.0"
    subprocess.run([cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(dep), "-Wl,-soname,libspeculum-absent.so.0"],
                   input="int xcb_cursor_stub(void){return 0;}\n", text=True, check=True)
    plugin = tmp_path / "libqxcb.so"
    subprocess.run([cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(plugin), f"-L{tmp_path}",
                    "-l:libspeculum-absent.so.0", "-Wl,--no-as-needed"],
                   input="int xcb_cursor_stub(void);\nint plugin(void){return xcb_cursor_stub();}\n",
                   text=True, check=True)
    dep.unlink()
    return plugin


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Qt's X11 plugin is Linux only")
def test_missing_window_libraries_are_named_with_the_one_install_command(plugin_missing_a_library, monkeypatch,
                                                                        capsys):
    assert qtcheck.missing_libraries([plugin_missing_a_library]) == ["libspeculum-absent.so.0"]
    monkeypatch.setattr(qtcheck, "missing_libraries", lambda files=None: ["libxcb-cursor.so.0"])
    monkeypatch.setattr(qtcheck.shutil, "which", lambda name: "/usr/bin/" + name if name != "dnf" else None)
    assert qtcheck.install_command(["libxcb-cursor.so.0", "libxcb-icccm.so.4"]) == \
        "sudo apt-get install libxcb-cursor0 libxcb-icccm4"
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    # The window is not opened (Qt would abort): one message with the command, exit 2.
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "libxcb-cursor.so.0" in err and "sudo apt-get install libxcb-cursor0" in err
    assert "libxcb-cursor0" in qtcheck.report()
    # Wayland sessions and offscreen runs do not use the X11 plugin.
    assert not qtcheck.uses_xcb({"WAYLAND_DISPLAY": "wayland-0"})
    assert not qtcheck.uses_xcb({"QT_QPA_PLATFORM": "offscreen"})
    assert qtcheck.uses_xcb({"DISPLAY": ":0"})
