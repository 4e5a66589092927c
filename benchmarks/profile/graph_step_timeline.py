"""What a training step replayed from a CUDA graph spends its time on: the GPU timeline of one replay (every
kernel and memset, its start relative to the replay's first one, its duration, the idle gap before it), for
BlockSparseLinear's step (the eager autograd node: dsd, then sdd and dds on two streams) and, when installed,
STK's (dds, dds, sdd, dy.sum), as bench_linear times them. Also each method's forward alone (eager and in a
graph of 20 calls), its step's GPU time in a graph of 4 steps and of 1 step, and the sum of the kernels'
durations in the timeline: what the kernels take inside the step against the span.

    python benchmarks/profile/graph_step_timeline.py [--shape 8192x4096x4096] [--blocks 128]
        [--densities 0.1,0.25,0.5,1.0]

Note: the profiled replay's first event (a memset node) shows a 15-35 us gap before the next kernel that the
unprofiled replays do not have (their CUDA-event times match the span without it): a profiler artifact.
"""
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseLinear  # noqa: E402

from bench_linear import ab_setup, capture_graph, stk_functions, time_graph_ms, time_ms, try_import_stk  # noqa: E402

T0 = time.time()  # the phases' wall-clock offsets, to line them up with a clock / power log (nvidia-smi -lms)


def short(name):
    """A kernel's name without its namespaces and parameter list."""
    for prefix in ("void ", "pbsng::sm90ws::", "pbsng::sm90sdd::", "pbsng::", "cutlass::"):
        name = name.replace(prefix, "")
    return name.split("(")[0][:90]


def timeline(label, fn):
    """One replay of a one-step graph under the profiler (after 5 unprofiled replays)."""
    graph = capture_graph(fn, 1)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    if not events:
        print(f"{label}: the profiler recorded no GPU activity in the graph")
        return
    t0 = events[0].time_range.start
    busy_end = t0
    total = 0.0
    print(f"{label}: one replay, times in us (start, duration, idle before it)")
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        idle = max(0.0, start - busy_end)
        print(f"  {start - t0:8.1f} {end - start:8.1f} {idle:6.1f}  {short(e.name)}")
        busy_end = max(busy_end, end)
        total += end - start
    print(f"  span {busy_end - t0:.1f} us, kernels' durations summed {total:.1f} us "
          f"(> span where two run at once)")


def main():
    args, x, dy = ab_setup(__doc__, rounds=1)
    xg = x.clone().requires_grad_(True)
    stk = try_import_stk()
    for block in args.blocks:
        for density in args.densities:
            layer = BlockSparseLinear(args.k, args.n, density=density, block_shape=(block, block), device="cuda",
                                      dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
            params = (xg, layer.weight.data, layer.bias)

            def step():
                torch.autograd.grad(layer(xg), params, dy)

            def forward():
                with torch.no_grad():
                    layer(x)

            methods = {"ours": (forward, step)}
            if stk is not None and block == 128:
                peer = stk_functions(stk, layer.weight.to_dense().detach(), x, dy)
                methods["stk"] = (peer["forward"], peer["step"])
            for name, (fwd, fn) in methods.items():
                label = f"{name} block {block} density {density}"
                print(f"[{time.time() - T0:7.2f} s] {label}: forward eager {time_ms(fwd):.4f} ms, in a graph of 20 "
                      f"{time_graph_ms(fwd, 20, 30):.4f} ms; step in a graph of 4 {time_graph_ms(fn, 4, 30):.4f} ms, "
                      f"of 1 {time_graph_ms(fn, 1, 30):.4f} ms", flush=True)
                timeline(label, fn)


if __name__ == "__main__":
    main()
