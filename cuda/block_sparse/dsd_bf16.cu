// dsd for bf16 inputs, blocks 32 / 64 / 128 (kernel_sm80.cuh has the kernel and its constraints).
#include "block_sparse/kernel_sm80.cuh"

PBSNG_DEFINE_DSD_LAUNCHER(DType::kBFloat16)
