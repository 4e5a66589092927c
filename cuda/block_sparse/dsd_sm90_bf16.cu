// dsd on Hopper (wgmma) for bf16 inputs, blocks 64 / 128 (kernel_sm90.cuh has the kernel and its constraints).
#include "block_sparse/kernel_sm90.cuh"

PBSNG_DEFINE_DSD_SM90_LAUNCHER(DType::kBFloat16)
