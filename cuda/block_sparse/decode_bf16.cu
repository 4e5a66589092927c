// dsd for few rows of M (decode), bf16 inputs, blocks 32 / 64 / 128 (kernel_decode.cuh has the kernel).
#include "block_sparse/kernel_decode.cuh"

PBSNG_DEFINE_DECODE_LAUNCHER(DType::kBFloat16)
