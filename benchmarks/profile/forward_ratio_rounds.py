"""The forward's speedup over dense with dense timed in the same rounds: dense F.linear and BlockSparseLinear at
each density, every one timed once per round (eager: median of 30 CUDA-event timings; graph: a CUDA graph of
20 calls), in an order rotating by round. Prints each method's median, the ratio of the medians, the median of
the per-round ratios and the per-round ratios themselves: how far a one-shot cell (bench_linear times dense
once per shape) can move with the GPU's clock, which drifts with its power cap
(benchmarks/profile/graph_step_timeline.py).

    python benchmarks/profile/forward_ratio_rounds.py [--shape 8192x4096x4096] [--blocks 64] [--rounds 7]
"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseLinear  # noqa: E402

from bench_linear import ab_setup, time_graph_ms, time_ms  # noqa: E402


def main():
    args, x, _ = ab_setup(__doc__, rounds=7)
    w = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16) / args.k ** 0.5
    b = torch.zeros(args.n, device="cuda", dtype=torch.bfloat16)
    fns = {"dense": lambda: F.linear(x, w, b)}
    for block in args.blocks:
        for density in args.densities:
            layer = BlockSparseLinear(args.k, args.n, density=density, block_shape=(block, block), device="cuda",
                                      dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
            fns[f"block {block} density {density}"] = lambda layer=layer: layer(x)
    for mode in ("eager", "graph of 20"):
        times = {name: [] for name in fns}
        items = list(fns.items())
        with torch.no_grad():
            for r in range(args.rounds):
                shift = r % len(items)
                for name, fn in items[shift:] + items[:shift]:
                    times[name].append(time_ms(fn) if mode == "eager" else time_graph_ms(fn, 20, 30))
        dense = times.pop("dense")
        print(f"{mode}: dense median {statistics.median(dense):.4f} ms (min {min(dense):.4f}, max {max(dense):.4f})")
        for name, t in times.items():
            rounds = [d / s for d, s in zip(dense, t)]
            print(f"  {name}: {statistics.median(t):.4f} ms, ratio of medians "
                  f"{statistics.median(dense) / statistics.median(t):.3f}, median of round ratios "
                  f"{statistics.median(rounds):.3f}, rounds {[round(v, 3) for v in rounds]}", flush=True)


if __name__ == "__main__":
    main()
