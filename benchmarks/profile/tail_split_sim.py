"""Would splitting the last wave's tiles over K (two halves, partial sums added by the second) end the Hopper dsd
sooner? A list-scheduling simulation of the 256-token kernel's tile order (token tiles feature-group first, the
last `band` token tiles group-major, groups longest first) on 132 SMs, with a tile's time fitted on the H100
trace (benchmarks/results/tile_trace_*.txt, block 128: 0.71 us per stage of 64, 2.37 us per tile change):
each half pays a tile change plus `over` us for its partial sums. CPU only.

    python benchmarks/profile/tail_split_sim.py
"""
import heapq
import random
import statistics


def simulate(density, seed, split_last=0, over=1.5, stage=0.71, change=2.37, band=8, token_tiles=32, lines=32,
             ctas=132, blocks_per_line=32):
    """Span (us) and the CTAs' mean idle share at the end, for a random pattern of blocks of 128."""
    rnd = random.Random(seed)
    lengths = sorted((sum(rnd.random() < density for _ in range(blocks_per_line)) for _ in range(lines)), reverse=True)
    units = [lengths[g] for _ in range(token_tiles - band) for g in range(lines)]
    units += [lengths[g] for g in range(lines) for _ in range(band)]
    times = [2 * n * stage + change for n in units]  # two k-steps of 64 per block
    if split_last:
        times = times[:-split_last] + [n * stage + change + over for n in units[-split_last:] for _ in range(2)]
    heap = [(0.0, i) for i in range(ctas)]
    ends = [0.0] * ctas
    for t in times:
        start, i = heapq.heappop(heap)
        ends[i] = start + t
        heapq.heappush(heap, (ends[i], i))
    span = max(ends)
    return span, statistics.mean(span - e for e in ends) / span


def main():
    print("density, tiles split, span us (mean of 20 patterns), idle share at the end")
    for density in (0.25, 0.5, 1.0):
        for split_last in (0, 66, 132, 198, 264):
            runs = [simulate(density, seed, split_last) for seed in range(20)]
            print(f"{density} {split_last:4d} {statistics.mean(r[0] for r in runs):7.1f} "
                  f"{statistics.mean(r[1] for r in runs):.4f}")


if __name__ == "__main__":
    main()
