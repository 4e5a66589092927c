"""Pipeline timeline of the Hopper dsd / dds (8192 x 4096 -> 4096, bf16): per stage, when the producer waits for
a free slot and issues the loads, and when each consumer waits for the data.

The kernel records nothing by default. To trace, apply the profiling patch, rebuild, run, and revert:

    git apply benchmarks/profile/ws_trace.patch && pip install --no-build-isolation --no-deps -e .
    python benchmarks/profile/trace_ws.py OUT_DIR        # writes OUT_DIR/ws_trace.txt (the summary)
(the patch also reads PBSNG_WS_CTAS, a cap on the grid, for cases run on fewer SMs)
    git apply -R benchmarks/profile/ws_trace.patch

The patch was written against session 11's kernel and no longer applies (the producer changed in sessions 14-20:
next_stage's empty stages, the per-warp instantiations); port its stamps to the current produce<Cfg, kWarp>
before the next trace.

The patch stamps (globaltimer, 32 ns ticks on an H100), per CTA and pipeline stage: producer warp 0 starts
waiting for an empty slot, gets it, has issued the activation load (block 64; before session 8's second
producer warp: all of the stage's loads); each consumer starts waiting for the full slot, its
wait returns; at a tile's first stage, when each consumer has the tile's number and its lines' block counts.
The summary per case: the producer's time waiting for free slots, issuing, and between issue and the next wait;
each consumer's time starved (waiting for data); the load latency (issue to arrival) of the stages a consumer
waited for; the stages in flight when the producer gets a slot; the tile change (epilogue, the global loads of
the tile's lines, the first wait); the bytes loaded per us per SM; how long before the last CTA each CTA
received its last data (the end's imbalance).
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from trace_tiles import pct, problem_name, product_call, trace_inputs, traced_launch  # noqa: E402

TRACE_STAGES, FIELDS = 640, 12  # kTraceStages and the stamps per stage in the patch
# (op, block, density, CTAs: None = one per SM; fewer CTAs put less traffic on L2 for the same per-CTA work)
CASES = (("dsd", 64, 0.5, None), ("dsd", 64, 1.0, None), ("dsd", 64, 0.25, None), ("dds", 64, 0.5, None),
         ("dsd", 128, 0.5, None), ("dsd", 128, 0.25, None), ("dds", 128, 0.25, None), ("dsd", 64, 0.5, 66),
         ("dsd", 64, 0.5, 33), ("dsd", 64, 1.0, 66))


def summarize(label, trace, block):
    per_cta = trace.view(-1, TRACE_STAGES, FIELDS).cpu().tolist()
    stamps = [v for cta in per_cta for st in cta if st[1] for v in (st[0], st[4], st[6]) if v]
    span = max(stamps) - min(stamps)
    wait_empty, issue, between, latency, inflight = [], [], [], [], []
    starved, starved_total = [[], []], [0, 0]
    epilogue, tile_lines, tile_first = [], [], []
    nbytes, ctas = 0, 0
    cta_ends = []  # per CTA, its consumers' last data arrival (its epilogue, ~2 us, follows)
    for cta in per_cta:
        stages = [st for st in cta if st[1]]
        if not stages:
            continue
        ctas += 1
        cta_ends.append(max(v for st in stages for v in (st[4], st[6]) if v))
        arrivals = []
        for i, st in enumerate(stages):
            t_req, t_got, t_issued, b0, a0, b1, a1, flags = st[:8]
            w_tiles = bin(flags & 3).count("1") if block == 64 else 2
            nbytes += 32768 + 8192 * w_tiles
            wait_empty.append(t_got - t_req)
            if t_issued:
                issue.append(t_issued - t_got)
                if i + 1 < len(stages):
                    between.append(stages[i + 1][0] - t_issued)
            for h, (before, after) in enumerate(((b0, a0), (b1, a1))):
                if after:
                    starved_total[h] += after - before
                    if after - before > 100:  # waited: the data arrived at `after`
                        starved[h].append(after - before)
                        latency.append(after - (t_issued or t_got))
            arrivals.append(min(a for a in (a0, a1) if a) if (a0 or a1) else t_got)
            inflight.append(sum(1 for j in range(max(0, i - 8), i) if arrivals[j] > t_got))
            if flags & 4 and i + 1 < len(stages):
                nxt = stages[i + 1]
                done = max(a for a in (a0, a1) if a)
                for h in (0, 1):
                    got_tile, got_lines, first_wait = nxt[10 + h], nxt[8 + h], nxt[3 + 2 * h]
                    if got_tile and got_lines and first_wait:
                        epilogue.append(got_tile - done)
                        tile_lines.append(got_lines - got_tile)
                        tile_first.append(first_wait - got_lines)
    lines = [f"{label}: {ctas} CTAs, span {span / 1e3:.1f} us, {len(wait_empty)} stages traced, "
             f"{nbytes / span / ctas * 1e3 / 1024:.1f} KB/us per CTA (loads)"]
    lines.append(f"  producer per stage: waits for a free slot {sum(wait_empty) / (span * ctas):.2f} of the span "
                 f"(median {statistics.median(wait_empty):.0f} ns); issuing the loads median "
                 f"{statistics.median(issue) if issue else 0:.0f} ns (p90 {pct(issue, 0.9):.0f}); from the issue to "
                 f"the next wait (index loads) median {statistics.median(between) if between else 0:.0f} ns "
                 f"(p90 {pct(between, 0.9):.0f})")
    for h in (0, 1):
        lines.append(f"  consumer {h}: starved {starved_total[h] / (span * ctas):.2f} of the span, "
                     f"{len(starved[h])} waits, median {statistics.median(starved[h]) if starved[h] else 0:.0f} ns")
    lines.append(f"  load latency (issue -> arrival, stages a consumer waited for): median {statistics.median(latency):.0f}"
                 f" ns, p10 {pct(latency, 0.1):.0f}, p90 {pct(latency, 0.9):.0f}")
    end = max(cta_ends)
    idle = [(end - e) / 1e3 for e in cta_ends]
    lines.append(f"  CTAs done before the last one (the end's imbalance): {sum(idle) / len(idle) / span * 1e3:.3f} of the "
                 f"span; per CTA median {statistics.median(idle):.1f} us, p90 {pct(idle, 0.9):.1f}, max {max(idle):.1f}")
    hist = {k: inflight.count(k) for k in sorted(set(inflight))}
    lines.append(f"  stages in flight when the producer gets a slot (not yet arrived): {hist}")
    if epilogue:
        lines.append(f"  tile change per consumer: last stage -> next tile's number (epilogue) median "
                     f"{statistics.median(epilogue):.0f} ns (p90 {pct(epilogue, 0.9):.0f}); -> its lines and counts "
                     f"(global loads) median {statistics.median(tile_lines):.0f} ns (p90 {pct(tile_lines, 0.9):.0f});"
                     f" -> first wait {statistics.median(tile_first):.0f} ns; {len(epilogue)} tile changes")
    return "\n".join(lines)


def main():
    out, x, dy = trace_inputs()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    trace = torch.zeros(sms * TRACE_STAGES * FIELDS, dtype=torch.int64, device="cuda")
    report = [problem_name(x, dy)]
    for op, block, density, ctas in CASES:
        run = product_call(op, block, density, x, dy, None)
        for _ in range(5):
            run()
        traced_launch(run, trace, **({"PBSNG_WS_CTAS": str(ctas)} if ctas else {}))
        report.append(summarize(f"{op} block {block} density {density}" + (f", {ctas} CTAs" if ctas else ""),
                                trace, block))
        print(report[-1], flush=True)
    with open(os.path.join(out, "ws_trace.txt"), "w") as f:
        f.write("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
