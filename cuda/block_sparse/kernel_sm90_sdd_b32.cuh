// sdd (dW_b = dy_r^T x_c on the kept blocks, reduced over the M tokens) with blocks of 32 on Hopper: TMA loads
// and stores, an mbarrier pipeline and warp-specialized wgmma (sm_90a), like kernel_sm90_sdd.cuh (whose wgmma
// atoms and consumer mainloop it uses) and with the helpers of kernel_sm90_ws.cuh.
//
// Why its own kernel: tokens are the reduction, so the wgmma M (64) and N must both be features, and a block row
// of 32 fills only half an M. Here a consumer's M is the 64 features of two block rows, its N 8 block columns
// (256 features) of the union of its CTA's rows' lists, K the tokens (64 per stage); a union column that a row
// lacks costs that row's part of the tile (not stored). Four tiles (Mode, below; the host picks by a model of
// waves x stage time, bindings.cpp b32_sdd_mode):
//   kColumns / kColumnPairs: a row pair of row_order (layout.pair_order puts rows that share many columns side by
//     side), both consumers sharing its dy^T tile, each with its own 8 columns: as single columns (x boxes of 32
//     features, 64-byte rows) or column pairs (2c, 2c + 1: boxes of 64 features, 128-byte rows);
//   kQuads: four adjacent rows, consumer h taking rows 4q + 2h and 4q + 2h + 1 (one 64-feature dy^T box), both
//     sharing the x tiles of 4 column pairs of the quad's union;
//   kColumnsT: kColumns' tile with the x tiles read from x^T (K, M), which the launcher writes first into a
//     workspace the binding allocates: a column's box is 32 rows of 128 bytes (64 tokens) instead of 64 rows of 64
//     bytes, and it is wgmma's B K-major.
// The TMA issues a stage's loads row by row, ~1.35 ns per row per SM on an H100 whether the rows carry 64 or 128
// bytes (single columns, and the block-64 sdd), and the four tiles take 1152 / 640 / 384 / 640 rows per stage for
// the same 2 x 64 x 256 x 64 MAC: ~1.45 / ~0.9 / ~0.72 / 1.0-1.15 us per stage measured on full waves, at the cost
// of more absent blocks per tile (at density 0.1 single columns make a wave of CTAs on 8192 x 4096 -> 4096, quads
// three; benchmarks/results/ab_sdd_b32_*.txt) and, for kColumnsT, a pass over x (~49 us at 8192 x 4096; the launcher
// runs it, kernel_transpose_blocks.cuh). The SM80 sdd they replace ran at ~90 TFLOP/s.
//
// One CTA: row group g (blockIdx.x: a pair or a quad) and chunk y (blockIdx.y) of its union's entries (16 columns,
// 8 or 4 column pairs). The chunk is found at the CTA's start: the rows' column -> block maps in the (not yet
// loaded) stage memory, then warp 0 ranks the union by ballots. CTAs past the union exit; with the bias gradient,
// chunk 0 of every group also sums its dy tiles (a 64 x 8 wgmma against a tile of ones, as in kernel_sm90_sdd.cuh),
// even when the group keeps no block. Both operands are MN-major (transposed views of row-major activations).
// Epilogue: the rounded 64 x 256 tile goes by stmatrix into the idle stage buffers, each 32 x 32 block contiguous
// with the 64-byte swizzle, and each kept block leaves as one TMA store. No split of M, no workspace.
//
// Constraints: sm_90a only; fp16 / bf16; blocks of 32; 16-byte aligned activations; row_order pairs the rows
// (kColumns, kColumnPairs); the maps need 4 x rows x n_block_cols bytes of the stage memory (n_block_cols <=
// kSddB32MaxBlockCols, params.h).
#pragma once

#include "block_sparse/kernel_sm90_sdd.cuh"

namespace pbsng {
namespace sm90sddb32 {

// A CTA's tile (see the top): row pairs x single columns, row pairs x column pairs, row quads x column pairs, row
// pairs x single columns of x^T.
enum Mode : int { kColumns = 0, kColumnPairs = 1, kQuads = 2, kColumnsT = 3 };

// A MN-major (dy^T), B K-major (x^T tiles: tokens contiguous).
template <class T> struct GmmaAtomKB;
template <> struct GmmaAtomKB<cute::half_t> {
  using type = cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};
template <> struct GmmaAtomKB<cute::bfloat16_t> {
  using type = cute::SM90_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};

template <class T_, int Mode_>
struct Config {
  using T = T_;
  static constexpr int Block = 32;
  static constexpr int BK = 64;  // tokens per stage
  static constexpr bool kQuads = Mode_ == Mode::kQuads;
  static constexpr bool kTransposedX = Mode_ == Mode::kColumnsT;  // x tiles from x^T
  static constexpr int kRows = kQuads ? 4 : 2;                 // block rows per CTA
  // Block columns per union entry (one x box).
  static constexpr int kEntryCols = Mode_ == Mode::kColumns || kTransposedX ? 1 : 2;
  static constexpr int kChunkCols = kQuads ? 8 : 16;           // block columns per CTA
  static constexpr int kColsPerConsumer = 8;                   // N = 8 x 32
  static constexpr int kChunk = kChunkCols / kEntryCols;       // union entries per CTA
  static constexpr int kAFeatures = kQuads ? 64 : 32;          // features per dy^T box (two boxes per stage)
  static constexpr int kABoxBytes = kAFeatures * BK * int(sizeof(T));
  static constexpr int kBBoxBytes = 32 * kEntryCols * BK * int(sizeof(T));  // an entry's features x 64 tokens
  static constexpr int kStages = kQuads ? 4 : 3;
  static constexpr int kThreads = 384;
  // dy^T (64 features x BK tokens; 64-byte swizzle for two rows' boxes, 128-byte for one box of a row pair) and x
  // (256 features x BK tokens; 64- or 128-byte swizzle: an entry's row), MN-major; the K atoms first (Step<_2,
  // _1>), so that each box is contiguous (BK rows of 64 / 128 bytes).
  using SmemLayoutA = decltype(cute::tile_to_shape(cute::conditional_t<kQuads, cute::GMMA::Layout_MN_SW128_Atom<T>,
                                                                       cute::GMMA::Layout_MN_SW64_Atom<T>>{},
                                                   cute::make_shape(cute::Int<64>{}, cute::Int<BK>{}),
                                                   cute::Step<cute::_2, cute::_1>{}));
  using SmemLayoutBMN = decltype(cute::tile_to_shape(
      cute::conditional_t<kEntryCols == 2, cute::GMMA::Layout_MN_SW128_Atom<T>, cute::GMMA::Layout_MN_SW64_Atom<T>>{},
      cute::make_shape(cute::Int<256>{}, cute::Int<BK>{}), cute::Step<cute::_2, cute::_1>{}));
  // kTransposedX: K-major 8 x 64 atoms stacked along the features, so a column's 32 rows are one contiguous box.
  using SmemLayoutBK = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                    cute::make_shape(cute::Int<256>{}, cute::Int<BK>{})));
  using SmemLayoutB = cute::conditional_t<kTransposedX, SmemLayoutBK, SmemLayoutBMN>;
  using TiledMma = decltype(cute::make_tiled_mma(
      cute::conditional_t<kTransposedX, typename GmmaAtomKB<T>::type, typename sm90sdd::GmmaAtom<T>::type>{}));
  using SumMma = decltype(cute::make_tiled_mma(typename sm90sdd::GmmaSumAtom<T>::type{}));
  using SmemLayoutOnes = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_INTER_Atom<T>{},
                                                      cute::make_shape(cute::Int<8>{}, cute::Int<BK>{})));
  // A consumer's rounded 64 x 256 results, row-major in 8 x 32 atoms (64-byte swizzle) taken rows first: block
  // (half r, column j), rows 32r.. and columns 32j.., is the contiguous 2 KB at element 1024 (r + 2j), one TMA box.
  using SmemLayoutOut = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<T>{},
                                                     cute::make_shape(cute::Int<64>{}, cute::Int<256>{})));
  using TiledStoreOut = decltype(cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U32x4_STSM_N, T>{},
                                                         TiledMma{}));

  struct alignas(1024) Stage {
    T a[kQuads ? 2 : 1][64 * BK];  // per consumer (kQuads) or shared
    T b[kQuads ? 1 : 2][256 * BK];  // shared (kQuads) or per consumer
  };
  struct Chunk {
    int key[kChunk];                 // the chunk's union entries: columns key x kEntryCols ..
    int block[kRows][kChunkCols];    // block of the CTA's row r in column j of the chunk (into data), or -1
    int rows[kRows];                 // the CTA's rows (-1: none, past the pattern or a row left alone)
    int count;                       // entries in the chunk (0: the bias sum only)
  };
  struct SharedStorage {
    Stage stages[kStages];
    alignas(128) T ones[8 * BK];  // B of the bias-gradient sum
    uint64_t full[kStages];
    uint64_t empty[kStages];
    Chunk chunk;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(2 * 64 * 256 * int(sizeof(T)) <= kStages * int(sizeof(Stage)), "both output tiles fit");
  // The column -> block maps of the CTA's rows (int32) live in the stage memory before the first load.
  static constexpr int kMaxBlockCols = kStages * int(sizeof(Stage)) / (kRows * int(sizeof(int))) - 2;
  static_assert(kMaxBlockCols >= kSddB32MaxBlockCols, "the host's limit (params.h) fits");
};

struct KernelParams {
  CUtensorMap dy_map;   // (M, N), box 64 tokens x kAFeatures, 64- / 128-byte swizzle
  CUtensorMap x_map;    // (M, K), box 64 tokens x an entry's features (32 / 64), 64- / 128-byte swizzle; kTransposedX:
                        // x^T (K, M), box 32 features x 64 tokens, 128-byte swizzle
  CUtensorMap out_map;  // [nnz, 32, 32] as (nnz * 32 rows, 32), box 32 x 32
  const int32_t* row_offsets;
  const int32_t* col_indices;
  const int32_t* row_order;  // pairs: entries 2p, 2p + 1 (not kQuads)
  void* bias_grad;           // (N,) in T, or nullptr
  int64_t m;
  int n_block_rows;
  int n_block_cols;
};

// Consumer warpgroup h: the mainloop over the token steps, then the stores. kBlocks: the chunk has columns for
// this consumer; kSum: it also sums the dy^T tiles (the bias gradient).
template <class Cfg, bool kBlocks, bool kSum>
__device__ __forceinline__ void consume(const KernelParams& p, typename Cfg::SharedStorage& sh, int h, int consumers,
                                        int n_steps) {
  using namespace cute;
  using T = typename Cfg::T;
  const int tid = threadIdx.x % 128;
  typename Cfg::TiledMma mma;
  Tensor acc = partition_fragment_C(mma, Shape<_64, _256>{});
  typename Cfg::SumMma sum_mma;
  auto thr_sum = sum_mma.get_thread_slice(tid);
  Tensor bias_acc = partition_fragment_C(sum_mma, Shape<_64, _8>{});
  sm90sdd::mainloop<Cfg, kBlocks, kSum>(sh, n_steps, Cfg::kQuads ? h : 0, Cfg::kQuads ? 0 : h, acc, bias_acc);

  if constexpr (kSum) {  // every column of bias_acc holds the sum: column 0 is stored
    Tensor bias_coord = thr_sum.partition_C(make_identity_tensor(Shape<_64, _8>{}));
    CUTE_UNROLL
    for (int i = 0; i < size(bias_acc); ++i) {
      const int f = get<0>(bias_coord(i));
      const int row = sh.chunk.rows[(Cfg::kQuads ? 2 * h : 0) + f / 32];
      if (get<1>(bias_coord(i)) == 0 && row >= 0) static_cast<T*>(p.bias_grad)[row * 32 + f % 32] = T(bias_acc(i));
    }
  }
  if constexpr (!kBlocks) return;

  cutlass::arch::NamedBarrier::sync(128 * consumers, 1);  // every wgmma of the CTA has read its stages
  T* staged = reinterpret_cast<T*>(&sh.stages[0]) + h * 64 * 256;
  sm90sdd::stage_rounded<Cfg>(acc, staged);
  cutlass::arch::NamedBarrier::sync(128, 2 + h);
  if (tid < 2 * Cfg::kColsPerConsumer) {  // one thread per block of the tile: (half r, column j)
    const int r = tid % 2, j = tid / 2, column = Cfg::kQuads ? j : Cfg::kColsPerConsumer * h + j;
    const int row = Cfg::kQuads ? 2 * h + r : r;
    const int block = column / Cfg::kEntryCols < sh.chunk.count ? sh.chunk.block[row][column] : -1;
    if (block >= 0) {
      sm90ws::tma_store_2d(&p.out_map, staged + (r + 2 * j) * 32 * 32, 0, block * 32);
      sm90ws::tma_store_wait_read();  // shared memory must outlive the store's read
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) sdd_b32_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int S = Cfg::kStages, BK = Cfg::BK, C = Cfg::kChunk, E = Cfg::kEntryCols, R = Cfg::kRows;
  extern __shared__ char smem_raw[];
  auto& sh = sm90ws::aligned_shared_storage<typename Cfg::SharedStorage>(smem_raw);

  const int group = int(blockIdx.x), slot = int(blockIdx.y);
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  int rows[R], begin[R], blocks[R], total = 0;
  CUTE_UNROLL
  for (int r = 0; r < R; ++r) {
    const int i = R * group + r;  // kQuads: the rows themselves; else entries of row_order
    rows[r] = i < p.n_block_rows ? (Cfg::kQuads ? i : __ldg(p.row_order + i)) : -1;
    begin[r] = rows[r] >= 0 ? __ldg(p.row_offsets + rows[r]) : 0;
    blocks[r] = rows[r] >= 0 ? __ldg(p.row_offsets + rows[r] + 1) - begin[r] : 0;
    total += blocks[r];
  }
  const bool sums_bias = p.bias_grad != nullptr && slot == 0;
  if (C * slot >= total && !sums_bias) return;  // past any union of the lists: uniform

  // The chunk: column -> block maps of both rows in the stage memory (padded to whole entries), then warp 0 ranks
  // the union's entries.
  const int n_keys = (p.n_block_cols + E - 1) / E, n_cols = n_keys * E;
  int* maps = reinterpret_cast<int*>(&sh.stages[0]);
  for (int i = int(threadIdx.x); i < R * n_cols; i += Cfg::kThreads) maps[i] = -1;
  __syncthreads();
  CUTE_UNROLL
  for (int r = 0; r < R; ++r) {
    for (int i = int(threadIdx.x); i < blocks[r]; i += Cfg::kThreads) {
      maps[r * n_cols + __ldg(p.col_indices + begin[r] + i)] = begin[r] + i;
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x), first = C * slot;
    int rank = 0;  // union entries below q0
    for (int q0 = 0; q0 < n_keys && rank < first + C; q0 += 32) {
      const int q = q0 + lane;
      int b[R][E];  // [row][column of the entry]
      int any = -1;
      CUTE_UNROLL
      for (int r = 0; r < R; ++r) {
        CUTE_UNROLL
        for (int i = 0; i < E; ++i) {
          b[r][i] = q < n_keys ? maps[r * n_cols + E * q + i] : -1;
          any = max(any, b[r][i]);
        }
      }
      const unsigned mask = __ballot_sync(0xffffffffu, any >= 0);
      const int e = rank + __popc(mask & ((1u << lane) - 1u)) - first;
      if (any >= 0 && e >= 0 && e < C) {
        sh.chunk.key[e] = q;
        CUTE_UNROLL
        for (int r = 0; r < R; ++r) {
          CUTE_UNROLL
          for (int i = 0; i < E; ++i) sh.chunk.block[r][E * e + i] = b[r][i];
        }
      }
      rank += __popc(mask);
    }
    if (lane == 0) {
      sh.chunk.count = max(0, min(C, rank - first));
      CUTE_UNROLL
      for (int r = 0; r < R; ++r) sh.chunk.rows[r] = rows[r];
    }
  }
  cutlass::arch::fence_view_async_shared();  // the maps' generic-proxy accesses before the TMA loads overwrite them
  __syncthreads();
  const int count = sh.chunk.count;
  if (count == 0 && !sums_bias) return;  // uniform
  // kQuads: a consumer per row pair (the second only if the CTA has a third row); else a consumer per 8 columns.
  const bool second_pair = R > 2 && rows[R - 2] >= 0;  // kQuads: rows 4q + 2, 4q + 3 exist
  const int consumers = Cfg::kQuads ? (second_pair ? 2 : 1) : (count * E > Cfg::kColsPerConsumer ? 2 : 1);
  const int n_steps = int((p.m + BK - 1) / BK);

  const int warpgroup = int(threadIdx.x) / 128;
  sm90ws::init_pipeline<S>(sh.full, sh.empty, 128 * consumers);
  if (sums_bias) {
    for (int i = int(threadIdx.x); i < 8 * BK; i += Cfg::kThreads) sh.ones[i] = T(1.0f);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by wgmma
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x < 32) {
      // Lane j < C loads union entry j's x tile, lanes C and C + 1 the two halves of the dy^T tile.
      const int lane = int(threadIdx.x);
      bool loads;
      const CUtensorMap* map;
      int feature, offset;  // offset: elements from the stage's start
      if (lane < C) {
        loads = lane < count;
        map = &p.x_map;
        feature = loads ? sh.chunk.key[lane] * 32 * E : 0;
        offset = int(offsetof(typename Cfg::Stage, b)) / int(sizeof(T)) + lane * 32 * E * BK;
      } else {  // kQuads: box r holds rows 4q + 2r, 4q + 2r + 1 (past N: zeros); else row r of the pair
        const int r = lane - C;
        loads = r < 2 && (Cfg::kQuads ? rows[2 * r] >= 0 : rows[r] >= 0);
        map = &p.dy_map;
        feature = loads ? (Cfg::kQuads ? rows[2 * r] : rows[r]) * 32 : 0;
        offset = r * Cfg::kAFeatures * BK;
      }
      const int a_boxes = Cfg::kQuads ? (second_pair ? 2 : 1) : (rows[1] >= 0 ? 2 : 1);
      const int bytes = count * Cfg::kBBoxBytes + a_boxes * Cfg::kABoxBytes;
      const bool tokens_inner = Cfg::kTransposedX && lane < C;  // x^T: tokens are the map's inner coordinate
      for (int it = 0; it < n_steps; ++it) {
        const int s = it % S;
        if (lane == 0) {
          Barrier::wait(&sh.empty[s], ((it / S) & 1) ^ 1);
          TxBarrier::arrive_and_expect_tx(&sh.full[s], bytes);
        }
        __syncwarp();
        if (loads) {
          sm90ws::tma_load_2d(reinterpret_cast<T*>(&sh.stages[s]) + offset, map, &sh.full[s],
                              tokens_inner ? it * BK : feature, tokens_inner ? feature : it * BK);
        }
      }
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int h = __reduce_max_sync(0xffffffffu, warpgroup - 1);  // uniform register: the B descriptors too
  if (h >= consumers) return;
  // Each combination its own straight-line mainloop: a wgmma under a runtime condition inside the loop makes
  // ptxas serialize the wgmmas (C7520). The sum: consumer 0 (its dy^T tile is the CTA's), both with kQuads.
  if (count == 0) {
    consume<Cfg, false, true>(p, sh, h, consumers, n_steps);
  } else if (sums_bias && (Cfg::kQuads || h == 0)) {
    consume<Cfg, true, true>(p, sh, h, consumers, n_steps);
  } else {
    consume<Cfg, true, false>(p, sh, h, consumers, n_steps);
  }
#else
  __trap();
#endif
}

// dy (M, R * 32), x (M, C * 32), out [nnz, 32, 32] (nnz >= 1), bias_grad (R * 32,) or nullptr; splits == 1.
template <class Cfg>
cudaError_t launch(const SddParams& sp, cudaStream_t stream) {
  if (sp.nnz < 1 || sp.m < 1 || sp.splits != 1 || (!Cfg::kQuads && sp.row_order == nullptr) || sp.out_f32 != nullptr ||
      sp.n_block_cols > kSddB32MaxBlockCols || (Cfg::kTransposedX && (sp.x_t == nullptr || sp.x_t_row < sp.m))) {
    return cudaErrorInvalidValue;
  }
  const CUtensorMapDataType dtype = std::is_same<typename Cfg::T, cute::half_t>::value
                                        ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  KernelParams p;
  // kQuads: a box of two rows; past N (an odd row count) the TMA fills zeros (never stored).
  cudaError_t err = sm90ws::encode_2d_map(&p.dy_map, dtype, sp.dy, uint64_t(sp.n_block_rows) * 32, uint64_t(sp.m),
                                          Cfg::kAFeatures, Cfg::BK, 2,
                                          Cfg::kQuads ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
  if (err != cudaSuccess) return err;
  // Column pairs: the last of an odd count reads past K, which the TMA fills with zeros (never stored).
  err = Cfg::kTransposedX
            ? sm90ws::encode_2d_map(&p.x_map, dtype, sp.x_t, uint64_t(sp.m), uint64_t(sp.n_block_cols) * 32, Cfg::BK,
                                    32, 2, CU_TENSOR_MAP_SWIZZLE_128B, uint64_t(sp.x_t_row))
            : sm90ws::encode_2d_map(&p.x_map, dtype, sp.x, uint64_t(sp.n_block_cols) * 32, uint64_t(sp.m),
                                    32 * Cfg::kEntryCols, Cfg::BK, 2,
                                    Cfg::kEntryCols == 2 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
  if (err != cudaSuccess) return err;
  err = sm90ws::encode_2d_map(&p.out_map, dtype, sp.out, 32, uint64_t(sp.nnz) * 32, 32, 32, 2,
                              CU_TENSOR_MAP_SWIZZLE_64B);
  if (err != cudaSuccess) return err;
  p.row_offsets = sp.row_offsets;
  p.col_indices = sp.col_indices;
  p.row_order = sp.row_order;
  p.bias_grad = sp.bias_grad;
  p.m = sp.m;
  p.n_block_rows = sp.n_block_rows;
  p.n_block_cols = sp.n_block_cols;
  err = sm80::prepare<sdd_b32_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int n_keys = (sp.n_block_cols + Cfg::kEntryCols - 1) / Cfg::kEntryCols;
  const dim3 grid(unsigned((sp.n_block_rows + Cfg::kRows - 1) / Cfg::kRows),
                  unsigned((n_keys + Cfg::kChunk - 1) / Cfg::kChunk));
  return launch_kernel(sdd_b32_kernel<Cfg>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, sp.programmatic, 1, p);
}

}  // namespace sm90sddb32
}  // namespace pbsng
