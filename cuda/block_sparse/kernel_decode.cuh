// dsd for few rows of M (decode): y (M, N) = x (M, K) W^T + bias for M <= kDecodeMaxRows, on SM80 tensor
// cores (mma.sync m16n8k16, Ampere and Hopper) with both operands loaded from global memory straight into
// registers.
//
// With a handful of tokens the product is a read of W's kept blocks: the kernel must stream them at the
// memory's speed, and the tiled kernels cannot (a 128-row tile per CTA, one block row per CTA, so few CTAs
// that a split of the row's blocks across CTAs, an fp32 workspace, a memset and two more kernels made up for).
// Here each CTA takes a slice of 16 x MT features of one block row (N / (16 MT) CTAs) and its warps take every
// WARPS-th of the row's blocks, two blocks at a time at small tiles so that each warp has 2 x 16 x B x 2 bytes
// of W in flight; the warps add their fp32 sums through shared memory, then the bias, and round once: one
// kernel, no workspace, deterministic. The tiles per M are chosen in launch_for_block.
//
// MMA (SM80_16x8x16 TN): A = 16 W rows (features) x 16 k, B = x^T (16 k x 8 tokens), D = y^T (16 features x 8
// tokens). Inside each 32-wide chunk of k the order of k is permuted, the same way for A and B (which leaves the
// sum unchanged), so that each lane's operands are 16 contiguous bytes: lane (g = lane / 4, c = lane % 4) loads
// k 8c..8c+7 of W rows g and g + 8 and of token g's x row; words 0, 1 are its first MMA's k slots (2c, 2c+1) and
// (2c+8, 2c+9), words 2, 3 its second MMA's. A warp's loads of one block slice cover 16 x MT whole rows of the
// block, i.e. 16 x MT x B x 2 contiguous bytes.
//
// Constraints as kernel_sm80.cuh (16-byte aligned pointers, K and N multiples of the block), and 1 <= M <= 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/arch/mma_sm80.hpp>

#include "block_sparse/grid_dependency.cuh"
#include "block_sparse/params.h"

namespace pbsng {
namespace decode {

template <DType D> struct MmaFor;
template <> struct MmaFor<DType::kFloat16> { using type = cute::SM80_16x8x16_F32F16F16F32_TN; using T = __half; };
template <> struct MmaFor<DType::kBFloat16> {
  using type = cute::SM80_16x8x16_F32BF16BF16F32_TN;
  using T = __nv_bfloat16;
};

__device__ __forceinline__ uint4 load16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// MT: 16-row tiles of W per warp (a CTA's slice is 16 x MT features); NT: 8-token tiles (M <= 8 x NT); WARPS
// per CTA, all on the slice, each taking every WARPS-th of the row's blocks. Every x tile a warp loads feeds
// 16 x MT features, so x's bytes from L2 are M / (16 MT) of W's.
template <DType D, int B, int MT, int NT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) dsd_decode_kernel(DsdParams p) {
  using Mma = typename MmaFor<D>::type;
  using T = typename MmaFor<D>::T;
  constexpr int kChunks = B / 32;           // 32-wide chunks of k per block
  constexpr int kRows = 16 * MT;            // features per slice
  constexpr int kSlices = B / kRows;        // slices per block row
  constexpr int kBlocksPerStep = MT * NT <= 4 ? 2 : 1;  // blocks whose loads a warp issues before it multiplies
  constexpr int kSlots = 4;                 // partial sums in shared memory: the warps add theirs in turn
  static_assert(kSlices >= 1 && WARPS % kSlots == 0, "a slice cannot be wider than the block");
  __shared__ float partial[kSlots][NT * 8][kRows];  // [slot][token][feature of the slice]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int r = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  const int row_begin = __ldg(p.row_offsets + r), row_end = __ldg(p.row_offsets + r + 1);
  const T* data = static_cast<const T*>(p.data);
  const T* x = static_cast<const T*>(p.x);
  const int64_t K = int64_t(p.n_block_cols) * B, N = int64_t(p.n_block_rows) * B;
  const int m = int(p.m);
  // This lane's W row g of the slice at k offset 8c (rows g + 8, g + 16, ... are 8 B elements apart).
  const int64_t w_lane = int64_t(slice * kRows + g) * B + 8 * c;

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t][0] = acc[i][t][1] = acc[i][t][2] = acc[i][t][3] = 0.f;

  for (int j0 = row_begin + warp; j0 < row_end; j0 += kBlocksPerStep * WARPS) {
    // Every load of the step first (W from DRAM, x mostly from L2), then the MMAs: loads in flight hide latency.
    uint4 wv[kBlocksPerStep][kChunks][2 * MT];  // rows g, g + 8, g + 16, ... of the slice
    uint4 xv[kBlocksPerStep][kChunks][NT];
#pragma unroll
    for (int s = 0; s < kBlocksPerStep; ++s) {
      const int j = j0 + s * WARPS;
      const bool have = j < row_end;  // warp-uniform
      const T* w = data + int64_t(have ? j : j0) * B * B + w_lane;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
        for (int h = 0; h < 2 * MT; ++h)
          wv[s][ch][h] = have ? load16(w + h * 8 * B + ch * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int s = 0; s < kBlocksPerStep; ++s) {
      const int j = j0 + s * WARPS;
      const bool have = j < row_end;
      const int64_t col = have ? __ldg(p.col_indices + j) : 0;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int token = t * 8 + g;
          xv[s][ch][t] = have && token < m ? load16(x + int64_t(token) * K + col * B + ch * 32 + 8 * c)
                                           : make_uint4(0, 0, 0, 0);
        }
    }
#pragma unroll
    for (int s = 0; s < kBlocksPerStep; ++s)
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch)
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint4 lo = wv[s][ch][2 * i], hi = wv[s][ch][2 * i + 1];
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint4 b = xv[s][ch][t];
            float* d = acc[i][t];
            Mma::fma(d[0], d[1], d[2], d[3], lo.x, hi.x, lo.y, hi.y, b.x, b.y, d[0], d[1], d[2], d[3]);
            Mma::fma(d[0], d[1], d[2], d[3], lo.z, hi.z, lo.w, hi.w, b.z, b.w, d[0], d[1], d[2], d[3]);
          }
        }
  }

  // D fragment: acc[i][t] = (feature 16i + g, tokens 8t + 2c, +1), (feature 16i + g + 8, the same tokens).
  auto visit = [&](auto&& op) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int token = t * 8 + 2 * c, f = 16 * i + g;
        op(token, f, acc[i][t][0]);
        op(token + 1, f, acc[i][t][1]);
        op(token, f + 8, acc[i][t][2]);
        op(token + 1, f + 8, acc[i][t][3]);
      }
  };
  // The last kSlots warps store their sums, the others add theirs in turns of kSlots warps.
  for (int turn = WARPS / kSlots - 1; turn >= 0; --turn) {
    if (warp / kSlots == turn) {
      float (*slot)[kRows] = partial[warp % kSlots];
      if (turn == WARPS / kSlots - 1) visit([&](int token, int f, float v) { slot[token][f] = v; });
      else visit([&](int token, int f, float v) { slot[token][f] += v; });
    }
    __syncthreads();
  }
  const int64_t n0 = int64_t(r) * B + slice * kRows;
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
  for (int i = threadIdx.x; i < NT * 8 * kRows; i += WARPS * 32) {
    const int token = i / kRows, f = i % kRows;
    if (token >= m) break;
    float sum = bias == nullptr ? 0.f : float(bias[n0 + f]);
#pragma unroll
    for (int w = 0; w < kSlots; ++w) sum += partial[w][token][f];
    y[int64_t(token) * N + n0 + f] = T(sum);
  }
}

template <DType D, int B, int MT, int NT, int WARPS>
cudaError_t launch_tiles(const DsdParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.n_block_rows) * (B / (16 * MT)));
  return launch_kernel(dsd_decode_kernel<D, B, MT, NT, WARPS>, grid, WARPS * 32, 0, stream, p.programmatic, 1, p);
}

// Tiles and warps per M, measured on an H100 (benchmarks/results/bench_decode_*.txt, 4096 x 4096): 16 x 16-row
// slices gave 1-1.5 TB/s of W from DRAM at M = 24-32 (x's L2 bytes twice W's, 8 warps of 1 block each per SM);
// 32-row slices with 16 warps 1.4-2 TB/s. At M > 32, 16 warps were 10 % faster than 8 with >= 64 blocks per
// row and 10-20 % slower with <= 16 (idle warps, four turns of the sum); blocks of 128 spill with 16 warps.
template <DType D, int B>
cudaError_t launch_for_block(const DsdParams& p, cudaStream_t stream) {
  if (p.m <= 8) return launch_tiles<D, B, 1, 1, 8>(p, stream);
  if (p.m <= 16) return launch_tiles<D, B, 1, 2, 8>(p, stream);
  if (p.m <= 32) return launch_tiles<D, B, 2, 4, 16>(p, stream);
  if constexpr (B < 128) {
    if (p.nnz >= 32 * int64_t(p.n_block_rows)) return launch_tiles<D, B, 2, 8, 16>(p, stream);
  }
  return launch_tiles<D, B, 2, 8, 8>(p, stream);
}

template <DType D>
cudaError_t launch(const DsdParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n_block_rows == 0) return cudaSuccess;
  if (p.m > kDecodeMaxRows) return cudaErrorInvalidValue;
  switch (p.block) {
    case 32: return launch_for_block<D, 32>(p, stream);
    case 64: return launch_for_block<D, 64>(p, stream);
    case 128: return launch_for_block<D, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace decode
}  // namespace pbsng

// The explicit specialization of launch_dsd_decode (params.h) for one dtype.
#define PBSNG_DEFINE_DECODE_LAUNCHER(DTYPE)                                                   \
  namespace pbsng {                                                                          \
  template <>                                                                                \
  cudaError_t launch_dsd_decode<DTYPE>(const DsdParams& p, cudaStream_t stream) {            \
    return decode::launch<DTYPE>(p, stream);                                                 \
  }                                                                                          \
  }
