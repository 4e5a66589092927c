// dds on Hopper (TMA + warp-specialized wgmma) for bf16 inputs; kernel_sm90_ws.cuh has the kernel.
#include "block_sparse/sm90_launchers.cuh"

PBSNG_DEFINE_DDS_SM90_LAUNCHER(DType::kBFloat16)
