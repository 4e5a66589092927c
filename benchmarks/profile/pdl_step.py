"""Training steps of one BlockSparseLinear with the programmatic launch on and off (_ops.set_programmatic_launch),
timed interleaved in one process, eagerly and replayed from CUDA graphs of 4 steps; then a kernel timeline of a few
eager steps under each setting (torch.profiler's CUDA trace): which kernel starts when, on which stream.

    python benchmarks/profile/pdl_step.py [--blocks 128] [--densities 0.25,0.5] [--rounds 7] [--out DIR]

Written in session 44: the H200's bar runs with the programmatic launch (bar_cells run 3-4) timed the eager step at
block 128, density 0.25 / 0.5 ~5 % slower (0.5-9 %) than the runs before it (runs 1-2), within the spread of eager
steps across processes, while the A/B of the backward alone (ab_programmatic_launch_*.txt) found no difference.
"""
import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pytorch_block_sparse_ng import BlockSparseLinear, _ops  # noqa: E402

from bench_linear import ab_setup, graph_timers, rounds_ms, time_ms, with_knobs  # noqa: E402

SETTINGS = {"on": True, "off": False}


def timeline(step, launch, out, label, steps=4):
    """Print the kernels of the last two of `steps` eager steps: start (us from the first of them), duration,
    stream and name, from torch.profiler's chrome trace."""
    with _ops.forced_knobs((_ops.set_programmatic_launch, launch)):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    path = os.path.join(out, f"trace_{label}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    events.sort(key=lambda e: e["ts"])
    per_step = len(events) // steps
    tail = events[-2 * per_step:]
    t0 = tail[0]["ts"]
    print(f"{label}: {per_step} kernels per step; the last two steps:")
    end = t0
    for e in tail:
        gap = e["ts"] - end
        end = max(end, e["ts"] + e["dur"])
        print(f"  {e['ts'] - t0:8.1f} +{e['dur']:7.1f} us  gap {gap:6.1f}  stream {e['args'].get('stream')}  "
              f"{e['name'][:90]}")
    print(f"  span of the two steps: {end - t0:.1f} us")


def main():
    args, x, dy = ab_setup(__doc__, rounds=7, extra=(("--out", "."),))
    xg = x.clone().requires_grad_(True)
    for block in args.blocks:
        for density in args.densities:
            layer = BlockSparseLinear(args.k, args.n, density=density, block_shape=(block, block), device="cuda",
                                      dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))

            def step(layer=layer):
                return torch.autograd.grad(layer(xg), (xg, layer.weight.data, layer.bias), dy)

            steps = {name: with_knobs(step, [(_ops.set_programmatic_launch, value)])
                     for name, value in SETTINGS.items()}
            timers = {f"eager {name}": (lambda fn=fn: time_ms(fn)) for name, fn in steps.items()}
            timers.update({f"graph {name}": t for name, t in graph_timers(steps, 4, 30).items()})
            times = rounds_ms(timers, args.rounds)
            print(f"block {block} density {density}: ms per step, median over {args.rounds} rounds (range); "
                  "off / on per round")
            for mode in ("eager", "graph"):
                on, off = times[f"{mode} on"], times[f"{mode} off"]
                ratios = [b / a for a, b in zip(on, off)]
                print(f"  {mode}: on {statistics.median(on):.4f} ({min(on):.4f}-{max(on):.4f})  "
                      f"off {statistics.median(off):.4f} ({min(off):.4f}-{max(off):.4f})  "
                      f"off / on {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
            for name, value in SETTINGS.items():
                timeline(step, value, args.out, f"b{block}_d{density}_{name}")


if __name__ == "__main__":
    main()
