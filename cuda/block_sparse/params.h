// Plain argument structs for the block-sparse product launchers. No torch, no CuTe: bindings.cpp fills
// these after checking every tensor, and the kernels never see an at::Tensor.
//
// W is the (N, K) block-sparse weight with square (B, B) blocks; `data` holds its nnz kept blocks
// [nnz, B, B] in row-major block order; the index arrays follow pytorch_block_sparse_ng/layout.py.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

namespace pbsng {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// y (M, N) = x (M, K) W^T + bias.  One CTA per (block row, tile of M rows, split of the row's blocks).
// With splits > 1 (few rows of M: too few CTAs otherwise) each CTA stores its fp32 partial sums into its slice of
// `parts`, and the last of a tile's splits to finish (split_counters) adds them, adds the bias and stores y.
struct DsdParams {
  const void* x;            // (M, K) row-major
  const void* data;         // [nnz, B, B]
  const void* bias;         // (N,) or nullptr
  void* y;                  // (M, N) row-major
  float* parts;             // [splits, M, N] fp32, any contents (splits > 1)
  const int32_t* row_offsets;  // [R + 1]
  const int32_t* col_indices;  // [nnz]
  const int32_t* row_order;    // [R] a permutation of the block rows: the Hopper kernel pairs 2i and 2i + 1
  int* tile_counter;           // Hopper kernel: one zeroed int32 (dynamic tile scheduling) or nullptr
  int64_t m;
  int64_t nnz;
  int n_block_rows;         // R = N / B
  int n_block_cols;         // C = K / B
  int block;                // B
  int splits;               // CTAs sharing one block row's blocks
  int sms;                  // multiprocessors of the device (the Hopper kernels' persistent grid)
  int stages;               // Hopper kernel: pipeline stages, 3 or 4
  int tile_rows = 128;      // SM80 kernel: rows of M per CTA, 64 or 128
  int few_rows_split = 0;   // Hopper kernel: 0, 256-token tiles; 1, 2, 4 or 8, 128-token tiles whose reduction is
                            // split over that many CTAs of a cluster (few rows of M)
  int b32_columns = 2;      // Hopper kernel for blocks of 32: block columns per pipeline stage, 1 or 2
  int b32_pair_boxes = 0;   // Hopper kernel for blocks of 32: sm90b32::PairBoxes bits (two blocks per TMA box)
  int* split_counters = nullptr;  // SM80 kernel, splits > 1: R x ceil(M / tile_rows) int32, zero at the launch,
                                  // left zeroed
  bool programmatic = false;  // launched with programmatic dependent launch (grid_dependency.cuh; sm_90a code only)
};

// dx (M, K) = dy (M, N) W, through the column-major index. One CTA per (block column, tile of M rows).
struct DdsParams {
  const void* dy;           // (M, N)
  const void* data;         // [nnz, B, B]
  void* dx;                 // (M, K)
  const int32_t* col_offsets_t;  // [C + 1]
  const int32_t* row_indices_t;  // [nnz]
  const int32_t* perm_t;         // [nnz]
  const int32_t* col_order;      // [C] a permutation of the block columns: the Hopper kernel pairs 2i and 2i + 1
  int* tile_counter;             // Hopper kernel: one zeroed int32 (dynamic tile scheduling) or nullptr
  int64_t m;
  int64_t nnz;
  int n_block_rows;
  int n_block_cols;
  int block;
  int sms;                  // multiprocessors of the device (the Hopper kernels' persistent grid)
  int stages;               // Hopper kernel: pipeline stages, 3 or 4
  int few_rows_split = 0;   // Hopper kernel: as DsdParams::few_rows_split
  int b32_columns = 2;      // Hopper kernel for blocks of 32: as DsdParams::b32_columns
  int b32_pair_boxes = 0;   // Hopper kernel for blocks of 32: as DsdParams::b32_pair_boxes
  // Hopper kernel for blocks of 32: a workspace [nnz, 32, 32] for W's blocks transposed (kernel_transpose_blocks.cuh),
  // on which the dds runs as the dsd of dy with W^T; nullptr: the dds reads W's blocks (MN-major W_b^T tiles).
  void* data_t = nullptr;
  bool programmatic = false;  // as DsdParams::programmatic
};

// dW_b [nnz, B, B] = dy^T x on the kept blocks, reduced over M. One CTA per (kept block, split of M).
// With splits > 1 the partial sums are added atomically into `out_f32` (zeroed by the caller), or, by the
// Hopper sdd with blocks of 128, summed in the kernel (see tail_ws); else written to `out` in the input dtype.
// The Hopper sdd also sums dy over M (the bias gradient) when given `bias_grad` / `bias_grad_f32` (same rule);
// the SM80 one ignores them.
struct SddParams {
  const void* dy;           // (M, N)
  const void* x;            // (M, K)
  void* out;                // [nnz, B, B] in the input dtype (splits == 1, or summed in the kernel)
  float* out_f32;           // [nnz, B, B] fp32, zeroed (splits > 1 summed atomically), or nullptr
  void* bias_grad;          // (N,) in the input dtype (as out), or nullptr
  float* bias_grad_f32;     // (N,) fp32, zeroed (as out_f32), or nullptr
  const int32_t* row_offsets;  // [R + 1]
  const int32_t* row_indices;  // [nnz]
  const int32_t* col_indices;  // [nnz]
  int64_t m;
  int64_t nnz;
  int n_block_rows;
  int n_block_cols;
  int block;
  int splits;               // number of CTAs that share one block's reduction over M
  // Hopper sdd, splits == 1: the tail split (kernel_sm90_sdd.cuh). sms: CTAs per wave; tail_ws: fp32 workspace of
  // sdd_sm90_tail_floats(sms) floats; tail_counters: sdd_sm90_tail_counters(sms) ints, zero
  // at the launch and left zeroed by the kernel. nullptr: off.
  // Hopper sdd, blocks of 128, splits > 1 and out_f32 == nullptr: the pieces are summed in the kernel, tail_ws
  // holds sdd_sm90_piece_floats(items x splits) floats and tail_counters 2 x items ints (items:
  // sdd_sm90_split_items); out and bias_grad in the input dtype.
  int sms = 0;
  // Hopper sdd, blocks of 128, splits == 1, no tail split: one CTA per block, loaded by cp.async
  // (kernel_sm90_sdd_cpasync.cuh); out and bias_grad in the input dtype; with bias_grad, tail_ws holds nnz x 128
  // floats (the parts of the rows' sums) and tail_counters n_block_rows ints (zero at the launch, left zeroed).
  bool one_block_ctas = false;
  float* tail_ws = nullptr;
  int* tail_counters = nullptr;
  // Hopper sdd, blocks of 32 (kernel_sm90_sdd_b32.cuh), splits == 1: the tile's mode (sm90sddb32::Mode: 0 row pairs
  // of row_order x single columns, 1 row pairs x column pairs, 2 adjacent row quads x column pairs, 3 mode 0 on x^T).
  const int32_t* row_order = nullptr;
  int b32_mode = 1;
  // Mode 3 (kColumnsT): a workspace for x^T (K, M) with rows of x_t_row >= M elements (a multiple of 8: 16-byte TMA
  // strides), which the launcher fills (kernel_transpose_blocks.cuh) before the sdd.
  void* x_t = nullptr;
  bool programmatic = false;  // as DsdParams::programmatic
  int64_t x_t_row = 0;
};

// Launchers: one translation unit per product and dtype (dsd_f16.cu, dsd_bf16.cu, ...) specializes each.
// They return the launch's cudaError_t and never synchronize.
template <DType D> cudaError_t launch_dsd_sm80(const DsdParams& p, cudaStream_t stream);
template <DType D> cudaError_t launch_dds_sm80(const DdsParams& p, cudaStream_t stream);
template <DType D> cudaError_t launch_sdd_sm80(const SddParams& p, cudaStream_t stream);
// dsd for few rows of M (decode, 1 <= M <= kDecodeMaxRows; kernel_decode.cuh): one kernel that streams W's kept
// blocks, no workspace; `parts`, `splits`, `row_order`, `tile_counter`, `sms` and `stages` are not used.
constexpr int kDecodeMaxRows = 64;
template <DType D> cudaError_t launch_dsd_decode(const DsdParams& p, cudaStream_t stream);
// Hopper (TMA + warp-specialized wgmma, sm_90a) dsd and dds for blocks 64 and 128, nnz >= 1, splits == 1:
// {dsd,dds}_sm90_{f16,bf16}.cu; launch only on sm_90 devices.
template <DType D> cudaError_t launch_dsd_sm90(const DsdParams& p, cudaStream_t stream);
template <DType D> cudaError_t launch_dds_sm90(const DdsParams& p, cudaStream_t stream);
// Hopper sdd for blocks 64 and 128: one CTA per (block row, chunk of sdd_sm90_chunk(B) of its blocks, split); for
// blocks of 32 one CTA per (row pair or quad, chunk of 16 or 8 columns of their union), splits == 1.
template <DType D> cudaError_t launch_sdd_sm90(const SddParams& p, cudaStream_t stream);
// Blocks of 32: the kernel keeps its rows' column -> block maps in its stage memory, so K is capped (in_features
// <= 256 Ki).
constexpr int kSddB32MaxBlockCols = 8192;
// The block-32 dsd / dds plan each tile's stages from bitmaps of the other operand's block columns in shared
// memory, so that operand is capped too (K <= 128 Ki).
constexpr int kB32MaxOtherBlocks = 4096;
inline int sdd_sm90_chunk(int block) { return block == 64 ? 8 : 2; }
// The tail split's workspace: per piece (at most `sms`) and consumer, 128 threads x 132 fp32 values, and one
// counter per tail item (at most `sms`) and consumer.
inline int64_t sdd_sm90_piece_floats(int64_t pieces) { return pieces * 2 * 132 * 128; }
inline int64_t sdd_sm90_tail_floats(int64_t sms) { return sdd_sm90_piece_floats(sms); }
inline int64_t sdd_sm90_tail_counters(int64_t sms) { return sms * 2; }
// A split of M with blocks of 128 sums its pieces like the tail split: at most nnz / 2 + R working CTAs per
// split (a row's chunks of 2 blocks, or its bias CTA), each with `splits` pieces in the workspace.
inline int64_t sdd_sm90_split_items(int64_t nnz, int64_t n_block_rows) { return nnz / 2 + n_block_rows + 1; }

// Number of k-tiles along M of one sdd block, for choosing `splits` (BK depends on the block size).
int sdd_k_tile_rows(int block);

// cudaSuccess when this build holds a kernel image that runs on the current device.
cudaError_t kernel_image_status();

inline bool block_size_supported(int block) { return block == 32 || block == 64 || block == 128; }

}  // namespace pbsng
