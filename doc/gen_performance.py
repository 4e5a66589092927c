"""Write doc/performance.md from the benchmark results in benchmarks/results/*.json (written by
benchmarks/bench_linear.py on a GPU). Only measured numbers go in; with no result files the page says so. Of a
series of per-session runs (`*_sessionN_*.json`) only the latest session's is shown.

    python doc/gen_performance.py [--results DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_RESULTS = os.path.join(ROOT, "benchmarks", "results")

INTRO = """# Performance

Speed of `BlockSparseLinear` against dense `F.linear` (cuBLAS) on the same GPU, in the same dtype and the same
run: speed-up = dense time / sparse time (above 1: faster than dense). Numbers come only from
`benchmarks/bench_linear.py` runs committed to `benchmarks/results/`; this page is regenerated from them with
`python doc/gen_performance.py`, and `notebooks/03_benchmark_plots` draws them.

How the timings are taken (see the script's docstring): median of CUDA-event timings after warm-up; "forward"
is y = x Wᵀ + b, "train" a full training step of the layer (forward, grad input, grad weight, grad bias) in
eager mode (host time included: at low density Python and kernel launches bound it), "train_graph" the same
step replayed from a CUDA graph (GPU time, against dense replayed the same way; dense cuBLAS was measured
slower in a graph than in eager mode on the H100, which flatters these ratios: compare the times too, see
kernels.md); decode shapes (M = 1, 16 tokens) are timed inside a CUDA graph, with the same weight at every call
(it stays in L2 when it fits; `benchmarks/bench_decode.py` also times decode with the weight read from DRAM, as
in a model's decode step: `benchmarks/results/bench_decode_*.txt`). Each configuration is checked
against `F.linear` on its dense weight before it is timed. Under sustained load the H100 runs at its power cap
and its clock drifts (1.26-1.98 GHz within a second), so a cell timed once can move by several percent:
`benchmarks/bar_cells.py` times the project's target cells with dense and STK in the same rounds
(`benchmarks/results/bar_cells_*.txt`). The tables below are short runs, at whatever clock the work before
left. A light kernel timed right after a heavy one reads up to 1.2x slower
(`benchmarks/profile/neighbour_effect.py`). Under sustained load every method runs at the power cap, dense, STK
and ours alike (`benchmarks/profile/energy_per_call.py`), and a method's time is then its energy per call.
`bar_cells.py --settle 0.3` times each method at its own sustained clock: on an H200 (session 45) ours (blocks of
128) against STK was 1.3-1.5x there (the training step in CUDA graphs), against 1.4-1.7x in short runs. The
block-64 ratios against dense hardly moved. Fitted over the four densities (session 46), ours costs what dense
cuBLAS costs per FLOP of the kept blocks (within 3 %) plus a fixed cost per call for its output (~20-25 us at
8192 x 4096 -> 4096), STK 1.3-1.46x cuBLAS per FLOP. How the kernels work and why the numbers are what they are: [kernels.md](kernels.md).

Between decode and large batches (65 to ~2000 tokens per call) the tables below have no rows; the forward and
the input gradient there are timed per path by `benchmarks/profile/dsd_mid_rows.py`
(`benchmarks/results/{dsd,dds}_mid_rows_*.txt`). Sparse layers pay off there at low density and on wide layers;
narrow layers (about 1024 features or fewer on the side the tiles cover: the outputs of the forward, the inputs of
the input gradient) have too few tiles to fill the GPU and can be slower than dense at any density. For example
(H200, bf16, session 42, forward in a CUDA graph): 4096 -> 4096 at 512 tokens, blocks of 128, 0.0089 / 0.0129 /
0.0182 / 0.0281 ms at density 0.1 / 0.25 / 0.5 / 1.0 against dense 0.0236; 4096 -> 1024 at 256 tokens, blocks of
64, 0.0101 / 0.0134 / 0.0136 / 0.0148 ms against dense 0.0087 (the paths the rules take; `dsd_mid_rows`
run 4).
"""

NO_RESULTS = """## Results

**No benchmark results have been committed yet** (`benchmarks/results/` holds no result file), so this page
has no numbers and claims no speed-up. Where the CUDA extension is not built, or for a case its kernels do not
support, `BlockSparseLinear` runs the pure-PyTorch reference path, which is correct but not faster than a dense
layer.

To produce results, on a machine with a CUDA GPU and the extension built (see troubleshooting.md):

```bash
python benchmarks/bench_linear.py --out benchmarks/results     # full grid, a few minutes
python doc/gen_performance.py                                  # then regenerate this page
```
"""


def latest_sessions(files):
    """The files without the earlier sessions of a series: `name_session28_x.json` is superseded by
    `name_session29_x.json` (each session's run measures the kernels of its commit)."""
    latest = {}
    for file in files:
        match = re.search(r"_session(\d+)", os.path.basename(file))
        series = (os.path.dirname(file), re.sub(r"_session\d+", "", os.path.basename(file)))
        session = int(match.group(1)) if match else -1
        if series not in latest or session > latest[series][0]:
            latest[series] = (session, file)
    return sorted(file for _, file in latest.values())


def load(results_dir):
    runs = []
    for file in latest_sessions(glob.glob(os.path.join(results_dir, "*.json"))):
        with open(file, encoding="utf-8") as handle:
            content = json.load(handle)
        if isinstance(content, dict) and "meta" in content and "records" in content:
            runs.append((file, content["meta"], content["records"]))
    return runs


def summary(records):
    """One row per (dtype, shape, phase): the best BlockSparseLinear speed-up at each density, and its block."""
    ours = [r for r in records if r.get("method") == "ours" and "speedup" in r]
    densities = sorted({r["density"] for r in ours})
    cases = sorted({(r["dtype"], r["m"], r["k"], r["n"], r["phase"]) for r in ours},
                   key=lambda c: (c[0], -c[1] * c[2] * c[3], c[4]))
    out = ["Best `BlockSparseLinear` speed-up over dense at each density (the block size that gave it):", "",
           "| dtype | M tokens | in → out | phase | " + " | ".join(f"density {d:g}" for d in densities) + " |",
           "|---|---|---|---|" + "---|" * len(densities)]
    for dtype, m, k, n, phase in cases:
        cells = []
        for d in densities:
            hits = [r for r in ours if (r["dtype"], r["m"], r["k"], r["n"], r["phase"], r["density"])
                    == (dtype, m, k, n, phase, d)]
            best = max(hits, key=lambda r: r["speedup"]) if hits else None
            cells.append(f"{best['speedup']:.2f}× (b{best['block']})" if best else "")
        out.append(f"| {dtype} | {m} | {k} → {n} | {phase} | " + " | ".join(cells) + " |")
    return out + [""]


def provenance(file) -> str:
    """' (committed in abc1234, 2026-11-22)' when git knows the file, else ''."""
    try:
        import subprocess
        line = subprocess.run(["git", "log", "-1", "--format=%h, %ad", "--date=short", "--", file], cwd=ROOT,
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, ValueError, subprocess.SubprocessError):
        return ""
    return f" (committed in {line})" if line else ""


def tables(meta, records):
    timed = [r for r in records if "speedup" in r and r.get("method") != "dense"]
    densities = sorted({r["density"] for r in timed})
    cases = sorted({(r["dtype"], r["m"], r["k"], r["n"]) for r in records},
                   key=lambda c: (c[0], -c[1] * c[2] * c[3]))
    out = []
    for dtype, m, k, n in cases:
        rows = [r for r in timed if (r["dtype"], r["m"], r["k"], r["n"]) == (dtype, m, k, n)]
        dense = {r["phase"]: r["ms"] for r in records
                 if r.get("method") == "dense" and (r["dtype"], r["m"], r["k"], r["n"]) == (dtype, m, k, n) and "ms" in r}
        if not rows:
            continue
        times = ", ".join(f"{phase} {ms:.4g} ms" for phase, ms in sorted(dense.items()))
        out += [f"### {dtype}, M={m} tokens, {k} → {n}" + (f" (dense: {times})" if times else ""), "",
                "| method | phase | block | " + " | ".join(f"density {d:g}" for d in densities) + " |",
                "|---|---|---|" + "---|" * len(densities)]
        combos = sorted({(r["method"], r["phase"], r["block"]) for r in rows},
                        key=lambda c: (c[0] != "ours", c[0], c[1], c[2]))
        for method, phase, block in combos:
            cells = []
            for d in densities:
                hit = [r for r in rows if (r["method"], r["phase"], r["block"], r["density"]) == (method, phase, block, d)]
                cells.append(f"{hit[0]['speedup']:.2f}× ({hit[0]['ms']:.3g} ms)" if hit else "")
            name = "BlockSparseLinear" if method == "ours" else method
            out.append(f"| {name} | {phase} | {block} | " + " | ".join(cells) + " |")
        out.append("")
    errors = [r for r in records if "error" in r]
    if errors:
        out += ["Configurations that failed (not timed):", ""]
        out += [f"- {r.get('method')} {r.get('dtype')} M={r.get('m')} {r.get('k')}→{r.get('n')} block "
                f"{r.get('block')} density {r.get('density')}: {r['error']}" for r in errors] + [""]
    return out


def generate(results_dir, out_path) -> str:
    runs = load(results_dir)
    lines = [INTRO]
    if not runs:
        lines.append(NO_RESULTS)
        return "\n".join(lines).rstrip() + "\n"
    for file, meta, records in runs:
        gpu = meta.get("gpu", "unknown GPU")
        lines += [f"## {gpu}", "",
                  f"torch {meta.get('torch')}, CUDA {meta.get('cuda')}; {meta.get('reps', '?')} timed repetitions; "
                  f"{'a quick run (one shape, one block size); ' if meta.get('quick') else ''}"
                  f"source: `{os.path.relpath(file, ROOT)}`{provenance(file)}. The kernels change faster than this "
                  f"page: a result file measures the code of its commit.", ""]
        lines += summary(records)
        png = os.path.splitext(file)[0] + ".png"
        if os.path.exists(png):
            lines += [f"![speed-up against density on {gpu}]({os.path.relpath(png, os.path.dirname(out_path))})", ""]
        lines += ["All measurements (time per call in brackets; `stk` and `torch_bsr` are other libraries' "
                  "block-sparse products, timed in the same run for reference):", ""]
        lines += tables(meta, records)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=DEFAULT_RESULTS)
    parser.add_argument("--out", default=os.path.join(HERE, "performance.md"))
    args = parser.parse_args(argv)
    text = generate(args.results, args.out)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
