"""The issue's bar cells, every compared method timed in the same rounds (bf16, --shape, default 8192 x 4096 ->
4096): BlockSparseLinear with blocks of 64 and 128 against dense F.linear (cuBLAS), and with blocks of 128
against STK (stanford-stk, when importable), as the forward and as the training step (forward + grad input +
grad weight + grad bias), each eagerly (median of 30 CUDA-event timings) and replayed from a CUDA graph (20
forward calls or 4 steps). In every round each method of a group is timed once, in an order rotating by round;
each cell is the median over rounds of the per-round ratio, with its range. bench_linear.py times dense once per
shape, at whatever clock the GPU has then: on the H100 the clock drifts with the power cap (1.26-1.98 GHz
within a second of sustained load, benchmarks/profile/graph_step_timeline.py), and dense alone took 0.345-0.405
ms within one process, so a bar at the edge needs its ratio measured in the same rounds.

    python benchmarks/bar_cells.py [--rounds 7] [--shape 8192x4096x4096] [--blocks 64,128]
        [--densities 0.1,0.25,0.5,1.0] [--order rotate|shuffle] [--settle 0]

--order shuffle (session 44) draws each round's order at random instead of rotating one fixed order, in which each
method always follows the same neighbour (block 128 at density 0.1 after block 64 at 1.0, STK after ours).
--settle S (session 45) runs each method by itself for S seconds before its timing, so that it is timed at the
clock of its own sustained load, not at the one its predecessor left: under the power cap the same kernel read
0.052 ms after an idle half second and 0.059-0.072 ms right after dense (benchmarks/results/neighbour_effect_*.txt).
See bench_linear.rounds_ms.
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_linear import ab_setup, bar_methods, graph_timers, rounds_ms, time_ms, try_import_stk  # noqa: E402


def report(group, times, pairs):
    """Each method's median time, then for each (numerator, denominator) pair the median and range of the
    per-round ratio numerator / denominator (a speedup of the denominator)."""
    print(f"{group}:")
    print("  " + "  ".join(f"{name} {statistics.median(t):.4f}" for name, t in times.items()) + "  (ms)")
    for num, den in pairs:
        ratios = [a / b for a, b in zip(times[num], times[den])]
        print(f"  {num} / {den}: {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})",
              flush=True)


def main():
    args, x, dy = ab_setup(__doc__, rounds=7, extra=(("--order", "rotate"), ("--settle", "0")))
    print(f"order of each round: {args.order}; each method run by itself for {args.settle} s before its timing")
    forwards, steps, pairs = bar_methods(args, x, dy, try_import_stk())
    no_stk = {name: fn for name, fn in forwards.items() if not name.startswith("stk")}

    def rounds(timers):
        return rounds_ms(timers, args.rounds, args.order, float(args.settle))

    with torch.no_grad():
        report("forward, eager", rounds({n: (lambda f=f: time_ms(f)) for n, f in forwards.items()}), pairs)
        report("forward, graph of 20 calls", rounds(graph_timers(no_stk, 20, 30)),
               [p for p in pairs if not p[0].startswith("stk")])
    report("training step, eager", rounds({n: (lambda f=f: time_ms(f)) for n, f in steps.items()}), pairs)
    report("training step, graph of 4 steps", rounds(graph_timers(steps, 4, 30)), pairs)


if __name__ == "__main__":
    main()
