"""llama-cpp-python opens llama.cpp with ctypes from llama_cpp/lib, which PyInstaller cannot see.

Collect, at that same path, the libraries ctypes opens by name (llama, ggml); PyInstaller's
dependency analysis adds what they link against (ggml-base, ggml-cpu, ggml-cuda or
ggml-metal, the CUDA runtime) by soname. Wheels store llama_cpp/lib/libllama.so,
.so.0 and .so.0.5.0 as three full copies, so collecting every file would carry each
library three times (hundreds of MB for CUDA).
"""

import sys
from pathlib import Path

from PyInstaller.utils.hooks import get_package_paths

_, package_dir = get_package_paths("llama_cpp")
lib_dir = Path(package_dir) / "lib"

if sys.platform == "win32":
    # DLLs carry no version suffix and other DLLs find them by plain name: take them all,
    # but not mtmd (multimodal projection; Speculum never loads it).
    wanted = [p for p in lib_dir.glob("*.dll") if not p.stem.lower().startswith(("mtmd", "llava"))]
else:
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    wanted = [lib_dir / f"lib{name}{suffix}" for name in ("llama", "ggml")]
    # A non-embedded Metal build reads its shader source at run time from beside the dylib.
    wanted += list(lib_dir.glob("*.metal")) + list(lib_dir.glob("*.metallib"))

binaries = [(str(p), "llama_cpp/lib") for p in wanted if p.is_file() and p.suffix not in (".metal", ".metallib")]
datas = [(str(p), "llama_cpp/lib") for p in wanted if p.suffix in (".metal", ".metallib")]
# llama_cpp's HTTP server is an optional extra with its own heavy dependencies.
excludedimports = ["llama_cpp.server"]
