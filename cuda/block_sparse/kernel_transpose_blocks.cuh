// out[i] = data[perm[i]]^T for 32 x 32 blocks of 16-bit values: W's blocks transposed, in the order of the
// transposed index (perm_t), i.e. the data of the block-sparse W^T.
//
// Why: the block-32 Hopper dds (dx = dy W) reads W_b^T as its wgmma B operand. Read from W's blocks, that operand
// is MN-major in 64-byte rows; from W^T's blocks it is K-major and loads in 128-byte rows like the dsd's
// (kernel_sm90_b32.cuh, Config::kWideRows), and the dds becomes the dsd of dy with W^T. Measured on an H100
// (8192 x 4096 -> 4096, bf16, benchmarks/results/b32_kernel_session30_*.txt): the dsd on the copy takes 0.87 /
// 0.85x the dds' time at density 0.5 / 1.0; this copy costs a pass over the blocks.
//
// One warp per block: 16-byte coalesced loads of the source rows, the block through shared memory (rows of 17
// words, so that a column's 8 values read by the lanes of a quarter warp fall in different banks), 16-byte
// coalesced stores of the transposed rows. Plain CUDA: runs on every arch the extension builds for.
//
// transpose_matrix: x^T (K, row) from x (M, K) by the same 32 x 32 warp tiles, for the block-32 Hopper sdd's mode 3
// (kernel_sm90_sdd_b32.cuh, kColumnsT), whose x tiles then load in 128-byte rows. PyTorch's transposing copy
// (x.t().contiguous(), copy_ into a transposed view) moved 0.47 TB/s on an H100 (0.28 ms for 8192 x 4096 bf16;
// benchmarks/results/ab_sdd_b32_xt_*.txt), a quarter of what the pass needs to pay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pbsng {
namespace transpose_blocks {

constexpr int kBlock = 32;
constexpr int kWarps = 8;        // blocks per CTA
constexpr int kPitchWords = 17;  // a staged row: 16 words of data + 1 of padding

// One warp: the 32 x 32 tile whose row r (32 values, 16-byte aligned) starts at src + r x src_pitch, rows r >=
// rows_valid read as zeros, into rows c at dst + c x dst_pitch, each written for its values r < rows_stored (a
// multiple of 8). kContiguous: a whole 32 x 32 block, both pitches 32 (its addresses need no row arithmetic).
template <bool kContiguous>
__device__ __forceinline__ void transpose_tile(const uint16_t* __restrict__ src, int64_t src_pitch, int rows_valid,
                                               uint16_t* __restrict__ dst, int64_t dst_pitch, int rows_stored,
                                               uint32_t* t, int lane) {
  // A tile is 128 chunks of 8 values (16 bytes), 4 per row; lane takes chunks lane + 32 q.
  uint4 v[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int chunk = lane + 32 * q, row = chunk / 4;
    if constexpr (kContiguous) {
      v[q] = __ldg(reinterpret_cast<const uint4*>(src) + chunk);
    } else {
      v[q] = row < rows_valid ? __ldg(reinterpret_cast<const uint4*>(src + row * src_pitch) + chunk % 4)
                              : make_uint4(0, 0, 0, 0);
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int chunk = lane + 32 * q, row = chunk / 4, word = (chunk % 4) * 4;
    t[row * kPitchWords + word + 0] = v[q].x;
    t[row * kPitchWords + word + 1] = v[q].y;
    t[row * kPitchWords + word + 2] = v[q].z;
    t[row * kPitchWords + word + 3] = v[q].w;
  }
  __syncwarp();
  const uint16_t* t16 = reinterpret_cast<const uint16_t*>(t);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // Output row c (source column c), values of source rows r0 .. r0 + 7.
    const int chunk = lane + 32 * q, c = chunk / 4, r0 = (chunk % 4) * 8;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = t16[(r0 + 2 * j) * 2 * kPitchWords + c];
      const uint32_t hi = t16[(r0 + 2 * j + 1) * 2 * kPitchWords + c];
      w[j] = lo | (hi << 16);
    }
    if constexpr (kContiguous) {
      reinterpret_cast<uint4*>(dst)[chunk] = make_uint4(w[0], w[1], w[2], w[3]);
    } else if (r0 < rows_stored) {
      reinterpret_cast<uint4*>(dst + c * dst_pitch)[chunk % 4] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

template <class Tag>  // Tag: the element type (only its size is used), so that each dtype's TU has its own symbol
__global__ void __launch_bounds__(32 * kWarps) transpose_kernel(const uint16_t* __restrict__ data,
                                                                const int32_t* __restrict__ perm, int64_t nnz,
                                                                uint16_t* __restrict__ out) {
  __shared__ uint32_t tile[kWarps][kBlock * kPitchWords];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t(blockIdx.x) * kWarps + warp;
  if (i >= nnz) return;  // whole warps: no block-wide barrier below
  transpose_tile<true>(data + int64_t(__ldg(perm + i)) * kBlock * kBlock, kBlock, kBlock, out + i * kBlock * kBlock,
                       kBlock, kBlock, tile[warp], lane);
}

// A CTA: 256 rows of x (its warps' 32 each) x 32 columns, so that it writes 512 contiguous bytes of each x^T row.
template <class Tag>
__global__ void __launch_bounds__(32 * kWarps) transpose_matrix_kernel(const uint16_t* __restrict__ x, int64_t m,
                                                                       int64_t k, uint16_t* __restrict__ x_t,
                                                                       int64_t row) {
  __shared__ uint32_t tile[kWarps][kBlock * kPitchWords];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = (int64_t(blockIdx.x) * kWarps + warp) * kBlock, c0 = int64_t(blockIdx.y) * kBlock;
  if (r0 >= m) return;  // whole warps
  const int rows_valid = int(m - r0 < kBlock ? m - r0 : kBlock);
  transpose_tile<false>(x + r0 * k + c0, k, rows_valid, x_t + c0 * row + r0, row, (rows_valid + 7) / 8 * 8,
                        tile[warp], lane);
}

// data [nnz_data, 32, 32], perm [nnz] (indices into data), out [nnz, 32, 32]; 16-byte aligned pointers.
template <class Tag>
cudaError_t launch(const void* data, const int32_t* perm, int64_t nnz, void* out, cudaStream_t stream) {
  if (nnz == 0) return cudaSuccess;
  const int64_t ctas = (nnz + kWarps - 1) / kWarps;
  if (ctas > INT32_MAX) return cudaErrorInvalidValue;
  transpose_kernel<Tag><<<unsigned(ctas), 32 * kWarps, 0, stream>>>(static_cast<const uint16_t*>(data), perm, nnz,
                                                                    static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

// x (m, k) -> x_t (k, row): row >= m, k and row multiples of 8 (k of 32), 16-byte aligned pointers; x_t's values
// past m up to the next multiple of 8 are written as zeros, the rest of each row is left as it is.
template <class Tag>
cudaError_t launch_matrix(const void* x, int64_t m, int64_t k, void* x_t, int64_t row, cudaStream_t stream) {
  if (m == 0 || k == 0) return cudaSuccess;
  if (x == nullptr || x_t == nullptr || k % kBlock != 0 || row % 8 != 0 || row < m) return cudaErrorInvalidValue;
  const int64_t row_ctas = (m + kWarps * kBlock - 1) / (kWarps * kBlock), col_ctas = k / kBlock;
  if (row_ctas > INT32_MAX || col_ctas > 65535) return cudaErrorInvalidValue;
  transpose_matrix_kernel<Tag><<<dim3(unsigned(row_ctas), unsigned(col_ctas)), 32 * kWarps, 0, stream>>>(
      static_cast<const uint16_t*>(x), m, k, static_cast<uint16_t*>(x_t), row);
  return cudaGetLastError();
}

}  // namespace transpose_blocks
}  // namespace pbsng
