"""Does a heavy path slow the one timed right after it? The dsd's default path and the same kernel under the
knobs of dsd_mid_rows.py's hopper column, each captured twice, timed in rounds of rotating order beside dense.

    python benchmarks/profile/neighbour_effect.py [--blocks 128] [--densities 0.1,0.25] [--rounds 7] [--pause 0.5]

Written in session 44 after dsd_mid_rows.py's run 10 (H200, 8192 x 4096 -> 4096), where the default column read up
to 1.19x the hopper column (blocks of 128, density 0.1: 0.0626 against 0.0527 ms), though at 8192 tokens both launch
the same kernel with the same parameters. rounds_ms rotated one fixed order, so there the default path was always
timed right after dense or the split of 8 (0.1-0.4 s of full load). Here the order is dense, default, hopper, default
again, hopper again: with a neighbour effect, `default` (after dense) reads slower than `default again` (after
hopper), and the gap closes with --pause (seconds of idle before each timing).

Run in session 45 (benchmarks/results/neighbour_effect_NVIDIA_H200.txt): the four columns of the kernel agree within
1-4 % (the one after dense the slowest), and after half a second of idle all four read 0.0518-0.0519 ms, 14-15 %
faster than after other load. So the clock left by the preceding work sets the time of a light kernel; no faster path
hides in the hopper knobs. The bar cells are since timed with --settle (bench_linear.rounds_ms).
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pytorch_block_sparse_ng import BlockSparseMatrix, _extension, _ops  # noqa: E402

from bench_linear import ab_setup, graph_timers, rounds_ms, with_knobs  # noqa: E402


def main():
    args, x, _ = ab_setup(__doc__, rounds=7, extra=(("--pause", "0"),))
    pause = float(args.pause)
    ops = _extension.get()
    w = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)
    hopper_knobs = [(_ops.set_decode_max_rows, 0), (_ops.set_hopper_min_rows, 1), (_ops.set_hopper_few_rows_split, 0)]
    for block in args.blocks:
        for density in args.densities:
            mat = BlockSparseMatrix.randn((args.n, args.k), density=density, block_shape=(block, block),
                                          dtype=torch.bfloat16, device="cuda")
            data, index = mat.data.detach(), mat.indices()

            def run():
                return ops.dsd(x, data, None, *index)

            fns = {"dense": lambda: F.linear(x, w), "default": run, "hopper": with_knobs(run, hopper_knobs),
                   "default again": run, "hopper again": with_knobs(run, hopper_knobs)}
            timers = graph_timers(fns, 20, 15)
            if pause > 0:
                timers = {name: (lambda t=t: (time.sleep(pause), t())[1]) for name, t in timers.items()}
            times = rounds_ms(timers, args.rounds)
            print(f"block {block} density {density} (pause {pause} s): ms per call in a graph of 20, median over "
                  f"{args.rounds} rounds (range)")
            for name, t in times.items():
                print(f"  {name:14s} {statistics.median(t):.4f} ({min(t):.4f}-{max(t):.4f})", flush=True)


if __name__ == "__main__":
    main()
