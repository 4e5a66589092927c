"""Is the dds (dx = dy W) slower than the dsd because of its W^T operand? A diagnostic without kernel changes.

dx = dy W is also the dsd of dy with the block-sparse matrix W^T, whose blocks are W's blocks transposed, in
W's column-major order (perm_t), with the transposed index (the mask's transpose). So one copy of the blocks,
gathered and transposed by PyTorch, turns the dds into a dsd: the block-32 dds reads W^T tiles MN-major in
64-byte rows, the dsd reads K-major W tiles in 128-byte rows (kernel_sm90_b32.cuh, Config::kWideRows).

Per block and density, interleaved over rounds (a fresh pattern per round): the dds on W's blocks ("dds_on_w",
set_hopper_b32_dds_copy(0)); the dds as the binding runs it ("dds": since session 30, blocks of 32 from density 0.2
make the copy with kernel_transpose_blocks.cuh and run the dsd kernel on it); the dsd on a copy made beforehand;
PyTorch's copy alone (two ways); PyTorch's copy + the dsd. Checks that the dsd on the copy equals the dds.

    python benchmarks/profile/dds_transposed_copy.py [--shape 8192x4096x4096] [--blocks 32,64,128] [--rounds 3]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from pytorch_block_sparse_ng import _C, _ops  # noqa: E402
from pytorch_block_sparse_ng.layout import INDEX_NAMES, indices_from_block_mask  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report  # noqa: E402


def main():
    args, _, dy = ab_setup(__doc__, rounds=3)
    for block in args.blocks:
        for density in args.densities:
            def variants(mat):
                data, index = mat.data.detach(), mat.indices()
                row_order, col_order = index[-2], index[-1]
                perm = index[INDEX_NAMES.index("perm_t")].long()
                built = indices_from_block_mask(mat.block_mask().T)
                index_t = tuple(built[name] for name in INDEX_NAMES) + (col_order, row_order)

                def copy_select():
                    return torch.index_select(data.transpose(1, 2), 0, perm).contiguous()

                def copy_gather_first():
                    return data[perm].transpose(1, 2).contiguous()

                data_t = copy_select()
                dx = _C.dds(dy, data, *index)
                dx_t = _C.dsd(dy, data_t, None, *index_t)
                err = (dx.float() - dx_t.float()).abs().max().item() / max(dx.float().abs().max().item(), 1e-30)
                if err > 1e-2:
                    raise SystemExit(f"block {block} density {density}: the dsd on the copy differs by {err:.3g}")

                def dds_on_w():
                    with _ops.forced_knobs((_C.set_hopper_b32_dds_copy, 0)):
                        return _C.dds(dy, data, *index)

                return {"dds_on_w": dds_on_w,
                        "dds": lambda: _C.dds(dy, data, *index),
                        "dsd_on_copy": lambda: _C.dsd(dy, data_t, None, *index_t),
                        "copy_select": copy_select,
                        "copy_gather_first": copy_gather_first,
                        "copy+dsd": lambda: _C.dsd(dy, copy_select(), None, *index_t)}

            times = interleaved_times(args, block, density, variants)
            print(ratio_report(f"block {block:3d} density {density:4.2f}", times), flush=True)


if __name__ == "__main__":
    main()
