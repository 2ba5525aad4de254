"""llama-cpp-python's source, with the one change Speculum makes to its vendored ggml.

    python packaging/llama_cpp_source.py DEST   ->  prints the folder to `pip install`

The changes: a switch, GGML_CPU_ROW_INVARIANT=1 in the environment, under which ggml's CPU
backend computes every row of a matrix product and of attention alike whatever the number of rows
in its pass. Without it, a row's logits depend on how many rows share its pass (llamafile's sgemm
serves 2+ rows and vec_dot one; repacked weights take groups of 4 through gemm and the rest
through gemv; the tiled K-quant matmul starts at 8 rows; flash attention splits the cache for one
row at >= 512 cached tokens and tiles queries from 64), so a verified draft can take the other
token at a near tie and speculative output would differ from plain decoding. Unset, the build
computes exactly as upstream's. For Q4_K's repacked weights on AVX2 (the common quantization) the
switch keeps gemm, which reads prompts and verifies fast, and makes gemv round as gemm does
(once per sub-block pair where upstream rounds once per super block); other repacked types go
through gemv row by row. A comma list of parts instead of "1" measures each alone.
docs/notes/issue46-exact.md has the measurements. And GGML_CPU_TILED_MM_MIN_ROWS=N, from which
row count the tiled K-quant matmul is taken (upstream: 8), so it can read prompts without taking
verification passes (docs/notes/cpu-settings.md).

Edits are made by exact text replacement, each checked: a version whose sources moved fails
loudly here instead of building something else. Standard library only (Windows has no `patch`).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # the sources these edits were written against (packaging/constraints.txt)

SWITCH = """
// GGML_CPU_ROW_INVARIANT (Speculum): a row's result does not depend on the batch it shares, so
// verify passes match single steps bit for bit. "1" takes the parts Speculum ships as one switch;
// a comma list names parts, to measure each: sgemm-one (llamafile's sgemm serves single rows too),
// no-sgemm (it serves none: vec_dot for every row), repack (repacked weights through gemv for
// every row), tiled (the tiled K-quant matmul off), flash (flash attention's reference path for
// every row count), mmla (ARM's paired-row kernels one row at a time), gemv-sb (Q4_K's repacked
// gemv on AVX2 rounds once per sub-block pair, as its gemm does, so gemm keeps serving groups of
// 4 rows: the repack part then leaves Q4_K alone), sgemm-heads (a batched product's heads go to
// the threads as jobs, each computed by one thread's sgemm, instead of every head across all threads
// with two barriers each: the same arithmetic, without ~1,300 barriers a decoded token; single
// rows only).
enum {
    GGML_ROW_INV_SGEMM_ONE = 1, GGML_ROW_INV_REPACK = 2, GGML_ROW_INV_TILED = 4,
    GGML_ROW_INV_FLASH = 8, GGML_ROW_INV_MMLA = 16, GGML_ROW_INV_NO_SGEMM = 32, GGML_ROW_INV_GEMV_SB = 64,
    GGML_ROW_INV_SGEMM_HEADS = 128,
    GGML_ROW_INV_SHIPPED = 1 | 2 | 4 | 8 | 16 | 64 | 128,
};
static inline int ggml_cpu_row_invariant_parts(void) {
    static int parts = -1;  // (a benign race: every thread reads the same value)
    if (parts < 0) {
        const char * env = getenv("GGML_CPU_ROW_INVARIANT");
        int p = 0;
        if (env != NULL && env[0] >= '0' && env[0] <= '9') {
            p = atoi(env) != 0 ? GGML_ROW_INV_SHIPPED : 0;
        } else if (env != NULL) {
            p |= strstr(env, "sgemm-one") ? GGML_ROW_INV_SGEMM_ONE : 0;
            p |= strstr(env, "no-sgemm") ? GGML_ROW_INV_NO_SGEMM : 0;
            p |= strstr(env, "repack") ? GGML_ROW_INV_REPACK : 0;
            p |= strstr(env, "tiled") ? GGML_ROW_INV_TILED : 0;
            p |= strstr(env, "flash") ? GGML_ROW_INV_FLASH : 0;
            p |= strstr(env, "mmla") ? GGML_ROW_INV_MMLA : 0;
            p |= strstr(env, "gemv-sb") ? GGML_ROW_INV_GEMV_SB : 0;
            p |= strstr(env, "sgemm-heads") ? GGML_ROW_INV_SGEMM_HEADS : 0;
        }
        parts = p;
    }
    return parts;
}
static inline bool ggml_cpu_row_invariant(int part) {
    return (ggml_cpu_row_invariant_parts() & part) != 0;
}
"""

SGEMM_HEADS = """#if GGML_USE_LLAMAFILE
// (Speculum, GGML_CPU_ROW_INVARIANT's sgemm-heads) How many slices of each head's rows make the
// jobs of a batched product of one row a head (a decoded token's attention), so that every thread
// has at least one; 0 where upstream's loop over heads keeps it: the switch off, passes of several
// rows (where the barriers weigh little against the work: no gain measured, and prompt reading
// lost), one head, weights sgemm may serve by other kernels than tinyBLAS (whose acceptance could
// then differ between slices), or too few rows to give every thread a job.
static int64_t ggml_sgemm_head_slices(const struct ggml_tensor * src0, const struct ggml_tensor * src1, int nth) {
    const int64_t heads = src1->ne[2] * src1->ne[3];
    const int64_t rows = src0->ne[1];
    if (!ggml_cpu_row_invariant(GGML_ROW_INV_SGEMM_HEADS) || src1->ne[1] != 1 || heads < 2
        || (src0->type != GGML_TYPE_F16 && src0->type != GGML_TYPE_BF16 && src0->type != GGML_TYPE_F32)) {
        return 0;
    }
    int64_t slices = 1;  // (slices of >= 32 rows, in multiples of 4: tinyBLAS's smallest tile)
    while (heads * slices < 2 * nth && slices < 8 && rows % 4 == 0 && rows / (slices * 2) >= 32) {
        slices *= 2;
    }
    return heads * slices >= nth ? slices : 0;
}

// Each job one slice of one head's rows, computed by this thread's tinyBLAS alone (nth = 1); the
// jobs after each thread's first come from the team's chunk counter, which ggml_compute_forward_mul_mat
// set to nth before its barrier. False, on every thread alike, where tinyBLAS does not serve these
// types or sizes: each thread's first job asks before any work, and all jobs agree (same types and
// depth, row counts all multiples of 4 or all the same).
static bool ggml_sgemm_heads(const struct ggml_compute_params * params, const struct ggml_tensor * src0,
                             const struct ggml_tensor * src1, struct ggml_tensor * dst, const void * wdata,
                             size_t row_size, enum ggml_type vec_dot_type, int64_t slices) {
    GGML_TENSOR_BINARY_OP_LOCALS
    const int64_t r2 = ne12 / ne02;
    const int64_t r3 = ne13 / ne03;
    const int64_t jobs = ne12 * ne13 * slices;
    const int64_t per_slice = slices == 1 ? ne01 : ((ne01 + slices - 1) / slices + 3) / 4 * 4;
    struct ggml_compute_params alone = *params;
    alone.ith = 0;
    alone.nth = 1;
    for (int64_t job = params->ith; job < jobs; job = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t head = job / slices;
        const int64_t i12 = head % ne12;
        const int64_t i13 = head / ne12;
        const int64_t r0 = (job % slices) * per_slice;
        const int64_t r1 = MIN(r0 + per_slice, ne01);
        if (!llamafile_sgemm(&alone,
                             r1 - r0, ne11, ne00/ggml_blck_size(src0->type),
                             (const char *)src0->data + i12/r2*nb02 + i13/r3*nb03 + r0*nb01,
                             nb01/ggml_type_size(src0->type),
                             (const char *)wdata + (i12*ne11 + i13*ne12*ne11)*row_size,
                             row_size/ggml_type_size(vec_dot_type),
                             (char *)dst->data + i12*nb2 + i13*nb3 + r0*nb0,
                             nb1/ggml_type_size(dst->type),
                             src0->type,
                             vec_dot_type,
                             dst->type)) {
            GGML_ASSERT(job == params->ith);  // (a later job would have failed the first too)
            return false;
        }
    }
    return true;
}
#endif

"""

# (file under ggml/src/ggml-cpu, text as upstream has it, text with the switch[, times it is there: 1])
EDITS = [
    ("ggml-cpu-impl.h",
     "#include <math.h>   // fabsf\n",
     "#include <math.h>   // fabsf\n" + SWITCH),
    # llamafile's sgemm serves single rows too (else one row goes to vec_dot, several to sgemm)
    ("llamafile/sgemm.cpp",
     "#if !defined(__MMA__)\n    if (n < 2)\n        return false;\n#endif",
     "#if !defined(__MMA__)\n    if ((n < 2 && !ggml_cpu_row_invariant(GGML_ROW_INV_SGEMM_ONE)) || ggml_cpu_row_invariant(GGML_ROW_INV_NO_SGEMM))\n        return false;\n#endif"),
    # tinyBLAS asked by one thread alone (nth = 1) for its own share of a larger product, beside the
    # other threads doing theirs (sgemm-heads, below): no team's job counter, no barrier. Upstream
    # never passes nth = 1 to a team of more threads, so its results are unchanged. (The same
    # text twice: tinyBLAS and its RISC-V twin.)
    ("llamafile/sgemm.cpp",
     "        if (params->ith == 0) {\n"
     "            GGML_ASSERT( jj_BN * SIZE_BN + (NB_BN - jj_BN) * (SIZE_BN - 1) == xtiles);\n"
     "            // Every thread starts at ith, so the first unprocessed chunk is nth.  This save a bit of coordination right at the start.\n"
     "            ggml_threadpool_chunk_set(params->threadpool, params->nth);\n"
     "        }\n\n"
     "        ggml_barrier(params->threadpool);\n",
     "        const bool alone = params->nth == 1;  // (Speculum: a share of its own, see ggml-cpu.c)\n"
     "        if (params->ith == 0) {\n"
     "            GGML_ASSERT( jj_BN * SIZE_BN + (NB_BN - jj_BN) * (SIZE_BN - 1) == xtiles);\n"
     "            // Every thread starts at ith, so the first unprocessed chunk is nth.  This save a bit of coordination right at the start.\n"
     "            if (!alone) ggml_threadpool_chunk_set(params->threadpool, params->nth);\n"
     "        }\n\n"
     "        if (!alone) ggml_barrier(params->threadpool);\n", 2),
    ("llamafile/sgemm.cpp",
     "            job = ggml_threadpool_chunk_add(params->threadpool, 1);\n"
     "        }\n\n"
     "        ggml_barrier(params->threadpool);\n",
     "            job = alone ? job + 1 : ggml_threadpool_chunk_add(params->threadpool, 1);\n"
     "        }\n\n"
     "        if (!alone) ggml_barrier(params->threadpool);\n", 2),
    # sgemm-heads: a batched product's heads (attention's KQ and KQV without flash attention) as
    # jobs for the threads, each one thread's tinyBLAS, where upstream runs each head across all the
    # threads with two barriers of its own (and ~30 tiny jobs a head from one shared counter). Each
    # element is accumulated alike whatever tile or thread computes it, so rows stay as sgemm-one
    # makes them. Single rows only: decoding's steps, where that overhead weighs.
    ("ggml-cpu.c",
     "void ggml_compute_forward_mul_mat(\n"
     "        const struct ggml_compute_params * params,\n"
     "              struct ggml_tensor * dst) {\n",
     SGEMM_HEADS +
     "void ggml_compute_forward_mul_mat(\n"
     "        const struct ggml_compute_params * params,\n"
     "              struct ggml_tensor * dst) {\n"),
    ("ggml-cpu.c",
     "        const size_t row_size = ggml_row_size(vec_dot_type, ne10);\n\n"
     "        for (int64_t i13 = 0; i13 < ne13; i13++)\n",
     "        const size_t row_size = ggml_row_size(vec_dot_type, ne10);\n\n"
     "        const int64_t slices = ggml_sgemm_head_slices(src0, src1, nth);\n"
     "        if (slices > 0) {\n"
     "            if (ggml_sgemm_heads(params, src0, src1, dst, wdata, row_size, vec_dot_type, slices)) {\n"
     "                return;\n"
     "            }\n"
     "            goto UseGgmlGemm2;\n"
     "        }\n"
     "        for (int64_t i13 = 0; i13 < ne13; i13++)\n"),
    # the tiled K-quant matmul, which starts at 8 rows, stays off
    ("tiled/tiled.cpp",
     "        enabled = env == NULL || atoi(env) != 0;",
     "        enabled = (env == NULL || atoi(env) != 0) && !ggml_cpu_row_invariant(GGML_ROW_INV_TILED);"),
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
     "    const bool use_ref = params->use_ref || ggml_cpu_row_invariant(GGML_ROW_INV_FLASH);\n\n    const bool kv_is_f32_or_f16"),
    # mmla kernels (ARM i8mm) pair rows: one row at a time
    ("ggml-cpu.c",
     "        if ((nr0 % 2 != 0) || (ne11 % 2 != 0) || ((ir0_end - ir0_start) % 2 != 0) || ((ir1_end - ir1_start) % 2 != 0)) {",
     "        if ((nr0 % 2 != 0) || (ne11 % 2 != 0) || ((ir0_end - ir0_start) % 2 != 0) || ((ir1_end - ir1_start) % 2 != 0)\n"
     "            || ggml_cpu_row_invariant(GGML_ROW_INV_MMLA)) {"),
    # repacked weights: every row quantized plainly and through gemv (gemm takes groups of 4)
    ("repack.cpp",
     "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {\n"
     "                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),\n"
     "                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);\n"
     "            }\n\n"
     "            const int64_t i11_processed = ne11 - ne11 % 4;",
     "            const int64_t i11_processed = ggml_repack_row_by_row<BLOC_TYPE, INTER_SIZE, NB_COLS>() ? 0 : ne11 - ne11 % 4;\n"
     "            for (int64_t i11 = ith * 4; i11 < i11_processed; i11 += nth * 4) {\n"
     "                ggml_quantize_mat_t<INTER_SIZE, PARAM_TYPE>((float *) (data_ptr + i11 * nb11),\n"
     "                                                            (void *) (wdata_ptr + i11 * nbw1), 4, ne10);\n"
     "            }\n"),
    ("repack.cpp",
     "        if (nrows > 3) {\n            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * nb01, src1_ptr,\n"
     "                                                             nrows - (nrows % 4), ncols);\n        }\n"
     "        for (int iter = nrows - (nrows % 4); iter < nrows; iter++) {",
     "        const int64_t n_gemm = ggml_repack_row_by_row<BLOC_TYPE, INTER_SIZE, NB_COLS>() ? 0 : nrows - (nrows % 4);\n"
     "        if (n_gemm > 0) {\n            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * nb01, src1_ptr,\n"
     "                                                             n_gemm, ncols);\n        }\n"
     "        for (int64_t iter = n_gemm; iter < nrows; iter++) {"),
    # ... except Q4_K on AVX2, whose gemv then rounds as its gemm does (below)
    ("repack.cpp",
     "class tensor_traits_base : public ggml::cpu::tensor_traits {\n",
     "// Speculum: whether repacked weights take every row through gemv (GGML_CPU_ROW_INVARIANT's\n"
     "// repack part): not Q4_K 8x8 on AVX2 under gemv-sb, whose gemv then rounds as its gemm does.\n"
     "template <typename BLOC_TYPE, int64_t INTER_SIZE, int64_t NB_COLS> static bool ggml_repack_row_by_row() {\n"
     "#if defined(__AVX2__)\n"
     "    if (std::is_same<BLOC_TYPE, block_q4_K>::value && INTER_SIZE == 8 && NB_COLS == 8\n"
     "        && ggml_cpu_row_invariant(GGML_ROW_INV_GEMV_SB)) {\n"
     "        return false;\n"
     "    }\n"
     "#endif\n"
     "    return ggml_cpu_row_invariant(GGML_ROW_INV_REPACK);\n"
     "}\n\n"
     "class tensor_traits_base : public ggml::cpu::tensor_traits {\n"),
    ("repack.cpp",
     "#include <cassert>\n",
     "#include <cassert>\n#include <type_traits>\n"),
    # Q4_K's gemv on AVX2 (x86 only): gemm scales and adds each sub-block pair's integer sums into
    # its float accumulators, gemv a whole super block's at once; under gemv-sb gemv does as gemm
    # (the same fused multiply-adds in the same order), so a row's sums do not depend on its pass.
    ("arch/x86/repack.cpp",
     "                    // Accumulate for the complete block\n"
     "                    iacc_b = _mm256_add_epi32(iacc_b, iacc_sb);\n"
     "                    iacc_min_b = _mm256_add_epi32(iacc_min_b, iacc_min_sb);\n"
     "                }\n\n"
     "                // Multiply-Add with scale values for the complete super block\n"
     "                acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_b), _mm256_mul_ps(col_scale_f32, row_scale_f32), acc_row);\n"
     "                acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_b), _mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n",
     "                    if (per_sub_block) {  // (Speculum: as gemm rounds)\n"
     "                        acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_sb), _mm256_mul_ps(col_scale_f32, row_scale_f32), acc_row);\n"
     "                        acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_sb), _mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n"
     "                        continue;\n"
     "                    }\n"
     "                    // Accumulate for the complete block\n"
     "                    iacc_b = _mm256_add_epi32(iacc_b, iacc_sb);\n"
     "                    iacc_min_b = _mm256_add_epi32(iacc_min_b, iacc_min_sb);\n"
     "                }\n\n"
     "                if (!per_sub_block) {\n"
     "                // Multiply-Add with scale values for the complete super block\n"
     "                acc_row = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_b), _mm256_mul_ps(col_scale_f32, row_scale_f32), acc_row);\n"
     "                acc_min_rows = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_b), _mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows);\n"
     "                }\n"),
    ("arch/x86/repack.cpp",
     "    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *)vx;\n"
     "    const block_q8_K * a_ptr_start = (const block_q8_K *)vy;\n\n"
     "    // Process Q8_K blocks one by one\n",
     "    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *)vx;\n"
     "    const block_q8_K * a_ptr_start = (const block_q8_K *)vy;\n"
     "    const bool per_sub_block = ggml_cpu_row_invariant(GGML_ROW_INV_GEMV_SB);\n\n"
     "    // Process Q8_K blocks one by one\n"),
]


def patch(source: Path) -> None:
    """Make the edits in a freshly unpacked llama-cpp-python source folder."""
    cpu = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu"
    for name, old, new, *times in EDITS:
        file = cpu / name
        text = file.read_text(encoding="utf-8")
        if text.count(old) != (times[0] if times else 1):
            raise SystemExit(f"{file}: the text to change is not there as often as expected; these edits are for "
                             f"llama-cpp-python {VERSION}")
        file.write_text(text.replace(old, new), encoding="utf-8")


def fetch(dest: Path) -> Path:
    """The patched source folder under ``dest``, unpacked afresh (the archive downloaded from the
    package index once) unless it holds exactly these edits: an edit changed since would not find
    its upstream text in a folder patched by the earlier list."""
    folder = dest / f"llama_cpp_python-{VERSION}"
    stamp = folder / ".speculum-edits"
    want = hashlib.sha256(repr(EDITS).encode()).hexdigest()
    if (folder / "pyproject.toml").exists() and stamp.exists() and stamp.read_text() == want:
        return folder
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / f"llama_cpp_python-{VERSION}.tar.gz"
    if not archive.exists():
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                            "--no-binary", ":all:", "--no-deps",
                            f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
            shutil.move(str(next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))), str(archive))
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # (Python >= 3.10.12: refuse links and paths out of tmp)
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        patch(Path(tmp) / folder.name)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.move(str(Path(tmp) / folder.name), str(folder))
    stamp.write_text(want)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(fetch(Path(sys.argv[1]).resolve()))
