"""llama-cpp-python's source, with the one change Speculum makes to its vendored ggml.

    python packaging/llama_cpp_source.py DEST   ->  prints the folder to `pip install`

The changes: a switch, GGML_CPU_ROW_INVARIANT=1 in the environment, under which ggml's CPU
backend computes every row of a matrix product and of attention with one kernel whatever the
number of rows in its pass. Without it, a row's logits depend on how many rows share its pass
(llamafile's sgemm serves 2+ rows and vec_dot one; repacked weights take groups of 4 through
gemm and the rest through gemv; the tiled K-quant matmul starts at 8 rows; flash attention
splits the cache for one row at >= 512 cached tokens and tiles queries from 64), so a verified
draft can take the other token at a near tie and speculative output would differ from plain
decoding. Unset, the build computes exactly as upstream's. docs/notes/issue46-exact.md has the
measurements. And GGML_CPU_TILED_MM_MIN_ROWS=N, from which row count the tiled K-quant matmul
is taken (upstream: 8), so it can read prompts without taking verification passes
(docs/notes/cpu-settings.md).

Edits are made by exact text replacement, each checked: a version whose sources moved fails
loudly here instead of building something else. Standard library only (Windows has no `patch`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # the sources these edits were written against (packaging/constraints.txt)

SWITCH = """
// GGML_CPU_ROW_INVARIANT=1 (Speculum): every row of a matrix product or attention is computed by
// one kernel whatever the number of rows in its pass, so a row's result does not depend on the
// batch it shares (verify passes then match single steps bit for bit).
static inline bool ggml_cpu_row_invariant(void) {
    static int invariant = -1;  // (a benign race: every thread reads the same value)
    if (invariant < 0) {
        const char * env = getenv("GGML_CPU_ROW_INVARIANT");
        invariant = env != NULL && atoi(env) != 0;
    }
    return invariant != 0;
}
"""

# (file under ggml/src/ggml-cpu, text as upstream has it, text with the switch)
EDITS = [
    ("ggml-cpu-impl.h",
     "#include <math.h>   // fabsf\n",
     "#include <math.h>   // fabsf\n" + SWITCH),
    # llamafile's sgemm serves single rows too (else one row goes to vec_dot, several to sgemm)
    ("llamafile/sgemm.cpp",
     "#if !defined(__MMA__)\n    if (n < 2)\n        return false;\n#endif",
     "#if !defined(__MMA__)\n    if (n < 2 && !ggml_cpu_row_invariant())\n        return false;\n#endif"),
    # the tiled K-quant matmul, which starts at 8 rows, stays off
    ("tiled/tiled.cpp",
     "        enabled = env == NULL || atoi(env) != 0;",
     "        enabled = (env == NULL || atoi(env) != 0) && !ggml_cpu_row_invariant();"),
    # GGML_CPU_TILED_MM_MIN_ROWS=N (Speculum): the tiled K-quant matmul from N rows on, not 8.
    # Where verification passes (up to 64 rows) pay for its unpacking but prompt chunks gain
    # (AVX2 CPUs), it can then read prompts and leave the passes alone.
    ("tiled/tiled.cpp",
     "static bool ggml_tiled_min_batch(int64_t rows) {\n"
     "    //  Profitable at rows >= 8, take even when unprofitable if we're forced\n"
     "    return rows >= 8 || ggml_tiled_matmul_forced();\n}",
     "static int64_t ggml_tiled_min_rows(void) {\n"
     "    static int64_t min_rows = 8;\n"
     "    static std::once_flag flag;\n"
     "    std::call_once(flag, []() {\n"
     "        const char * env = getenv(\"GGML_CPU_TILED_MM_MIN_ROWS\");\n"
     "        if (env != NULL && atoi(env) > 0) {\n"
     "            min_rows = atoi(env);\n"
     "        }\n"
     "    });\n"
     "    return min_rows;\n}\n\n"
     "static bool ggml_tiled_min_batch(int64_t rows) {\n"
     "    //  Profitable at rows >= 8, take even when unprofitable if we're forced\n"
     "    return rows >= ggml_tiled_min_rows() || ggml_tiled_matmul_forced();\n}"),
    # flash attention: the reference path for every row count (no split cache, no query tiles)
    ("ops.cpp",
     "    const bool use_ref = params->use_ref;\n\n    const bool kv_is_f32_or_f16",
     "    const bool use_ref = params->use_ref || ggml_cpu_row_invariant();\n\n    const bool kv_is_f32_or_f16"),
    # mmla kernels (ARM i8mm) pair rows: one row at a time
    ("ggml-cpu.c",
     "        if ((nr0 % 2 != 0) || (ne11 % 2 != 0) || ((ir0_end - ir0_start) % 2 != 0) || ((ir1_end - ir1_start) % 2 != 0)) {",
     "        if ((nr0 % 2 != 0) || (ne11 % 2 != 0) || ((ir0_end - ir0_start) % 2 != 0) || ((ir1_end - ir1_start) % 2 != 0)\n"
     "            || ggml_cpu_row_invariant()) {"),
    # repacked weights: every row quantized plainly and through gemv (gemm takes groups of 4)
    ("repack.cpp",
     "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {\n"
     "                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),\n"
     "                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);\n"
     "            }\n\n"
     "            const int64_t i11_processed = ne11 - ne11 % 4;",
     "            const int64_t i11_processed = ggml_cpu_row_invariant() ? 0 : ne11 - ne11 % 4;\n"
     "            for (int64_t i11 = ith * 4; i11 < i11_processed; i11 += nth * 4) {\n"
     "                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),\n"
     "                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);\n"
     "            }\n"),
    ("repack.cpp",
     "        if (nrows > 3) {\n            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * nb01, src1_ptr,\n"
     "                                                             nrows - (nrows % 4), ncols);\n        }\n"
     "        for (int iter = nrows - (nrows % 4); iter < nrows; iter++) {",
     "        const int64_t n_gemm = ggml_cpu_row_invariant() ? 0 : nrows - (nrows % 4);\n"
     "        if (n_gemm > 0) {\n            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * nb01, src1_ptr,\n"
     "                                                             n_gemm, ncols);\n        }\n"
     "        for (int64_t iter = n_gemm; iter < nrows; iter++) {"),
]


def patch(source: Path) -> None:
    """Make the edits in an unpacked llama-cpp-python source folder; each one once (a folder an
    earlier version of this list patched gets the edits added since)."""
    cpu = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu"
    for name, old, new in EDITS:
        file = cpu / name
        text = file.read_text(encoding="utf-8")
        if new in text:
            continue
        if text.count(old) != 1:
            raise SystemExit(f"{file}: the text to change is not there once; these edits are for "
                             f"llama-cpp-python {VERSION}")
        file.write_text(text.replace(old, new), encoding="utf-8")


def fetch(dest: Path) -> Path:
    """The patched source folder under ``dest``, downloaded (from the package index) if not there yet."""
    folder = dest / f"llama_cpp_python-{VERSION}"
    if not (folder / "pyproject.toml").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                            "--no-binary", ":all:", "--no-deps",
                            f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
            archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                if hasattr(tarfile, "data_filter"):  # (Python >= 3.10.12: refuse links and paths out of tmp)
                    tar.extractall(tmp, filter="data")
                else:
                    tar.extractall(tmp)
            shutil.rmtree(folder, ignore_errors=True)
            shutil.move(str(Path(tmp) / folder.name), str(folder))
    patch(folder)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(fetch(Path(sys.argv[1]).resolve()))
