"""Run the products once each for Nsight Compute (ncu): dense F.linear, and dsd / dds / sdd on a random pattern.

    ncu --clock-control none -k regex:'ws_kernel|sdd_kernel|nvjet|gemm' python benchmarks/profile/ncu_dsd.py
    ncu --clock-control none -k regex:'sdd_kernel|_dds_kernel|ws_kernel' python benchmarks/profile/ncu_dsd.py \
        --block 128 --densities 0.25 --stk   (ours against STK on one pattern)
"""
import argparse

import torch
import torch.nn.functional as F

from pytorch_block_sparse_ng import BlockSparseMatrix, _extension


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8192x4096x4096")
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--densities", default="0.5,1.0")
    parser.add_argument("--products", default="dsd,dds,sdd", help="comma-separated subset of dsd,dds,sdd")
    parser.add_argument("--stk", action="store_true",
                        help="also STK's products on the same pattern (blocks of 128; stanford-stk installed): its "
                             "forward (_dds_kernel of x and W^T) for dsd, _dds_kernel of dy and W for dds, _sdd_kernel")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    ops = _extension.get()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    F.linear(x, w)
    for density in (float(d) for d in args.densities.split(",")):
        mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(args.block, args.block),
                                      dtype=torch.bfloat16, device="cuda")
        data, index = mat.data.detach(), mat.indices()
        products = args.products.split(",")
        if "dsd" in products:
            ops.dsd(x, data, None, *index)
        if "dds" in products:
            ops.dds(dy, data, *index)
        if "sdd" in products:
            ops.sdd(dy, x, *index, (args.block, args.block))
        if args.stk:
            import stk

            sw = stk.ops.to_sparse(mat.to_dense(data).detach(), blocking=args.block)
            if "dsd" in products:
                stk.ops.dds(x, sw.t())
            if "dds" in products:
                stk.ops.dds(dy, sw)
            if "sdd" in products:
                stk.ops.sdd(dy.t(), x, sw)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
