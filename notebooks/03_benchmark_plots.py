# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Benchmark plots: speed-up against density, per block size
#
# Reads the JSON files that `benchmarks/bench_linear.py` writes into `benchmarks/results/`
# (`bench_linear_<GPU>.json`: `meta` with the GPU, torch and CUDA versions, and one record per timing) and plots
# the speed-up of `BlockSparseLinear` over dense `F.linear` (same dtype, same run) against the density, one
# line per block size, for every GPU, shape, dtype and phase (forward / training step).
#
# It plots only what was measured: with no result files it says so and draws nothing. To produce results, on a
# machine with a CUDA GPU and the extension built:
#
# ```bash
# python benchmarks/bench_linear.py --out benchmarks/results          # full grid, a few minutes
# ```
#
# then re-run this notebook.

# %% tags=["parameters"]
RESULTS_DIR = None      # None: benchmarks/results of this repository
METHOD = "ours"         # the BlockSparseLinear records; peers ("torch_bsr", "stk") are drawn dashed for reference
SAVE_PLOTS = False      # also write <result file>.speedup.png next to each JSON

# %%
import glob
import json
import os

import matplotlib.pyplot as plt


def find_results_dir():
    for root in (".", ".."):
        path = os.path.join(root, "benchmarks", "results")
        if os.path.isdir(os.path.join(root, "benchmarks")):
            return path
    raise FileNotFoundError("benchmarks/ (run the notebook from notebooks/ or the repository root)")


results_dir = RESULTS_DIR or find_results_dir()
files = sorted(glob.glob(os.path.join(results_dir, "*.json")))
runs = []
for file in files:
    with open(file, encoding="utf-8") as handle:
        content = json.load(handle)
    if not isinstance(content, dict) or "records" not in content or "meta" not in content:
        print(f"skipping {os.path.basename(file)}: not a bench_linear.py result (no 'meta' and 'records')")
        continue
    runs.append((file, content["meta"], content["records"]))

if not runs:
    print(f"No benchmark results in {os.path.abspath(results_dir)} yet: nothing to plot. "
          f"Run benchmarks/bench_linear.py on a CUDA GPU to create them.")
else:
    for file, meta, records in runs:
        print(f"{os.path.basename(file)}: {meta.get('gpu')}, torch {meta.get('torch')}, CUDA {meta.get('cuda')}, "
              f"{len(records)} records{' (quick run)' if meta.get('quick') else ''}")

# %% [markdown]
# ## Speed-up tables
#
# One row per block size, one column per density; cells are dense time / method time (> 1: faster than dense).

# %%
def measured(records):
    return [r for r in records if "speedup" in r and r.get("method") != "dense"]


def cases(records):
    return sorted({(r["dtype"], r["m"], r["k"], r["n"], r["phase"]) for r in measured(records)},
                  key=lambda c: (c[0], -c[1] * c[2] * c[3], c[4]))


for file, meta, records in runs:
    densities = sorted({r["density"] for r in measured(records)})
    print(f"\n### {meta.get('gpu')}")
    for dtype, m, k, n, phase in cases(records):
        rows = [r for r in measured(records) if (r["dtype"], r["m"], r["k"], r["n"], r["phase"]) == (dtype, m, k, n, phase)
                and r["method"] == METHOD]
        if not rows:
            continue
        print(f"\n{dtype}, M={m}, in={k}, out={n}, {phase}")
        print(f"{'block':>6} | " + " | ".join(f"d={d:<5}" for d in densities))
        for block in sorted({r["block"] for r in rows}):
            cells = {r["density"]: r["speedup"] for r in rows if r["block"] == block}
            print(f"{block:>6} | " + " | ".join(f"{cells[d]:6.2f}x" if d in cells else f"{'':7}" for d in densities))

# %% [markdown]
# ## Plots

# %%
for file, meta, records in runs:
    panels = cases(records)
    if not panels:
        print(f"{os.path.basename(file)}: no timed records")
        continue
    columns = min(3, len(panels))
    rows_count = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows_count, columns, figsize=(5 * columns, 3.6 * rows_count), squeeze=False)
    for ax, (dtype, m, k, n, phase) in zip(axes.flat, panels):
        rows = [r for r in measured(records) if (r["dtype"], r["m"], r["k"], r["n"], r["phase"]) == (dtype, m, k, n, phase)]
        for method, block in sorted({(r["method"], r["block"]) for r in rows}, key=lambda c: (c[0] != METHOD, c)):
            points = sorted((r["density"], r["speedup"]) for r in rows if (r["method"], r["block"]) == (method, block))
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linestyle="-" if method == METHOD else "--", label=f"{method} block {block}")
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_title(f"{dtype} M={m} {k}->{n} {phase}", fontsize=9)
        ax.set_xlabel("density (fraction of blocks kept)")
        ax.set_ylabel("speed-up over dense")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(f"{meta.get('gpu')} (torch {meta.get('torch')}, CUDA {meta.get('cuda')})")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    if SAVE_PLOTS:
        fig.savefig(os.path.splitext(file)[0] + ".speedup.png", dpi=110)
        print(f"wrote {os.path.splitext(os.path.basename(file))[0]}.speedup.png")
    plt.show()
