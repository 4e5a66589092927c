"""dsd between decode and large M: which path the binding takes at M = 64-1024 and what each would take.

    python benchmarks/profile/dsd_mid_rows.py [--m 65,128,...] [--features 4096x4096,...]

For bf16 weights (blocks 64 / 128, densities 0.1-1.0): dense F.linear, the decode kernel (M <= 64), the SM80 tiled
kernels (Hopper kernels off; below ~128 x SMs / block rows tokens they split each row's blocks over CTAs into an
fp32 workspace), the Hopper 256-token kernel (minimum rows lowered to 1, few-rows dsd off; the binding still takes
the SM80 split path wherever the split rule applies), the Hopper few-rows dsd forced to each split (128-token tiles,
the reduction split over 1, 2, 4 or 8 CTAs of a cluster; 4 since session 42, 8 since session 44) and the
default path. Per call in a CUDA graph of 20 calls, the same weight at every call (hot in L2). Written in session
13 to size the mid-M gap, extended in session 17 with the few-rows dsd: benchmarks/results/dsd_mid_rows_*.txt.
--op dds times the dds (dx = dy W, the input gradient) the same way (session 20): dense dy @ W, no decode kernel,
the SM80 kernel (no split), the 256-token kernel, the few-rows tiles. At the end a summary per shape (default /
best / dense, summed) and the cells where the default path is more than 5 % off the best (session 41). Since
session 42 every path of a cell (dense too) is captured first and the graphs are timed in --rounds rounds of
rotating order (--order shuffle: at random). At thousands of tokens the default column read up to 1.19x the same
kernel's hopper column with the rotating order (session 44, run 10) because it was always timed right after a heavy
path (dense or the split of 8), which leaves a lower clock; with --order shuffle (run 11) the two agree within 4 %
(benchmarks/profile/neighbour_effect.py).
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _extension, _ops  # noqa: E402

from bench_linear import graph_timers, rounds_ms, with_knobs  # noqa: E402

FEW_ROWS_SPLITS = (1, 2, 4, 8)  # the few-rows tiles' splits, each a column (_ops.set_hopper_few_rows_split)


def summary(cells, miss=1.05):
    """Per shape, the default path's, the best path's and dense's times summed (ms), then every cell where the
    default path took more than `miss` times the best path's time. `cells`: ((k, n, m, block, density), times)
    with the columns of the table (nan where a path does not apply)."""
    paths = ("decode", "sm80", "hopper") + FEW_ROWS_SPLITS
    lines, shapes, misses = ["summary (ms summed per shape): default / best path / dense"], {}, []
    for key, times in cells:
        best_path = min((p for p in paths if times[p] == times[p]), key=lambda p: times[p])
        sums = shapes.setdefault(key[:2], [0.0, 0.0, 0.0])
        for i, value in enumerate((times["default"], times[best_path], times["dense"])):
            sums[i] += value
        if times["default"] > miss * times[best_path]:
            name = f"few-rows split {best_path}" if best_path in FEW_ROWS_SPLITS else best_path
            misses.append(f"  {key}: default {times['default']:.4f}, {name} {times[best_path]:.4f} "
                          f"({times['default'] / times[best_path]:.2f}x)")
    for (k, n), (default, best, dense) in shapes.items():
        lines.append(f"  {k} -> {n}: {default:.3f} / {best:.3f} / {dense:.3f}")
    lines.append(f"cells where the default path took > {miss}x the best path's time: {len(misses)}")
    return "\n".join(lines + misses)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", default="65,96,128,192,256,320,384,512,768,1024")
    parser.add_argument("--features", default="4096x4096", help="KxN pairs, comma-separated")
    parser.add_argument("--op", default="dsd", choices=("dsd", "dds"))
    parser.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    parser.add_argument("--blocks", default="64,128", help="32 too: its Hopper kernel has no few-rows tiles (nan)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every path's graph, in rotating order")
    parser.add_argument("--reps", type=int, default=15, help="replays timed per path and round (median)")
    parser.add_argument("--order", default="rotate", choices=("rotate", "shuffle"),
                        help="each round's order of the paths (bench_linear.rounds_ms; shuffle: since session 44)")
    args = parser.parse_args()
    dds = args.op == "dds"
    ops = _extension.get()
    print(f"{torch.cuda.get_device_name()} bf16 {args.op}; ms per call in a CUDA graph of 20 calls (hot weight)")
    print("   K    N    M block dens |  dense | decode |   sm80 | hop256 | "
          + "".join(f" few {s} | " for s in FEW_ROWS_SPLITS) + "default | default / dense")
    cells = []
    for features in args.features.split(","):
        k, n = (int(v) for v in features.split("x"))
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            dense = (lambda: dy @ w) if dds else (lambda: F.linear(x, w))  # noqa: E731
            for block in (int(b) for b in args.blocks.split(",")):
                for density in (float(d) for d in args.densities.split(",")):
                    mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block),
                                                  dtype=torch.bfloat16, device="cuda")
                    data, index = mat.data.detach(), mat.indices()
                    if dds:
                        run = lambda: ops.dds(dy, data, *index)  # noqa: E731
                    else:
                        run = lambda: ops.dsd(x, data, None, *index)  # noqa: E731
                    # Each path's graph is captured with its knobs set (the binding picks the kernel on the host,
                    # at capture), then all are timed in rounds of rotating order (rounds_ms): timed one after the
                    # other, the first (default) path had read up to 14 % slower than the same kernel under its
                    # own knob (H200, session 42), the GPU's clock drifting under the sustained load.
                    decode, min_rows, few = _ops.set_decode_max_rows, _ops.set_hopper_min_rows, \
                        _ops.set_hopper_few_rows_split
                    paths = {"default": [], "sm80": [(decode, 0), (min_rows, 1 << 30), (few, 0)],
                             "hopper": [(decode, 0), (min_rows, 1), (few, 0), (_ops.set_hopper_blocks_of_32, 1)]}
                    if m <= 64 and not dds:
                        paths["decode"] = [(decode, 64), (min_rows, 1 << 30), (few, 0)]
                    if block != 32:
                        paths.update({split: [(decode, 0), (min_rows, 1), (few, split)] for split in FEW_ROWS_SPLITS})
                    timers = graph_timers({"dense": dense, **{path: with_knobs(run, knobs)
                                                              for path, knobs in paths.items()}}, 20, args.reps)
                    rounds = rounds_ms(timers, args.rounds, args.order)
                    times = {path: statistics.median(t) for path, t in rounds.items()}
                    times = {"decode": float("nan"), **{s: float("nan") for s in FEW_ROWS_SPLITS}, **times}
                    print(f"{k:4d} {n:4d} {m:4d} {block:5d} {density:4.2f} | {times['dense']:.4f} | "
                          f"{times['decode']:.4f} | "
                          f"{times['sm80']:.4f} | {times['hopper']:.4f} | "
                          + "".join(f"{times[s]:.4f} | " for s in FEW_ROWS_SPLITS)
                          + f"{times['default']:.4f} | {times['dense'] / times['default']:.2f}x", flush=True)
                    cells.append(((k, n, m, block, density), times))
    print(summary(cells))


if __name__ == "__main__":
    main()
