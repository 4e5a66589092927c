"""Per-CTA timeline of the Hopper sdd (8192 x 4096 -> 4096, bf16): which CTAs run where and when.

The kernel records nothing by default. To trace, apply the profiling patch, rebuild, run, and revert:

    git apply benchmarks/profile/sdd_trace.patch && pip install --no-build-isolation --no-deps -e .
    python benchmarks/profile/trace_sdd.py OUT_DIR        # writes OUT_DIR/sdd_trace.json, prints the summary
    git apply -R benchmarks/profile/sdd_trace.patch
    python benchmarks/profile/trace_sdd.py --summarize OUT_DIR/sdd_trace.json   # the summary again, no GPU

The patch was made for the sdd before session 10's tail split: it applies to commit 8fed520 (check out that
commit to trace, or merge the patch into the current kernel_sm90_sdd.cuh / bindings.cpp / params.h first).

The patch gives each CTA 8 int64 slots (globaltimer ns): start, (SM, blocks, block row, sums bias), then per
consumer: first stage arrived, mainloop done, stores done. The summary gives, per case: the span, the share
of SM x span that CTAs were resident, per-SM gaps and idle tail, per chunk size the fill / mainloop / store
times, per wave the median durations, and how many CTAs run in each twentieth of the span.
"""
import json
import os
import statistics
import sys

CASES = ((64, 0.5), (64, 1.0), (64, 0.25), (128, 0.5))


def decode(rows):
    t0 = min(r[0] for r in rows)
    ctas = []
    for r in rows:
        info = r[1]
        ends = [v - t0 for v in (r[4], r[7]) if v]
        firsts = [v - t0 for v in (r[2], r[5]) if v]
        mains = [v - t0 for v in (r[3], r[6]) if v]
        if not ends:
            continue
        ctas.append(dict(sm=info & 0xFFFF, count=(info >> 16) & 0xFFFF, row=(info >> 32) & 0xFFFFFFF,
                         bias=info >> 60, start=r[0] - t0, first=min(firsts), mainend=max(mains), end=max(ends)))
    return ctas


def summarize(name, rows):
    ctas = decode(rows)
    span = max(c["end"] for c in ctas)
    by_sm = {}
    for c in ctas:
        by_sm.setdefault(c["sm"], []).append(c)
    busy = sum(c["end"] - c["start"] for c in ctas)
    gaps, tails = [], []
    for cs in by_sm.values():
        cs.sort(key=lambda c: c["start"])
        tails.append(span - cs[-1]["end"])
        gaps += [b["start"] - a["end"] for a, b in zip(cs, cs[1:])]
    lines = [f"{name}: {len(ctas)} working CTAs on {len(by_sm)} SMs, span {span / 1e3:.1f} us, resident "
             f"{busy / (len(by_sm) * span):.3f} of SM x span; CTAs per SM {len(ctas) / len(by_sm):.2f}; gaps mean "
             f"{statistics.mean(gaps) / 1e3 if gaps else 0:.2f} us; idle tail per SM mean "
             f"{statistics.mean(tails) / 1e3:.1f} us (max {max(tails) / 1e3:.1f})"]
    for count in sorted({c["count"] for c in ctas}):
        cs = [c for c in ctas if c["count"] == count]
        lines.append(f"  {count} blocks: {len(cs)} CTAs, fill {statistics.median(c['first'] - c['start'] for c in cs) / 1e3:.2f}"
                     f" us, mainloop {statistics.median(c['mainend'] - c['first'] for c in cs) / 1e3:.1f} us, store "
                     f"{statistics.median(c['end'] - c['mainend'] for c in cs) / 1e3:.2f} us, starts "
                     f"{min(c['start'] for c in cs) / 1e3:.1f}-{max(c['start'] for c in cs) / 1e3:.1f} us")
    waves = {}
    for c in ctas:
        waves.setdefault(0 if c["start"] < 5e3 else 1 if c["start"] < 0.45 * span else 2, []).append(c)
    lines.append("  by start (< 5 us / < 0.45 span / later): " + "; ".join(
        f"{len(cs)} CTAs, duration {statistics.median(c['end'] - c['start'] for c in cs) / 1e3:.1f} us, mainloop "
        f"{statistics.median(c['mainend'] - c['first'] for c in cs) / 1e3:.1f} us" for _, cs in sorted(waves.items())))
    running = [sum(1 for c in ctas if c["start"] <= span * (i + 0.5) / 20 < c["end"]) for i in range(20)]
    lines.append(f"  CTAs running in each twentieth of the span: {running}")
    return "\n".join(lines)


def trace(out_dir):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from pytorch_block_sparse_ng import BlockSparseMatrix, _C

    if not hasattr(_C, "_set_sdd_trace"):
        sys.exit("this build has no sdd trace: apply benchmarks/profile/sdd_trace.patch and rebuild")
    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    raw = {"gpu": torch.cuda.get_device_name()}
    for block, density in CASES:
        torch.manual_seed(0)
        mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block), dtype=torch.bfloat16,
                                      device="cuda")
        index, chunk = mat.indices(), 8 if block == 64 else 2
        n_ctas = (n // block) * (k // block // chunk + chunk) * 8  # grid.x * grid.y * (splits <= 8)
        for _ in range(5):
            _C.sdd(dy, x, *index, [block, block], True)
        for rep in range(3):
            slots = torch.zeros(n_ctas * 8, dtype=torch.int64, device="cuda")
            _C._set_sdd_trace(slots)
            _C.sdd(dy, x, *index, [block, block], True)
            torch.cuda.synchronize()
            _C._set_sdd_trace(None)
            rows = slots.view(-1, 8).cpu()
            raw[f"b{block}_d{density}_r{rep}"] = rows[rows[:, 0] != 0].tolist()
    with open(os.path.join(out_dir, "sdd_trace.json"), "w") as f:
        json.dump(raw, f)
    return raw


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        with open(sys.argv[2]) as f:
            raw = json.load(f)
    else:
        raw = trace(sys.argv[1] if len(sys.argv) > 1 else "/tmp")
    print(raw.get("gpu", ""), "sdd with the bias gradient, 8192 x 4096 -> 4096, bf16; last of 3 traced calls")
    for block, density in CASES:
        print(summarize(f"block {block} density {density}", raw[f"b{block}_d{density}_r2"]))


if __name__ == "__main__":
    main()
