"""Activation tiles that the two-lines-per-tile Hopper dsd / dds load for random block masks, by how the lines
are paired (layout.pair_order): rows 2i, 2i + 1; the greedy pairs (pair_order with max_matched_rows=0); the
default (a maximum-weight matching over each row's best partners); and, up to 128 rows, the matching over all
pairs of rows (pair_order with every other row a candidate). Counts on the CPU, with pair_order's time.

    python benchmarks/profile/pair_tiles.py [--grids 64x64,65x40,128x64,172x64,256x128,512x128]
        [--densities 0.1,0.25,0.5,0.9] [--seed 5]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from pytorch_block_sparse_ng.layout import pair_order  # noqa: E402


def tiles(mask, order):
    """Tiles loaded with the lines paired as in `order`: each pair's union, a line left alone its own."""
    order = order.long()
    even = len(order) // 2 * 2
    count = int((mask[order[0:even:2]] | mask[order[1:even:2]]).sum())
    return count + (int(mask[order[-1]].sum()) if len(order) % 2 else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grids", default="64x64,65x40,128x64,172x64,256x128,512x128")
    parser.add_argument("--densities", default="0.1,0.25,0.5,0.9")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    print("grid density: tiles with rows 2i, 2i+1 / greedy pairs / default (vs greedy) / all-pairs matching "
          "(default vs it) / pair_order's time")
    for grid in args.grids.split(","):
        rows, cols = (int(v) for v in grid.split("x"))
        for density in (float(d) for d in args.densities.split(",")):
            mask = torch.rand(rows, cols, generator=gen) < density
            start = time.perf_counter()
            order = pair_order(mask)
            seconds = time.perf_counter() - start
            identity = tiles(mask, torch.arange(rows))
            greedy = tiles(mask, pair_order(mask, max_matched_rows=0))
            default = tiles(mask, order)
            line = f"{grid} d={density}: {identity} / {greedy} / {default} ({default / greedy - 1:+.2%})"
            if rows <= 128:
                best = tiles(mask, pair_order(mask, candidates=rows - 1))  # every partner a candidate: the optimum
                line += f" / {best} ({default / best - 1:+.2%})"
            print(line + f" / {seconds:.2f} s", flush=True)


if __name__ == "__main__":
    main()
