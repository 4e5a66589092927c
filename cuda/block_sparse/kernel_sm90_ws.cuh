// dsd (y = x W^T + bias) and dds (dx = dy W) on Hopper: TMA loads and stores, an mbarrier pipeline and
// warp-specialized wgmma (sm_90a) in a persistent kernel, written with CuTe for the shared-memory layouts and
// the wgmma descriptors.
//
// Both products walk a list of kept blocks per output "line" (a block row of W for dsd, a block column for dds,
// through the column-major index) and compute out^T[line features, tokens] = W_line * act^T, so that the
// weight block is the small wgmma operand A (64 x 16 per instruction) and 256 tokens are its N: 64 x 256 x 16
// instructions read ~51 FLOP per shared-memory byte, above what the tensor cores need (an N = 64 tile of
// tokens-as-M would sit at the shared-memory limit).
//
// A tile: 256 tokens x 128 output features. One CTA per SM walks tiles (feature group fastest, so the CTAs in
// flight share activation rows in L2; the last token tiles group-major, longest first: see tile_of) with
// three warpgroups: its first tile is blockIdx.x, the next ones it takes from a global counter near the end
// of its current tile (tiles differ in cost with their lines' block counts; a fixed round-robin left SMs idle
// at the end) or round-robin (a knob), and hands each tile's number to producer warp 1, which posts it with its
// lines to the consumers (two small mbarrier queues in shared memory).
// Two warps of warpgroup 0 walk the block lists and issue the TMA loads (activation and W tiles from one warp
// each) into 3 or 4 stages (4 by default: more bytes in flight measured 3-7 % faster), running ahead into the
// next tile while the consumers finish the current one; the two consumer warpgroups own 64 features each:
//   block 64:  consumer h owns line order[2g + h] (layout.pair_order puts lines that share many blocks side by
//              side, largest union first). The producer merges the two lines' sorted block lists, so an
//              activation tile needed by both lines is loaded once; the consumer whose line lacks that block
//              skips the wgmma.
//   block 128: both consumers share line g (features 0-63 and 64-127 of the block row), each block in two
//              k-steps of 64.
// dds reads W blocks transposed: the same TMA box lands in an MN-major layout (wgmma transposes 16-bit A).
// Epilogue: the fp32 accumulators (+ bias), rounded, are written transposed by stmatrix.trans into a
// 128-byte-swizzled tile of their own (with 4 stages only half of it fits: two parts of 128 tokens, one after
// the other) and stored by TMA, which clips rows past M (TMA loads zero-fill them) and runs while the
// consumers start the next tile.
//
// Measured and dropped: sharing activation tiles across 2 or 4 CTAs with cluster multicast (the union of more
// lines' lists) was 5-50 % slower on an H100 than this kernel without clusters (benchmarks/bench_ops.py);
// multicasting only the tiles both CTAs of a pair need was 16-38 % slower: coupling two CTAs' pipelines cost
// more than the multicast saved (doc/kernels.md, "Selective activation multicast").
//
// Constraints: sm_90a only (other archs compile a trap; the host dispatches by device); fp16 / bf16; blocks
// 64 and 128; activation row stride a multiple of 16 bytes and 16-byte aligned pointers (bindings.cpp checks).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <climits>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "block_sparse/grid_dependency.cuh"
#include "block_sparse/kernel_sm80.cuh"

namespace pbsng {
namespace sm90ws {

template <class T, cute::GMMA::Major MajorA, int N> struct GmmaAtom;
template <cute::GMMA::Major MajorA> struct GmmaAtom<cute::half_t, MajorA, 256> {
  using type = cute::SM90_64x256x16_F32F16F16_SS<MajorA, cute::GMMA::Major::K>;
};
template <cute::GMMA::Major MajorA> struct GmmaAtom<cute::bfloat16_t, MajorA, 256> {
  using type = cute::SM90_64x256x16_F32BF16BF16_SS<MajorA, cute::GMMA::Major::K>;
};
template <cute::GMMA::Major MajorA> struct GmmaAtom<cute::half_t, MajorA, 128> {
  using type = cute::SM90_64x128x16_F32F16F16_SS<MajorA, cute::GMMA::Major::K>;
};
template <cute::GMMA::Major MajorA> struct GmmaAtom<cute::bfloat16_t, MajorA, 128> {
  using type = cute::SM90_64x128x16_F32BF16BF16_SS<MajorA, cute::GMMA::Major::K>;
};

// Tokens_: the tile's tokens (the wgmma N), 256, or 128 for few rows of M. Split_: CTAs of a thread-block
// cluster that share each tile's reduction (the lines' block columns cut into Split_ ranges of keys, one per
// CTA), adding their fp32 partial sums through distributed shared memory: with few rows of M the tiles alone
// cannot fill the GPU (4096 -> 4096 at M = 128: 32 tiles of 128 tokens for 132 SMs).
template <class T_, int Block_, bool TransposeW_, int Stages_, int Tokens_ = 256, int Split_ = 1>
struct Config {
  using T = T_;
  static constexpr int Block = Block_;
  static constexpr bool TransposeW = TransposeW_;  // dds: A = W_b^T
  static_assert(Block == 64 || Block == 128, "blocks of 64 or 128");
  static_assert(Stages_ == 3 || Stages_ == 4, "3 or 4 pipeline stages");
  static_assert(Tokens_ == 256 || Tokens_ == 128, "tiles of 256 or 128 tokens");
  // Splits of 4 (session 42) for narrow products, whose tiles fill too few SMs even with a split of 2. Session 17
  // had measured them slower than 2 in every cell on 4096 x 4096 (M = 65-1024), where a split of 2 already fills
  // the SMs, with a grid of SMs / 4 = 33 clusters: more than fit at a time (see resident_clusters). Splits of 8
  // (session 44, the portable cluster limit) for the narrowest: each CTA stores 16 tokens, one stmatrix row.
  static_assert(Split_ == 1 || (Tokens_ == 128 && (Split_ == 2 || Split_ == 4 || Split_ == 8)),
                "a split of 2, 4 or 8 CTAs, 128 tokens");
  static constexpr int kLinesPerTile = Block == 64 ? 2 : 1;
  static constexpr int kTokens = Tokens_, kFeatures = 128, BK = 64, kStages = Stages_, kSplit = Split_;
  // The output tile is staged in shared memory in parts of kOutTokens tokens: 4 stages of 48 KB leave room for
  // only half of a 256-token tile (32 KB), so each consumer then stores it in two TMA stores. With a split,
  // CTA r of the cluster adds the others' sums for part r only and stores it.
  static constexpr int kOutTokens =
      kSplit > 1 ? kTokens / kSplit : (kStages == 3 || kTokens == 128 ? kTokens : kTokens / 2);
  static constexpr int kOutParts = kTokens / kOutTokens;
  static constexpr int kTileSlots = 4;  // tile numbers the producer may hand out ahead of the consumers
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr cute::GMMA::Major MajorA = TransposeW ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  using SmemLayoutA = decltype(cute::tile_to_shape(
      cute::conditional_t<TransposeW, cute::GMMA::Layout_MN_SW128_Atom<T>, cute::GMMA::Layout_K_SW128_Atom<T>>{},
      cute::make_shape(cute::Int<64>{}, cute::Int<BK>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                   cute::make_shape(cute::Int<kTokens>{}, cute::Int<BK>{})));
  // The output tile of one consumer seen as the accumulator, (64 features, tokens): in memory one 128-byte
  // row of features per token, swizzled as TMA expects for a (tokens, 64 features) box. Its first kOutTokens
  // tokens are what shared memory holds at a time (the swizzle repeats every 8 tokens, so that prefix is the
  // (64, kOutTokens) tile of the same atom).
  using SmemLayoutOut = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                     cute::make_shape(cute::Int<64>{}, cute::Int<kTokens>{})));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T, MajorA, kTokens>::type{}));
  // stmatrix.trans: each thread's token pairs land as 16-byte rows of 8 features (one instruction per
  // 8 values instead of 2-byte stores).
  using TiledStoreOut = decltype(cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U16x8_STSM_T, T>{},
                                                         TiledMma{}));

  static constexpr int kActTileBytes = kTokens * BK * int(sizeof(T));  // 32 KB (16 KB)
  static constexpr int kWTileBytes = 64 * BK * int(sizeof(T));         // 8 KB per consumer

  struct alignas(1024) Stage {
    T act[kTokens * BK];
    T w[2][64 * BK];
  };
  // A split's exchange of partial sums: consumer h's fp32 accumulators, 4 registers of every thread per 16-byte
  // row (thread-minor, so that writes and the other CTAs' reads are conflict-free); red_full[h] completes when
  // the other CTAs have written theirs, red_empty[h] when they have read this one.
  struct SplitExchange {
    float4 red[2][64 * kTokens / 4];
    uint64_t red_full[2];
    uint64_t red_empty[2];
  };
  struct NoSplit {};
  struct SharedStorage {
    Stage stages[kStages];
    alignas(1024) T out[2][kOutTokens * 64];
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int flags[kStages];  // bit h: consumer h has a W tile in this stage; bit 2: last stage of its tile
    uint64_t tile_full[kTileSlots];  // warp 0 -> warp 1: the tile numbers
    uint64_t tile_empty[kTileSlots];
    int tile_ids[kTileSlots];  // >= n_tiles: no more tiles
    uint64_t lines_full[kTileSlots];  // warp 1 -> the consumers: the tile with its lines (post_tile_lines)
    uint64_t lines_empty[kTileSlots];
    int tile_lines[kTileSlots][4];
    cute::conditional_t<(kSplit > 1), SplitExchange, NoSplit> split;  // last: the other layouts stay as they were
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// One product's lines: entries offsets[l] .. offsets[l+1] of keys (the other block coordinate) and slots
// (index of the block in `data`; nullptr: the entry index itself).
struct KernelParams {
  CUtensorMap act_map;   // x (dsd) or dy (dds): (M, K_act), box 256 tokens x 64
  CUtensorMap data_map;  // data viewed as (nnz * B, B), box 64 x 64
  CUtensorMap out_map;   // (M, n_lines * B), box kOutTokens x 64
  const int32_t* offsets;
  const int32_t* keys;
  const int32_t* slots;
  const int32_t* order;  // [n_lines]: the lines in tile order (block 64: pairs, layout.pair_order; block 128:
                         // longest first, layout.length_order, read only where CTAs take more than one tile)
  int* tile_counter;     // [2], zero at the launch: units handed out past the first gridDim.x, CTAs done (the
                         // last CTA zeroes both again); nullptr: every CTA takes units blockIdx.x + k * gridDim.x
  const void* bias;  // (n_lines * B,) or nullptr
  int n_lines;
  int n_groups;       // tiles along the features: ceil(n_lines * B / 128)
  int n_tiles;        // n_groups x n_token_tiles
  int n_token_tiles;  // ceil(M / 256)
  int band;           // the last `band` (>= 1) token tiles are handed out group-major (see tile_of)
  int n_keys;         // block columns of the other operand (the keys' range), cut into the split's ranges
  int64_t m;          // tokens
};

// The tile of work unit u (units are handed out in order). Token tile major (feature group fastest, so that
// the CTAs in flight share activation rows in L2), except the last `band` token tiles: group-major, so the
// longest groups of all of them come first (groups come longest first: layout.pair_order / length_order) and
// the kernel ends on its shortest tiles, which lets the SMs finish together. The host sizes the band so that
// its activations (~16 MB) stay in L2.
__device__ __forceinline__ int tile_of(const KernelParams& p, int unit) {
  const int band_first = (p.n_token_tiles - p.band) * p.n_groups;
  if (unit < band_first) return unit;
  const int v = unit - band_first;
  return (p.n_token_tiles - p.band + v % p.band) * p.n_groups + v / p.band;
}

__device__ __forceinline__ void tma_load_2d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      :
      : "r"(cute::cast_smem_ptr_to_uint(smem_dst)), "l"(reinterpret_cast<uint64_t>(map)),
        "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(c0), "r"(c1)
      : "memory");
#endif
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* smem_src, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :
               : "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(smem_src)), "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Adds a swizzled shared-memory box into a global tensor (fp32 add for a FLOAT32 map), as one bulk group.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, const void* smem_src, int c0, int c1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%2, %3}], [%1];"
               :
               : "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(smem_src)), "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// A 16-bit global load that stays where it is written: the compiler sinks a plain load of the bias to its use in
// the epilogue, where its latency (~0.5 us under the kernel's load, H100 trace) adds to every tile change;
// issued at the tile's start, the mainloop hides it.
__device__ __forceinline__ uint16_t load_u16_pinned(const void* ptr) {
  uint16_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(ptr));
#endif
  return v;
}

// Wait until the committed TMA stores of this thread have read their shared memory.
__device__ __forceinline__ void tma_store_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

// A split's partial sums travel between the CTAs of a cluster (distributed shared memory): cute::set_block_rank
// (mapa) maps an address of this CTA's shared memory to the same place in another CTA of the cluster.
// One arrival on a barrier of another CTA of the cluster, releasing this thread's earlier reads and writes of
// shared memory to the CTAs that wait on it.
__device__ __forceinline__ void arrive_remote(uint32_t remote_barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" : : "r"(remote_barrier) : "memory");
#endif
}

// Waits for the phase of `parity` of a barrier that other CTAs of the cluster arrive on (acquiring what they
// released).
__device__ __forceinline__ void wait_cluster(uint64_t* barrier, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t"
      ".reg .pred done;\n\t"
      "WAIT_CLUSTER:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_CLUSTER;\n\t"
      "}"
      :
      : "r"(cute::cast_smem_ptr_to_uint(barrier)), "r"(parity)
      : "memory");
#endif
}

__device__ __forceinline__ float4 load_remote_float4(uint32_t remote) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

// The dynamic shared memory as `Storage`, aligned to 1024 bytes (128-byte swizzled TMA tiles need it; the
// launch asks for 1024 bytes of slack).
template <class Storage>
__device__ __forceinline__ Storage& aligned_shared_storage(char* smem_raw) {
  return *reinterpret_cast<Storage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
}

// Thread 0 initialises a pipeline's barriers: `full` completes on one producer arrival plus the TMA bytes,
// `empty` on `consumer_threads` arrivals. The caller synchronises the CTA afterwards.
template <int Stages>
__device__ __forceinline__ void init_pipeline(uint64_t* full, uint64_t* empty, int consumer_threads) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Stages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty[s], consumer_threads);
    }
    cutlass::arch::fence_barrier_init();
  }
}

// The lines of tile group g and their count: block 64, entries 2g and 2g + 1 of the order (the last group of
// an odd number of lines has one); block 128, entry g of the order, or line g itself where every CTA (cluster)
// takes one tile: there the order balances nothing, and its load was one of the dependent round trips before a
// few-rows tile's first TMA load (H200, narrow products at 96-256 rows: with the load 0.2-1 % more time for the
// dsd in 9 of 10 cells, 0.1-4.6 % for the dds; benchmarks/results/ab_few_rows_line_order_NVIDIA_H200.txt).
template <class Cfg>
__device__ __forceinline__ int group_lines(const KernelParams& p, int group, int (&line)[2]) {
  if constexpr (Cfg::kLinesPerTile == 1) {
    const bool one_round = p.tile_counter == nullptr && p.n_tiles <= int(gridDim.x) / Cfg::kSplit;
    line[0] = line[1] = one_round ? group : __ldg(p.order + group);
    return 1;
  } else {
    const int first = group * 2;
    const int count = min(2, p.n_lines - first);
    line[0] = __ldg(p.order + first);
    line[1] = count == 2 ? __ldg(p.order + first + 1) : line[0];
    return count;
  }
}

// The producer's next work unit after `unit`: from the counter (dynamic) or round-robin over the CTAs (with a
// split, over the clusters: all CTAs of a cluster take the same units).
template <class Cfg>
__device__ __forceinline__ int next_unit(const KernelParams& p, int unit) {
  return p.tile_counter != nullptr ? int(gridDim.x) + atomicAdd(p.tile_counter, 1)
                                   : unit + int(gridDim.x) / Cfg::kSplit;
}

// Called by one thread of a CTA that takes no more units: the last CTA to get here leaves the counter zeroed for
// the next launch on the stream (the host keeps one counter per stream instead of a memset per call).
__device__ __forceinline__ void count_out(const KernelParams& p) {
  if (p.tile_counter == nullptr) return;
  __threadfence();  // this CTA's claims are done before it counts itself out
  if (atomicAdd(p.tile_counter + 1, 1) == int(gridDim.x) - 1) {
    *reinterpret_cast<volatile int*>(p.tile_counter) = 0;
    *reinterpret_cast<volatile int*>(p.tile_counter + 1) = 0;
  }
}

// With a split, CTA r of the cluster takes the blocks of keys [n_keys r / split, n_keys (r + 1) / split): this
// narrows each of N lines' entries [begin, end) (keys sorted) to them. The warp counts the keys below both
// bounds in one pass over 64 entries per line and step, all lines' loads issued together: one round trip for
// lines of up to 64 blocks, where a lower bound per bound and line, one after the other, took four to six of
// the round trips that precede a few-rows tile's first load.
template <class Cfg, int N>
__device__ __forceinline__ void clip_to_keys(const KernelParams& p, int (&begin)[N], int (&end)[N], int key_lo,
                                             int key_hi, int lane) {
  if constexpr (Cfg::kSplit > 1) {
    int below_lo[N], below_hi[N];
    bool open[N];  // the line may hold more keys below key_hi than counted so far
    for (int i = 0; i < N; ++i) below_lo[i] = below_hi[i] = 0, open[i] = begin[i] < end[i];
    for (int base = 0;; base += 64) {
      int key[N][2];
      CUTE_UNROLL
      for (int i = 0; i < N; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int e = begin[i] + base + 32 * j + lane;
          key[i][j] = open[i] && e < end[i] ? __ldg(p.keys + e) : INT_MAX;
        }
      }
      bool more = false;
      CUTE_UNROLL
      for (int i = 0; i < N; ++i) {
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          below_lo[i] += __popc(__ballot_sync(0xffffffffu, key[i][j] < key_lo));
          below_hi[i] += __popc(__ballot_sync(0xffffffffu, key[i][j] < key_hi));
        }
        // All 64 below key_hi and entries left: the next step goes on.
        open[i] = open[i] && below_hi[i] == base + 64 && begin[i] + base + 64 < end[i];
        more = more || open[i];
      }
      if (!more) break;
    }
    for (int i = 0; i < N; ++i) {
      end[i] = begin[i] + below_hi[i];
      begin[i] += below_lo[i];
    }
  }
}

// A line's block list as seen by the producer warp: lane i holds entries base + i (keys and slots) of the
// current 32-entry window and base + 32 + i of the next, loaded one window ahead, so that walking the list
// costs a register shuffle per entry instead of a dependent global load. (A per-stage trace had the single
// producer thread busy ~0.4-0.7 us per ~0.7 us stage; with the warp the dsd / dds were 1-5 % faster, H100
// A/B: most of that time is the TMA issue itself, benchmarks/results/trace_ws_*.txt.)
struct LineWindow {
  int base, end, key, next_key, slot, next_slot;
};

__device__ __forceinline__ void load_window(const KernelParams& p, int first, int end, int lane, int& key, int& slot) {
  const int e = first + lane;
  key = e < end ? __ldg(p.keys + e) : INT_MAX;
  slot = p.slots == nullptr ? e : (e < end ? __ldg(p.slots + e) : 0);
}

__device__ __forceinline__ LineWindow open_window(const KernelParams& p, int begin, int end, int lane) {
  LineWindow w;
  w.base = begin;
  w.end = end;
  load_window(p, begin, end, lane, w.key, w.slot);
  load_window(p, begin + 32, end, lane, w.next_key, w.next_slot);
  return w;
}

// Entry e (base <= e < base + 32 after the call) of the line: its key (INT_MAX past the end) and slot, the same
// in every lane.
__device__ __forceinline__ int window_key(const KernelParams& p, LineWindow& w, int e, int lane, int& slot) {
  if (e - w.base == 32) {  // uniform: move to the next window and start loading the one after
    w.base += 32;
    w.key = w.next_key;
    w.slot = w.next_slot;
    load_window(p, w.base + 32, w.end, lane, w.next_key, w.next_slot);
  }
  slot = __shfl_sync(0xffffffffu, w.slot, (e - w.base) & 31);
  const int key = __shfl_sync(0xffffffffu, w.key, (e - w.base) & 31);
  return e < w.end ? key : INT_MAX;
}

// The tile as warp 1 posts it to the consumers, who then need no global load of their own before the first stage
// (they read the order and the offsets, two dependent loads of ~0.2-0.5 us under load, at every tile change):
// the tile number, its lines, and their count | 4 if any of them has a block (else the producer makes no stage).
template <class Cfg>
__device__ __forceinline__ void post_tile_lines(typename Cfg::SharedStorage& sh, int n, int tile, const int (&line)[2],
                                                int lines, bool any_block) {
  using Barrier = cutlass::arch::ClusterBarrier;
  const int q = n % Cfg::kTileSlots;
  Barrier::wait(&sh.lines_empty[q], ((n / Cfg::kTileSlots) & 1) ^ 1);
  if (threadIdx.x % 32 == 0) {
    sh.tile_lines[q][0] = tile;
    sh.tile_lines[q][1] = line[0];
    sh.tile_lines[q][2] = line[1];
    sh.tile_lines[q][3] = lines | (int(any_block) << 2);
    Barrier::arrive(&sh.lines_full[q]);
  }
}

// The producer: warps 0 and 1 of warpgroup 0. Both walk the block lists (see LineWindow) and wait for the same
// free slots; lane 0 of warp 0 hands out the tiles, arms each stage's barrier and loads the activation tile,
// lane 0 of warp 1 loads the W tiles (it follows warp 0's tiles through the tile queue, and posts each with its
// lines to the consumers). The TMA issue itself is slow when the memory system is busy (~0.1 us per
// instruction, H100 trace), and issuing from two warps made the block 64 dsd / dds 1-3 % faster (H100 A/B,
// benchmarks/results/ab_split_issue_*.txt).
// One instantiation per warp (kWarp = 0 or 1), so that each warp's loop carries none of the other's code: the
// few-rows tiles (one or two per CTA, latency-bound) 2-6 % faster with a split of 2 and 16-20 % for blocks of 64
// without, the 256-token dsd / dds 0.4-1.5 % (H100 A/Bs, benchmarks/results/ab_*per_warp_producer_*.txt).
template <class Cfg, int kWarp>
__device__ __forceinline__ void produce(const KernelParams& p, typename Cfg::SharedStorage& sh) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int S = Cfg::kStages, B = Cfg::Block;
  constexpr int warp = kWarp;
  const int lane = threadIdx.x % 32;
  const bool leader = lane == 0;
  const bool issue_act = leader && warp == 0;
  const bool issue_w = leader && warp == 1;
  int it = 0;
  // A stage loads an activation tile and `w_tiles` W tiles (none at all: the empty stage of a split's CTA whose
  // keys hold no block).
  auto next_stage = [&](int flags, int w_tiles, bool act_tile = true) -> int {
    const int s = it % S;
    // Warp 1 waits only for the slots it loads into. A stage without W tiles (a split's empty stage) can be
    // consumed before warp 1 gets there, and the slot's empty barrier is then a phase further on than warp 1's
    // parity assumes: it would wait for the slot's next use, which may need its own loads (a hang). Without a
    // split every stage has a W tile.
    if (Cfg::kSplit == 1 || warp == 0 || w_tiles > 0) Barrier::wait(&sh.empty[s], ((it / S) & 1) ^ 1);
    if (issue_act) {
      sh.flags[s] = flags;
      TxBarrier::arrive_and_expect_tx(&sh.full[s], int(act_tile) * Cfg::kActTileBytes + w_tiles * Cfg::kWTileBytes);
    }
    ++it;
    return s;
  };
  int unit = blockIdx.x / Cfg::kSplit, tile = 0, key_lo = 0, key_hi = INT_MAX;
  if constexpr (Cfg::kSplit > 1) {
    const int rank = int(cute::block_rank_in_cluster());
    key_lo = int(int64_t(p.n_keys) * rank / Cfg::kSplit);
    key_hi = int(int64_t(p.n_keys) * (rank + 1) / Cfg::kSplit);
  }
  for (int n = 0;; ++n) {
    // Hand the tile to the consumers (a number >= n_tiles tells them to stop).
    const int q = n % Cfg::kTileSlots;
    if (warp == 0) {
      tile = unit < p.n_tiles ? tile_of(p, unit) : p.n_tiles;
      Barrier::wait(&sh.tile_empty[q], ((n / Cfg::kTileSlots) & 1) ^ 1);
      if (leader) {
        sh.tile_ids[q] = tile;
        Barrier::arrive(&sh.tile_full[q]);
      }
    } else {  // the W-issuing warp follows warp 0's tiles through the queue
      Barrier::wait(&sh.tile_full[q], (n / Cfg::kTileSlots) & 1);
      tile = *reinterpret_cast<volatile int*>(&sh.tile_ids[q]);
      Barrier::arrive(&sh.tile_empty[q]);
    }
    if (tile >= p.n_tiles) {
      if constexpr (warp == 1) post_tile_lines<Cfg>(sh, n, tile, {0, 0}, 0, false);
      break;
    }
    // Lane 0 of warp 0 takes the next unit when at most 2 stages of this tile are left to issue (its other
    // lanes read it at the tile's end): late enough that the counter hands units to the SMs that are about to
    // need them (taken at a tile's start, as before session 11, SMs finished up to a tile apart: H100 trace),
    // early enough that the atomic's latency overlaps the last loads. (4 stages measured the same.)
    int following = -1;
    auto claim = [&](int stages_left) {
      if (issue_act && following < 0 && stages_left <= 2) following = next_unit<Cfg>(p, unit);
    };
    const int group = tile % p.n_groups, token0 = tile / p.n_groups * Cfg::kTokens;
    int line[2];
    const int lines = group_lines<Cfg>(p, group, line);
    if constexpr (B == 64) {
      int e0, e1 = 0;
      LineWindow w0, w1;
      if constexpr (Cfg::kSplit == 1) {
        // Session 14's order of loads, kept for the 256-token dsd / dds: with both lines' offsets read first
        // they measured 0.5-2 % slower for blocks of 64 (H100 A/B, benchmarks/results/ab_few_rows_template_*.txt).
        e0 = __ldg(p.offsets + line[0]);
        w0 = open_window(p, e0, __ldg(p.offsets + line[0] + 1), lane);
        int end1 = 0;
        if (lines == 2) e1 = __ldg(p.offsets + line[1]), end1 = __ldg(p.offsets + line[1] + 1);
        w1 = open_window(p, e1, end1, lane);
        if constexpr (warp == 1) post_tile_lines<Cfg>(sh, n, tile, line, lines, w0.end > e0 || end1 > e1);
      } else {
        int first[2] = {__ldg(p.offsets + line[0]), 0}, last[2] = {__ldg(p.offsets + line[0] + 1), 0};
        if (lines == 2) first[1] = __ldg(p.offsets + line[1]), last[1] = __ldg(p.offsets + line[1] + 1);
        if constexpr (warp == 1) post_tile_lines<Cfg>(sh, n, tile, line, lines, true);  // a stage in every tile
        clip_to_keys<Cfg>(p, first, last, key_lo, key_hi, lane);
        e0 = first[0], e1 = first[1];
        w0 = open_window(p, e0, last[0], lane);
        w1 = open_window(p, e1, last[1], lane);
        // The consumers expect a stage per tile (theirs take part in the exchange of sums).
        if (e0 == last[0] && e1 == last[1]) next_stage(4, 0, false);
      }
      claim(max(w0.end - e0, w1.end - e1));  // the merged list has at least that many stages
      while (e0 < w0.end || e1 < w1.end) {
        int slot0, slot1;
        const int k0 = window_key(p, w0, e0, lane, slot0);
        const int k1 = window_key(p, w1, e1, lane, slot1);
        const int key = min(k0, k1);
        const bool has0 = k0 == key, has1 = k1 == key;
        e0 += has0;
        e1 += has1;
        const bool last = !(e0 < w0.end || e1 < w1.end);
        const int s = next_stage(int(has0) | (int(has1) << 1) | (int(last) << 2), int(has0) + int(has1));
        if (issue_act) tma_load_2d(sh.stages[s].act, &p.act_map, &sh.full[s], key * B, token0);
        if (issue_w) {
          if (has0) tma_load_2d(sh.stages[s].w[0], &p.data_map, &sh.full[s], 0, slot0 * B);
          if (has1) tma_load_2d(sh.stages[s].w[1], &p.data_map, &sh.full[s], 0, slot1 * B);
        }
        claim(max(w0.end - e0, w1.end - e1));
      }
    } else {
      int first[1] = {__ldg(p.offsets + line[0])}, last[1] = {__ldg(p.offsets + line[0] + 1)};
      const bool any_block = Cfg::kSplit > 1 || last[0] > first[0];
      clip_to_keys<Cfg>(p, first, last, key_lo, key_hi, lane);  // nothing without a split
      const int begin = first[0], end = last[0];
      if (Cfg::kSplit > 1 && begin == end) next_stage(4, 0, false);  // see above
      LineWindow w = open_window(p, begin, end, lane);
      if constexpr (warp == 1) post_tile_lines<Cfg>(sh, n, tile, line, 1, any_block);
      claim(2 * (end - begin));
      for (int e = begin; e < end; ++e) {
        int slot;
        const int key = window_key(p, w, e, lane, slot);
        for (int half = 0; half < 2; ++half) {
          const bool last = e + 1 == end && half == 1;
          const int s = next_stage(3 | (int(last) << 2), 2);
          if (issue_act) tma_load_2d(sh.stages[s].act, &p.act_map, &sh.full[s], key * B + half * 64, token0);
          claim(2 * (end - e) - half - 1);
          if (!issue_w) continue;
          for (int h = 0; h < 2; ++h) {
            // dsd: rows h*64.. of the block, k-step `half`; dds (W_b^T): rows (reduction) `half`, columns h*64..
            if constexpr (Cfg::TransposeW) {
              tma_load_2d(sh.stages[s].w[h], &p.data_map, &sh.full[s], h * 64, slot * B + half * 64);
            } else {
              tma_load_2d(sh.stages[s].w[h], &p.data_map, &sh.full[s], half * 64, slot * B + h * 64);
            }
          }
        }
      }
    }
    claim(0);  // a tile without blocks made no stage
    unit = __shfl_sync(0xffffffffu, following, 0);
  }
  if (issue_act) count_out(p);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) ws_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int S = Cfg::kStages, B = Cfg::Block;
  extern __shared__ char smem_raw[];
  auto& sh = aligned_shared_storage<typename Cfg::SharedStorage>(smem_raw);
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int q = 0; q < Cfg::kTileSlots; ++q) {
      Barrier::init(&sh.tile_full[q], 1);
      Barrier::init(&sh.tile_empty[q], 32);  // the W-issuing producer warp
      Barrier::init(&sh.lines_full[q], 1);
      Barrier::init(&sh.lines_empty[q], 256);  // both consumers
    }
    if constexpr (Cfg::kSplit > 1) {
      for (int c = 0; c < 2; ++c) {  // every thread of consumer c in each other CTA arrives once per tile
        Barrier::init(&sh.split.red_full[c], 128 * (Cfg::kSplit - 1));
        Barrier::init(&sh.split.red_empty[c], 128 * (Cfg::kSplit - 1));
      }
    }
  }
  init_pipeline<S>(sh.full, sh.empty, 256);  // its fence covers the inits above (same thread)
  __syncthreads();
  if constexpr (Cfg::kSplit > 1) {  // the other CTAs' barriers are initialised before anyone arrives on them
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
  wait_for_previous_grid_and_release_next();  // no global access above (grid_dependency.cuh)

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x < 32) {
      produce<Cfg, 0>(p, sh);
    } else if (threadIdx.x < 64) {
      produce<Cfg, 1>(p, sh);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int h = warpgroup - 1, tid = threadIdx.x % 128;
  const T* bias = static_cast<const T*>(p.bias);

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<Cfg::kTokens>>{});
  Tensor coord = thr_mma.partition_C(make_identity_tensor(Shape<_64, Int<Cfg::kTokens>>{}));
  Tensor out_values = make_tensor_like<T>(acc);
  typename Cfg::TiledStoreOut store_out;
  auto thr_store = store_out.get_thread_slice(tid);
  Tensor out_dst_whole = thr_store.partition_D(make_tensor(make_smem_ptr(sh.out[h]), typename Cfg::SmemLayoutOut{}));
  Tensor out_src = thr_store.retile_S(out_values);
  // stmatrix instruction i of a thread writes tokens 16 i .. 16 i + 15 (the wgmma C layout along N), so part k
  // of the output tile is instructions k * kInstrPerPart onwards of the registers, written to the first
  // kInstrPerPart instructions' places in shared memory.
  constexpr int kInstrPerPart = Cfg::kOutTokens / 16;
  constexpr int kValuesPerInstr = decltype(size<0, 0>(out_src))::value;
  static_assert(decltype(size<0, 1>(out_src))::value == Cfg::kTokens / 16 &&
                    decltype(size<0, 1>(out_dst_whole))::value == Cfg::kTokens / 16,
                "stmatrix instructions of 16 tokens each");
  const auto part_shape = make_shape(make_shape(Int<kValuesPerInstr>{}, Int<kInstrPerPart>{}), _1{}, _1{});
  Tensor out_dst = make_tensor(out_dst_whole.data(), make_layout(part_shape, stride(out_dst_whole)));
  auto part_src = [&](int k) {
    return make_tensor(out_src.data() + k * kInstrPerPart * kValuesPerInstr, make_layout(part_shape, stride(out_src)));
  };

  int it = 0, exchanges = 0;
  const int rank = Cfg::kSplit > 1 ? int(cute::block_rank_in_cluster()) : 0;
  for (int n = 0;; ++n) {
    const int q = n % Cfg::kTileSlots;
    Barrier::wait(&sh.lines_full[q], (n / Cfg::kTileSlots) & 1);
    const volatile int* posted = sh.tile_lines[q];
    const int tile = posted[0];
    const int line[2] = {posted[1], posted[2]};
    const int lines = posted[3] & 3;
    const bool any_block = posted[3] & 4;  // else the producer made no stage
    Barrier::arrive(&sh.lines_empty[q]);
    if (tile >= p.n_tiles) break;
    const int token0 = tile / p.n_groups * Cfg::kTokens;
    // Consumer h's features: feature0 .. + 63 (none past the last line). A thread's accumulators cover two of
    // them, rows r and r + 8 of its warp's 16 (the wgmma C layout; the bias tests would catch another); their
    // bias is loaded now and used in the epilogue.
    const int feature0 = B == 64 ? (h == 0 ? line[0] : line[1]) * 64 : line[0] * 128 + h * 64;  // no local array
    uint16_t bias_bits_lo = 0, bias_bits_hi = 0;
    if (bias != nullptr) {
      bias_bits_lo = load_u16_pinned(bias + feature0 + get<0>(coord(0)));
      bias_bits_hi = load_u16_pinned(bias + feature0 + get<0>(coord(0)) + 8);
    }
    clear(acc);
    if (any_block) {  // else the producer made no stage
      int pending = -1;  // stage whose wgmma may still be reading shared memory
      for (;; ++it) {
        const int s = it % S;
        Barrier::wait(&sh.full[s], (it / S) & 1);
        const int flags = *reinterpret_cast<volatile int*>(&sh.flags[s]);
        if ((flags >> h) & 1) {
          Tensor sA = make_tensor(make_smem_ptr(sh.stages[s].w[h]), typename Cfg::SmemLayoutA{});
          Tensor sB = make_tensor(make_smem_ptr(sh.stages[s].act), typename Cfg::SmemLayoutB{});
          Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
          Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
          warpgroup_fence_operand(acc);
          warpgroup_arrive();
          gemm(mma, tCrA, tCrB, acc);
          warpgroup_commit_batch();
          warpgroup_wait<1>();  // the previous stage's wgmma are done
          warpgroup_fence_operand(acc);
          if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
          pending = s;
        } else {
          warpgroup_wait<0>();
          if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
          pending = -1;
          Barrier::arrive(&sh.empty[s]);
        }
        if (flags & 4) break;
      }
      ++it;
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
    }

    // Epilogue of consumer h.
    if (h < lines * (B == 64 ? 1 : 2)) {
      if constexpr (Cfg::kSplit > 1) {
        // The exchange: write this CTA's sums, then add the other CTAs' for part `rank` of the tokens.
        constexpr int kRows = decltype(size(acc))::value / 4;
        float4* red = sh.split.red[h];
        wait_cluster(&sh.split.red_empty[h], (exchanges & 1) ^ 1);  // the others have read the last tile's
        CUTE_UNROLL
        for (int g = 0; g < kRows; ++g) red[g * 128 + tid] = make_float4(acc(4 * g), acc(4 * g + 1), acc(4 * g + 2), acc(4 * g + 3));
        for (int r = 1; r < Cfg::kSplit; ++r) {
          arrive_remote(cute::set_block_rank(cute::cast_smem_ptr_to_uint(&sh.split.red_full[h]), (rank + r) % Cfg::kSplit));
        }
        wait_cluster(&sh.split.red_full[h], exchanges & 1);
        for (int r = 1; r < Cfg::kSplit; ++r) {
          const int other = (rank + r) % Cfg::kSplit;
          const uint32_t other_red = cute::set_block_rank(cute::cast_smem_ptr_to_uint(red), other);
          CUTE_UNROLL
          for (int g = 0; g < kRows; ++g) {
            // Registers 4g .. 4g + 3 hold 8 tokens of one wgmma column group (the C layout along N).
            if (get<1>(coord(4 * g)) / Cfg::kOutTokens != rank) continue;
            const float4 v = load_remote_float4(other_red + uint32_t((g * 128 + tid) * sizeof(float4)));
            acc(4 * g) += v.x;
            acc(4 * g + 1) += v.y;
            acc(4 * g + 2) += v.z;
            acc(4 * g + 3) += v.w;
          }
          arrive_remote(cute::set_block_rank(cute::cast_smem_ptr_to_uint(&sh.split.red_empty[h]), other));
        }
        ++exchanges;
      }
      if (tid == 0) tma_store_wait_read();  // the previous tile's store has left sh.out[h]
      cutlass::arch::NamedBarrier::sync(128, 1 + h);
      const float bias_lo = float(T::bitcast(bias_bits_lo)), bias_hi = float(T::bitcast(bias_bits_hi));
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        out_values(i) = T(acc(i) + (get<0>(coord(i)) == get<0>(coord(0)) ? bias_lo : bias_hi));
      }
      CUTE_UNROLL
      for (int k = 0; k < Cfg::kOutParts; ++k) {
        const int part_token0 = token0 + k * Cfg::kOutTokens;
        if constexpr (Cfg::kSplit > 1) {  // CTA r stores part r
          if (k != rank) continue;
          if (part_token0 >= p.m) break;
        } else if (k > 0) {
          if (part_token0 >= p.m) break;  // uniform over the warpgroup
          if (tid == 0) tma_store_wait_read();  // part k - 1 has left sh.out[h]
          cutlass::arch::NamedBarrier::sync(128, 1 + h);
        }
        copy(store_out, part_src(k), out_dst);
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA store
        cutlass::arch::NamedBarrier::sync(128, 1 + h);
        if (tid == 0) tma_store_2d(&p.out_map, sh.out[h], feature0, part_token0);
      }
    }
  }
  if (tid == 0) tma_store_wait_read();  // shared memory must outlive the last store's reads
  // ... and the other CTAs' reads of this one's sums.
  if constexpr (Cfg::kSplit > 1) wait_cluster(&sh.split.red_empty[h], (exchanges & 1) ^ 1);
#else
  __trap();  // never launched: the host picks this kernel only on sm_90 devices of a build with sm_90a
#endif
}

// How many clusters of the split's CTAs are resident at once (the round-robin grid; more would wait for a second
// wave). CTAs of ~200 KB take an SM each and a cluster's CTAs share a GPC: on an H200 (132 SMs) 66 clusters of 2
// and 30 of 4 (120 CTAs; cudaOccupancyMaxActiveClusters, session 42), fewer than 16 of 8 (16 tiles ran a second
// wave, session 44). Asked once per device; SMs / split if the query fails.
template <class Cfg>
cudaError_t resident_clusters(int sms, int* clusters) {
  static std::atomic<int> known[64];  // per device; 0: not asked yet (zero-initialised: static)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int count = device < 64 ? known[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t query = launch_config(dim3(unsigned(std::max(1, sms / Cfg::kSplit) * Cfg::kSplit)),
                                                   Cfg::kThreads, Cfg::kSmemBytes, nullptr, false, Cfg::kSplit, attrs);
    if (cudaOccupancyMaxActiveClusters(&count, ws_kernel<Cfg>, &query) != cudaSuccess || count <= 0) {
      (void)cudaGetLastError();  // not sticky: clear it
      count = sms / Cfg::kSplit;
    }
    count = std::max(1, std::min(count, sms / Cfg::kSplit));
    if (device < 64) known[device].store(count, std::memory_order_relaxed);
  }
  *clusters = count;
  return cudaSuccess;
}

// Host side: tensor maps through the driver entry point (no link against libcuda).
// The driver's cuTensorMapEncodeTiled, looked up once; the lookup's error if it fails.
inline cudaError_t tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000* out) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                       &status);
    if (err != cudaSuccess) return err;
    if (status != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  *out = encode;
  return cudaSuccess;
}

// row_elems: elements from one outer index to the next (0: inner, a contiguous matrix).
inline cudaError_t encode_2d_map(CUtensorMap* map, CUtensorMapDataType dtype, const void* ptr, uint64_t inner,
                                 uint64_t outer, uint32_t box_inner, uint32_t box_outer, uint64_t elem_bytes = 2,
                                 CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B, uint64_t row_elems = 0) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  const cudaError_t lookup = tensor_map_encoder(&encode);
  if (lookup != cudaSuccess) return lookup;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {(row_elems != 0 ? row_elems : inner) * elem_bytes};  // bytes
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUresult res = encode(map, dtype, 2, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A 3-D map: dims[0] contiguous, strides (bytes) of dims 1 and 2 in any order.
inline cudaError_t encode_3d_map(CUtensorMap* map, CUtensorMapDataType dtype, const void* ptr, const uint64_t dims[3],
                                 const uint64_t strides[2], const uint32_t box[3], CUtensorMapSwizzle swizzle) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  const cudaError_t lookup = tensor_map_encoder(&encode);
  if (lookup != cudaSuccess) return lookup;
  const cuuint64_t d[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t st[2] = {strides[0], strides[1]};
  const cuuint32_t b[3] = {box[0], box[1], box[2]};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUresult res = encode(map, dtype, 3, const_cast<void*>(ptr), d, st, b, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

__device__ __forceinline__ void tma_load_3d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
      :
      : "r"(cute::cast_smem_ptr_to_uint(smem_dst)), "l"(reinterpret_cast<uint64_t>(map)),
        "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// act (M, n_other * B), data [nnz, B, B] (nnz >= 1), out (M, n_lines * B); one CTA per SM (`sms`).
template <class Cfg>
cudaError_t launch(const void* act, int64_t m, int n_other, const void* data, int64_t nnz, const int32_t* offsets,
                   const int32_t* keys, const int32_t* slots, const int32_t* order, int* tile_counter, int n_lines,
                   const void* bias, void* out, int sms, bool programmatic, cudaStream_t stream) {
  if (m == 0 || n_lines == 0) return cudaSuccess;
  constexpr int B = Cfg::Block;
  const CUtensorMapDataType dtype = std::is_same<typename Cfg::T, cute::half_t>::value
                                        ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  KernelParams p;
  cudaError_t err = encode_2d_map(&p.act_map, dtype, act, uint64_t(n_other) * B, uint64_t(m), Cfg::BK,
                                  Cfg::kTokens);
  if (err != cudaSuccess) return err;
  err = encode_2d_map(&p.data_map, dtype, data, B, uint64_t(nnz) * B, Cfg::BK, 64);
  if (err != cudaSuccess) return err;
  err = encode_2d_map(&p.out_map, dtype, out, uint64_t(n_lines) * B, uint64_t(m), 64, Cfg::kOutTokens);
  if (err != cudaSuccess) return err;
  const int64_t groups = (int64_t(n_lines) + Cfg::kLinesPerTile - 1) / Cfg::kLinesPerTile;
  const int64_t token_tiles = (m + Cfg::kTokens - 1) / Cfg::kTokens;
  const int64_t tiles = groups * token_tiles;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  // The band: as many token tiles as ~16 MB of activations (8 at K = 4096 in 16 bits; L2 is 50 MB).
  const int64_t token_tile_bytes = int64_t(Cfg::kTokens) * n_other * B * int64_t(sizeof(typename Cfg::T));
  const int64_t band = std::min<int64_t>(token_tiles, std::max<int64_t>(1, (int64_t(16) << 20) / token_tile_bytes));
  p.offsets = offsets;
  p.keys = keys;
  p.slots = slots;
  p.order = order;
  p.tile_counter = Cfg::kSplit > 1 ? nullptr : tile_counter;  // a split's clusters take their tiles round-robin
  p.bias = bias;
  p.n_lines = n_lines;
  p.n_groups = int(groups);
  p.n_tiles = int(tiles);
  p.n_token_tiles = int(token_tiles);
  p.band = int(band);
  p.n_keys = n_other;
  p.m = m;
  err = sm80::prepare<ws_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  int ctas = int(std::min<int64_t>(tiles, sms));
  if constexpr (Cfg::kSplit > 1) {
    int clusters = 0;
    err = resident_clusters<Cfg>(sms, &clusters);
    if (err != cudaSuccess) return err;
    ctas = int(std::min<int64_t>(tiles, clusters) * Cfg::kSplit);
  }
  return launch_kernel(ws_kernel<Cfg>, dim3(unsigned(ctas)), Cfg::kThreads, Cfg::kSmemBytes, stream, programmatic,
                       Cfg::kSplit, p);
}

// The launch for blocks of 64 or 128 and 3 or 4 pipeline stages (others: cudaErrorInvalidValue).
template <class T, bool TransposeW>
cudaError_t launch_for_block(int block, int stages, const void* act, int64_t m, int n_other, const void* data, int64_t nnz,
                             const int32_t* offsets, const int32_t* keys, const int32_t* slots, const int32_t* order,
                             int* tile_counter, int n_lines, const void* bias, void* out, int sms,
                             bool programmatic, cudaStream_t stream) {
  const int key = block * 10 + stages;
  switch (key) {
#define PBSNG_SM90WS_CASE(BLOCK, STAGES)                                                                   \
  case BLOCK * 10 + STAGES:                                                                                \
    return launch<Config<T, BLOCK, TransposeW, STAGES>>(act, m, n_other, data, nnz, offsets, keys, slots,  \
                                                        order, tile_counter, n_lines, bias, out, sms,       \
                                                        programmatic, stream);
    PBSNG_SM90WS_CASE(64, 3)
    PBSNG_SM90WS_CASE(64, 4)
    PBSNG_SM90WS_CASE(128, 3)
    PBSNG_SM90WS_CASE(128, 4)
#undef PBSNG_SM90WS_CASE
    default: return cudaErrorInvalidValue;
  }
}

// dsd / dds with few rows of M: 128-token tiles whose reduction is split over `split` CTAs (1, 2, 4 or 8).
template <class T, bool TransposeW>
cudaError_t launch_few_rows(int block, int split, const void* act, int64_t m, int n_other, const void* data,
                            int64_t nnz, const int32_t* offsets, const int32_t* keys, const int32_t* slots,
                            const int32_t* order, int n_lines, const void* bias, void* out, int sms,
                            bool programmatic, cudaStream_t stream) {
  switch (block * 10 + split) {
#define PBSNG_SM90WS_FEW_ROWS_CASE(BLOCK, SPLIT)                                                           \
  case BLOCK * 10 + SPLIT:                                                                                 \
    return launch<Config<T, BLOCK, TransposeW, 4, 128, SPLIT>>(act, m, n_other, data, nnz, offsets, keys, slots, \
                                                               order, nullptr, n_lines, bias, out, sms,    \
                                                               programmatic, stream);
    PBSNG_SM90WS_FEW_ROWS_CASE(64, 1)
    PBSNG_SM90WS_FEW_ROWS_CASE(64, 2)
    PBSNG_SM90WS_FEW_ROWS_CASE(128, 1)
    PBSNG_SM90WS_FEW_ROWS_CASE(128, 2)
    PBSNG_SM90WS_FEW_ROWS_CASE(64, 4)
    PBSNG_SM90WS_FEW_ROWS_CASE(128, 4)
    PBSNG_SM90WS_FEW_ROWS_CASE(64, 8)
    PBSNG_SM90WS_FEW_ROWS_CASE(128, 8)
#undef PBSNG_SM90WS_FEW_ROWS_CASE
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace sm90ws
}  // namespace pbsng
