// sdd on Hopper (TMA + warp-specialized wgmma) for bf16 inputs; kernel_sm90_sdd.cuh has the kernel,
// kernel_sm90_sdd_cpasync.cuh the one for few blocks of 128.
#include "block_sparse/sm90_launchers.cuh"

PBSNG_DEFINE_SDD_SM90_LAUNCHER(DType::kBFloat16)
