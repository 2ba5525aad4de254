#!/usr/bin/env python3
"""One MTP draft step against one target step, on the tiny MTP models the tests write.

Writes the test models (tests/mtpgguf.py: glm4moe and qwen35, and a deeper glm4moe where
the trunk outweighs the LM head as in real models), then times single-token target
decodes and single-token MTP head decodes alternately, after a 100-token context. Prints
the medians and their ratio per thread count.

    PYTHONPATH=app python scripts/bench_mtp.py [--tokenizer SmolLM2.gguf] [--steps 200] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import mtpgguf  # noqa: E402

from speculum.engine.llama.model import LlamaModel  # noqa: E402
from speculum.engine.settings import LoadOptions  # noqa: E402
from speculum.models import bundled  # noqa: E402


def measure(path: Path, threads: int, steps: int) -> tuple[float, float]:
    with LlamaModel(path, LoadOptions(n_ctx=1024, n_threads=threads)) as model:
        rows = []
        model.listen_to_decodes(lambda tokens, pos, hidden: rows.append(np.array(hidden[-1:])))
        head = model.open_mtp_head()
        context = list(range(1000, 1100))
        model.prefill(context)
        head.decode(context[1:], np.zeros((len(context) - 1, model.n_embd), np.float32), 0)
        hidden = rows[-1]
        target_s, mtp_s = [], []
        for i in range(steps):
            t = time.perf_counter()
            model.decode([2000 + i])
            target_s.append(time.perf_counter() - t)
            model.trim(len(context))
            t = time.perf_counter()
            head.decode([2000 + i], hidden, len(context) - 1, logits=True)
            mtp_s.append(time.perf_counter() - t)
    return statistics.median(target_s) * 1e3, statistics.median(mtp_s) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, help="a GGUF whose tokenizer the models copy (default: SmolLM2)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    tokenizer = args.tokenizer or bundled.assemble(bundled.SMOLLM2)
    folder = Path(tempfile.mkdtemp(prefix="speculum-mtp-"))
    models = [
        ("glm4moe test model (2 layers + NextN, n_embd 64)", dict(arch="glm4moe"), {}),
        ("qwen35 test model (GDN + attention + NextN, n_embd 64)", dict(arch="qwen35"), {}),
        ("glm4moe, deeper (24 layers + NextN, n_embd 256)", dict(arch="glm4moe"),
         dict(N_TRUNK=24, N_EMBD=256, N_FF=1024, N_FF_EXP=256)),
    ]
    defaults = {name: getattr(mtpgguf, name) for name in ("N_TRUNK", "N_EMBD", "N_FF", "N_FF_EXP")}
    for i, (label, kw, shape) in enumerate(models):
        for name, value in {**defaults, **shape}.items():
            setattr(mtpgguf, name, value)
        path = mtpgguf.write_mtp_gguf(folder / f"m{i}.gguf", tokenizer, noise=0.05, **kw)
        for threads in (int(t) for t in args.threads.split(",")):
            target, mtp = measure(path, threads, args.steps)
            print(f"{label}, {threads} thread(s): target step {target:.3f} ms, MTP step {mtp:.3f} ms, "
                  f"ratio {mtp / target:.2f}", flush=True)


if __name__ == "__main__":
    main()
