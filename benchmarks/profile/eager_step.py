"""Eager training step (forward + both gradients, torch.autograd.grad) and no-grad forward of one
BlockSparseLinear, 8192 x 4096 -> 4096 bf16, in a fresh process: wall time per call over 30 calls and the host's
share (time to enqueue them), with the Hopper dsd / dds tile schedule and the sdd's tail split at their defaults
and switched to the alternatives.

    python benchmarks/profile/eager_step.py

Written when bench_linear.py's long-running process showed eager steps 2-3x their CUDA-graph time for blocks of
128 at density 0.1 / 0.25 (session 11): here the same steps take their graph time.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pytorch_block_sparse_ng import BlockSparseLinear, _C, _ops  # noqa: E402

from binding_host_time import host_and_wall_us  # noqa: E402

CASES = ((128, 0.25), (128, 0.1), (64, 0.25), (128, 0.5))  # (block, density)
SETTINGS = (("auto", "auto", True), ("rr", "round_robin", True), ("auto,notail", "auto", False))


def wall_ms(fn):
    """(wall, host) ms per call over 30 calls after 5 warm-up ones; host = the time to enqueue them."""
    host, wall = host_and_wall_us(fn, calls=30, warmup=5)
    return wall / 1e3, host / 1e3


def main():
    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    for block, density in CASES:
        torch.manual_seed(0)
        layer = BlockSparseLinear(k, n, density=density, block_shape=(block, block), device="cuda",
                                  dtype=torch.bfloat16)
        params = (x, layer.weight.data, layer.bias)

        def step():
            torch.autograd.grad(layer(x), params, dy)

        def forward():
            with torch.no_grad():
                layer(x)

        cells = []
        for name, schedule, tail_split in SETTINGS:
            with _ops.forced_knobs((_ops.set_hopper_tile_schedule, schedule),
                                   (_C.set_hopper_sdd_tail_split, tail_split)):
                step_ms, step_host = wall_ms(step)
                fwd_ms, fwd_host = wall_ms(forward)
            cells.append(f"{name}: step {step_ms:.3f} ms (host {step_host:.3f}) fwd {fwd_ms:.3f} (host {fwd_host:.3f})")
        print(f"block {block} density {density}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
