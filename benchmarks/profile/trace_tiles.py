"""Per-tile timeline of the Hopper 256-token dsd / dds (8192 x 4096 -> 4096, bf16): when each consumer gets a
tile, gets its first data, finishes its mainloop and each part of its epilogue (the dsd with a bias, as the
layer calls it), and when the producer's two warps take the tile, finish its index chain and issue its first
loads; from that the end's imbalance (how long the SMs wait for the last one), the tile change, and the time
per stage.

The kernel records nothing by default. To trace, apply the profiling patch, rebuild, run, and revert:

    git apply benchmarks/profile/ws_tile_trace.patch && pip install --no-build-isolation --no-deps -e .
    python benchmarks/profile/trace_tiles.py OUT_DIR      # writes OUT_DIR/tile_trace.txt
    git apply -R benchmarks/profile/ws_tile_trace.patch

The patch applies to the kernels of session 34 (main 2225e6a onwards; the producer's stamps, the consumers' slot
releases and warp 0's chain step by step added then). (`ws_trace.patch` / `trace_ws.py` are session 8-11's per-stage trace,
written for an older producer.)
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _C  # noqa: E402

TRACE_TILES, FIELDS = 64, 20  # kTraceTiles and the stamps per tile and consumer in the patch (kTraceFields)
CASES = (("dsd", 128, 0.5), ("dsd", 128, 0.25), ("dsd", 128, 0.1), ("dsd", 128, 1.0), ("dsd", 64, 0.5),
         ("dsd", 64, 0.25), ("dds", 128, 0.5))
if os.environ.get("TRACE_CASES"):  # e.g. "dsd:128:0.25,dsd:64:0.5"
    CASES = tuple((op, int(b), float(d)) for op, b, d in (c.split(":") for c in os.environ["TRACE_CASES"].split(",")))
LAUNCHES = 2  # traced launches per case, each summarised


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def trace_inputs():
    """The output folder (argv[1], default .), and x (M, K) and dy (M, N) of the traced problem, bf16 on the GPU:
    8192 x 4096 -> 4096. Shared with trace_ws.py."""
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    m, k, n = 8192, 4096, 4096
    return out, torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(m, n, device="cuda",
                                                                                    dtype=torch.bfloat16)


def problem_name(x, dy):
    return f"{torch.cuda.get_device_name()}, bf16 {x.shape[0]} x {x.shape[1]} -> {dy.shape[1]}"


def product_call(op, block, density, x, dy, bias):
    """The Hopper dsd (with `bias`) or dds of a fresh random pattern (seed 0) of an (N, K) bf16 weight, as a
    function of no arguments. Shared with trace_ws.py."""
    torch.manual_seed(0)
    n, k = dy.shape[1], x.shape[1]
    mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block), dtype=torch.bfloat16,
                                  device="cuda")
    data, index = mat.data.detach(), mat.indices()
    return {"dsd": lambda: _C.dsd(x, data, bias, *index), "dds": lambda: _C.dds(dy, data, *index)}[op]


def traced_launch(run, trace, **env):
    """One launch of `run` recording into `trace` (zeroed first) through the profiling patch, with any other
    PBSNG_* variables the patch reads set for it. Shared with trace_ws.py."""
    trace.zero_()
    env = {"PBSNG_WS_TRACE": str(trace.data_ptr()), **env}
    os.environ.update(env)
    try:
        run()
        torch.cuda.synchronize()
    finally:
        for key in env:
            os.environ.pop(key)


def med(values):
    return f"{statistics.median(values):.0f}" if values else "-"


def summarize(trace, sms):
    """One traced launch: the end's imbalance, the tile change and the time per stage (us)."""
    rows = trace.view(sms, TRACE_TILES, 2, FIELDS).cpu().tolist()
    ctas = []  # per CTA: its tiles as (tile, got, first, done, stored, stages) of consumer 0, and consumer 1's
    for cta in rows:
        tiles = [(c0, c1) for c0, c1 in cta if c0[0]]
        if tiles:
            ctas.append(tiles)
    start = min(min(c0[1], c1[1]) for c0, c1 in (t[0] for t in ctas))
    ends = [max(max(c0[4], c1[4]) for c0, c1 in tiles) for tiles in ctas]
    span = max(ends) - start
    idle = [(max(ends) - e) / 1e3 for e in ends]
    busy = sum(e - start for e in ends) / len(ends)
    change, first_wait, epilogue, per_stage = [], [], [], []
    rounding, part0, part1_wait, part1 = [], [], [], []
    # The producer at a tile change, ns from the previous tile's last wgmma (negative: before it): warp 0 takes the
    # tile, its index chain (tile -> lines -> offsets -> keys) ends, its first stage is armed (slot free) and the
    # activation load issued; warp 1's chain ends and its first W load is issued; the first stage's load latency.
    take, chain0, slot0, issue0, ready1, issue1, latency = [], [], [], [], [], [], []
    free0, free1 = [], []  # when the consumers freed the slots of the next tile's first two stages
    steps = [[], [], [], []]  # blocks of 128, warp 0's chain: queue slot, line, offsets, keys window (ns after taking)
    last_stages, last_len = [], []
    for tiles in ctas:
        for n, (c0, c1) in enumerate(tiles):
            for c in (c0, c1):
                if c[2] and c[5]:
                    per_stage.append((c[3] - c[2]) / c[5])
                    first_wait.append(c[2] - c[1])
                epilogue.append(c[4] - c[3])
                if c[6] and c[7]:
                    rounding.append(c[6] - c[3])  # the previous tile's store read, the bias, the rounding
                    part0.append(c[7] - c[6])  # stmatrix, fence, barrier, TMA store issue
                    if c[8]:
                        part1_wait.append(c[8] - c[7])  # part 0's store has read shared memory
                        part1.append(c[4] - c[8])
            if n + 1 < len(tiles):
                nxt = tiles[n + 1]
                done = max(c0[3], c1[3])
                change.append(max(nxt[0][2], nxt[1][2]) - done)  # last wgmma -> next first data
                pr = nxt[0]
                if all(pr[9:14]) and nxt[0][2]:
                    take.append(pr[9] - done)
                    chain0.append(pr[10] - pr[9])
                    slot0.append(pr[11] - pr[10])
                    issue0.append(pr[11] - done)
                    ready1.append(pr[12] - done)
                    issue1.append(pr[13] - done)
                    latency.append(max(nxt[0][2], nxt[1][2]) - max(pr[11], pr[13]))
                    if all(pr[16:20]):
                        for i in range(4):
                            steps[i].append(pr[16 + i] - (pr[9] if i == 0 else pr[15 + i]))
                    if c0[14] and c1[14]:
                        free0.append(max(c0[14], c1[14]) - done)
                        free1.append(max(c0[15], c1[15]) - done)
        c0, c1 = tiles[-1]
        last_stages.append(c0[5])
        last_len.append((max(c0[4], c1[4]) - c0[1]) / 1e3)
    n_tiles = sum(len(t) for t in ctas)
    return (f"span {span / 1e3:.1f} us, {len(ctas)} CTAs, {n_tiles} tiles ({n_tiles / len(ctas):.2f} per CTA); "
            f"end's imbalance: CTAs idle {sum(idle) / len(idle) / (span / 1e3):.3f} of the span on average "
            f"(median {statistics.median(idle):.1f} us, p90 {pct(idle, 0.9):.1f}, max {max(idle):.1f}); "
            f"balanced end would be {busy / span:.3f} of the span\n"
            f"    per stage (first data -> last wgmma / stages) median {statistics.median(per_stage):.0f} ns; "
            f"first wait of a tile median {statistics.median(first_wait):.0f} ns (p90 {pct(first_wait, 0.9):.0f}); "
            f"epilogue (last wgmma -> last store issued) median {statistics.median(epilogue):.0f} ns "
            f"(p90 {pct(epilogue, 0.9):.0f}); tile change (last wgmma -> next tile's first data) median "
            f"{statistics.median(change) if change else 0:.0f} ns (p90 {pct(change, 0.9):.0f})\n"
            f"    epilogue parts, median ns: wait + bias + rounding {med(rounding)}, part 0 written and its store "
            f"issued {med(part0)}, wait for part 0's store to read shared memory {med(part1_wait)} (p90 "
            f"{pct(part1_wait, 0.9):.0f}), part 1 {med(part1)}\n"
            f"    producer at a tile change, median ns from the last wgmma (p10 / p90): warp 0 takes the tile "
            f"{med(take)} ({pct(take, 0.1):.0f} / {pct(take, 0.9):.0f}), its index chain {med(chain0)}, its first "
            f"slot wait {med(slot0)} ({pct(slot0, 0.1):.0f} / {pct(slot0, 0.9):.0f}), first activation load issued "
            f"{med(issue0)} ({pct(issue0, 0.1):.0f} / {pct(issue0, 0.9):.0f}); warp 1 ready {med(ready1)}, first W "
            f"load issued {med(issue1)} ({pct(issue1, 0.1):.0f} / {pct(issue1, 0.9):.0f}); first stage issue -> "
            f"data {med(latency)} ({pct(latency, 0.1):.0f} / {pct(latency, 0.9):.0f}); the slots of the next "
            f"tile's first two stages freed {med(free0)} ({pct(free0, 0.1):.0f} / {pct(free0, 0.9):.0f}) and "
            f"{med(free1)} ({pct(free1, 0.1):.0f} / {pct(free1, 0.9):.0f})"
            + (f"; warp 0's chain, median ns per step: queue slot {med(steps[0])}, order {med(steps[1])}, offsets "
               f"{med(steps[2])}, keys window {med(steps[3])}" if steps[0] else "") + "\n"
            f"    last tile per CTA: stages median {statistics.median(last_stages)} (min {min(last_stages)}, "
            f"max {max(last_stages)}), length median {statistics.median(last_len):.1f} us (max {max(last_len):.1f})")


def main():
    out, x, dy = trace_inputs()
    bias = torch.randn(dy.shape[1], device="cuda", dtype=torch.bfloat16)  # the layer's dsd adds one
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    trace = torch.zeros(sms * TRACE_TILES * 2 * FIELDS, dtype=torch.int64, device="cuda")
    report = [f"{problem_name(x, dy)}, {LAUNCHES} traced launches per case"]
    for op, block, density in CASES:
        run = product_call(op, block, density, x, dy, bias)
        for _ in range(5):
            run()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            run()
        stop.record()
        torch.cuda.synchronize()
        report.append(f"{op} block {block} density {density}: untraced {start.elapsed_time(stop) / 20 * 1e3:.1f} us "
                      f"per call")
        for _ in range(LAUNCHES):
            traced_launch(run, trace)
            report.append("  " + summarize(trace, sms))
        print("\n".join(report[-1 - LAUNCHES:]), flush=True)
    with open(os.path.join(out, "tile_trace.txt"), "w") as f:
        f.write("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
