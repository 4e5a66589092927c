// dsd (y = x W^T + bias) and dds (dx = dy W) with blocks of 32 on Hopper: TMA loads and stores, an mbarrier
// pipeline and warp-specialized wgmma (sm_90a) in a persistent kernel, like kernel_sm90_ws.cuh (whose helpers it
// uses), but with the tokens as the wgmma M.
//
// Why another orientation: kernel_sm90_ws.cuh puts a line's features on the wgmma M (64), which a block of 32
// fills only half. Here a consumer computes out[64 tokens, 8 lines x 32 features] with one 64 x 32 x 16 wgmma per
// line and k-step, so a line without the block column skips its wgmma: no tensor-core work on absent blocks.
// A tile: 128 tokens x 8 lines (256 output features). Per stage, one block column of the union of the 8 lines'
// lists (or two, Config::kCols): the activation tile (128 tokens x 32, A, K-major) and the W blocks of the lines
// that have it (B: 32 x 32, K-major for the dsd, MN-major for the dds' W_b^T; from density 0.2 the binding runs the
// dds as the dsd of dy with W's blocks transposed, kernel_transpose_blocks.cuh). Bytes per useful FLOP at density d:
// (8 KB + 16 d KB) per 2 x 128 x 8 d x 32 x 32 FLOP, 1.3x a dense 128 x 256 tile's at d = 0.5 (kernel_sm90_ws.cuh's
// tile of two 64-lines has 1.33x at block 64).
// A 64 x 32 x 16 wgmma with A in shared memory (SS) reads A (2 KB) and B (1 KB) for 32 K FMA, ~1.5x shared memory's
// 128 B/clk at the tensor cores' rate; here A comes from registers (RS), loaded by ldmatrix once per stage and column
// for all 8 lines (session 29). Measured, the single producer warp's merge of the 8 lists bounded it first (~130
// dependent instructions per stage; doc/kernels.md, "Blocks of 32 on Hopper"), so the producer is now two warps:
//   warp 1 plans a tile at once (plan_tiles): its lines' block columns as bitmaps in shared memory, then one pass
//          over the union's 32-column words writes each stage's column, lines and W slots into a ring;
//   warp 0 issues (issue): per stage it waits for the free slot, lane 0 arms it and loads the activation tile(s),
//          lane 8 c + l loads line l's W block of the stage's column c if the line has it (lane l both blocks,
//          in one box, if the line has both).
// Epilogue: each consumer rounds its 64 tokens x 8 lines (+ bias), writes them by stmatrix into its own output
// tiles (64-byte swizzle; with two columns per stage 2 lines per round) and stores each line's 64 x 32 tile by TMA,
// which clips rows past M.
// Two block columns per stage (session 28) halve the stages' fixed cost (the barriers' round trip, the plan's
// reads: ~0.27 us a stage with neither loads nor wgmma, H100). Their 3 stages starved the loads while the consumers
// held two of them (wait<1>); since a two-column stage is released as soon as its own wgmma are done, and the
// output tiles take 2 lines per round so that a fourth stage fits (session 29), two columns are faster than one at
// every density, and the binding takes them (b32_columns in bindings.cpp).
// Two blocks per TMA box (session 33): a box costs the SM's TMA unit a fixed ~160 clocks besides its bytes (a
// contiguous 4 KB box ~1.07x a 2 KB one; benchmarks/profile/tma_row_rate.cu), and a two-column stage issued up to 2
// activation and 16 W boxes of 8 / 2 KB. Now a line that has both columns (its two blocks are then adjacent in
// `data`) gets one box of two blocks (W slots line-major), and two adjacent columns' activation tiles one 3-D box
// (PairBoxes, set_hopper_b32_pair_boxes in bindings.cpp). Session 33 measured 0-6 % less time at density 0.1-0.5 and
// 4-15 % at 1.0 within one build, but that build without pairs was 0-8 % slower than the kernel before; so the pairs
// are instantiations of their own (Config::kPairBits), and the kernel without them is the one before. Against it
// (session 34): activation pairs (column-major W slots) 0.97-1.01x the time at density 0.1-0.7, both kinds 0.91-0.99x
// from 0.7 but 1.00-1.03x below (line-major slots cost where few lines pair); the binding takes both from density 2/3.
//
// Constraints: sm_90a only (other archs compile a trap); fp16 / bf16; blocks of 32; activation row stride a
// multiple of 16 bytes and 16-byte aligned pointers (bindings.cpp checks).
#pragma once

#include "block_sparse/kernel_sm90_ws.cuh"

namespace pbsng {
namespace sm90b32 {

using sm90ws::KernelParams;

// What two-column stages load in one TMA box each where they can (B32Params::pair_boxes; see the top).
enum PairBoxes : int {
  kPairW = 1,    // a line's blocks of both columns, adjacent in `data`, in one box of 2 blocks
  kPairAct = 2,  // the activation tiles of two adjacent block columns in one 3-D box (128 tokens x 2 x 32)
};
struct B32Params : KernelParams {
  CUtensorMap data_pair_map;  // data, box of two adjacent blocks
  CUtensorMap act_pair_map;   // act as (32, M, K / 32), box 32 x 128 tokens x 2 block columns
  int pair_boxes;             // PairBoxes bits (0 with one column per stage)
};

// A from registers (RS): a consumer loads its A (64 tokens x 32 of a block column) by ldmatrix once per stage,
// and the lines' wgmma read only their B from shared memory.
template <class T, cute::GMMA::Major MajorB> struct GmmaAtom;
template <cute::GMMA::Major MajorB> struct GmmaAtom<cute::half_t, MajorB> {
  using type = cute::SM90_64x32x16_F32F16F16_RS<cute::GMMA::Major::K, MajorB>;
};
template <cute::GMMA::Major MajorB> struct GmmaAtom<cute::bfloat16_t, MajorB> {
  using type = cute::SM90_64x32x16_F32BF16BF16_RS<cute::GMMA::Major::K, MajorB>;
};

template <class T_, bool TransposeW_, int Cols_ = 1, int Pairs_ = 0>
struct Config {
  using T = T_;
  static constexpr int Block = 32;
  static constexpr bool TransposeW = TransposeW_;  // dds: B = W_b^T (MN-major)
  static constexpr int kCols = Cols_;  // block columns per pipeline stage
  // dsd: each W block loaded as 16 rows of 128 bytes (128-byte swizzle) instead of 32 rows of 64 bytes. In the
  // 64-byte-swizzle view the wgmma reads, that swaps features f and f ^ 1 where bit 3 of f is set; the epilogue
  // swaps them back (the pair sits in one thread's registers i, i ^ 1).
  static constexpr bool kWideRows = !TransposeW_;
  static constexpr int kLines = 8, kTokens = 128, BK = 32, kStages = Cols_ == 1 ? 6 : 4, kSplit = 1;
  // Output tiles per consumer: all 8 lines' with one column; with two, 2 lines' at a time (4 rounds of TMA stores),
  // which leaves room for a fourth stage of 48 KB (session 29: the dsd 3-5 % faster than with 3 stages, the dds
  // unchanged).
  static constexpr int kOutLines = Cols_ == 1 ? kLines : 2;
  // Two columns: a consumer releases a stage as soon as its own wgmma are done (wait<0>) instead of one stage later,
  // so that all but one stage can be loading (session 29, with 3 stages: 8-18 % faster at density 0.1-1.0 on
  // 8192 x 4096 -> 4096; with 6 stages of one column 2-4 % slower below density 1.0).
  static constexpr bool kReleaseEarly = Cols_ == 2;
  static constexpr int kLast = 1 << (8 * Cols_);  // flags bit: the tile's last stage
  static constexpr int kPlanLast = 256;            // the same in the plan's flags of a stage's column 0
  static constexpr int kMaxBlockCols = kB32MaxOtherBlocks;  // the activations' block columns (K / 32) a plan holds
  static constexpr int kPlanBatch = 32, kPlanBatches = 3;  // the stage plans' ring: 3 batches of 32 stages
  static constexpr int kTileSlots = 4;  // tiles the producer may post ahead of the consumers
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr cute::GMMA::Major MajorB = TransposeW ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  // A consumer's 64 tokens of the activation tile (the stage holds 128: consumer h's rows start at 64 h, whole
  // swizzle atoms of 8 rows).
  using SmemLayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<T>{},
                                                   cute::make_shape(cute::Int<64>{}, cute::Int<BK>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::conditional_t<TransposeW, cute::GMMA::Layout_MN_SW64_Atom<T>, cute::GMMA::Layout_K_SW64_Atom<T>>{},
      cute::make_shape(cute::Int<32>{}, cute::Int<BK>{})));
  // One line's output tile, (64 tokens, 32 features) row-major with the 64-byte swizzle of its TMA box.
  using SmemLayoutOut = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<T>{},
                                                     cute::make_shape(cute::Int<64>{}, cute::Int<32>{})));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T, MajorB>::type{}));
  // A consumer's A (64 tokens x 32) from shared memory into the RS fragment: 2 ldmatrix.x4 per warp.
  using TiledLoadA = decltype(cute::make_tiled_copy_A(cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, T>{}, TiledMma{}));
  using TiledStoreOut = decltype(cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U32x4_STSM_N, T>{},
                                                         TiledMma{}));

  // Pair boxes (PairBoxes bits the instantiation can issue; the kernel parameter picks among them): instantiations
  // of their own, so that the kernel without them is the one before session 33.
  static constexpr bool kPairs = Pairs_ != 0;
  static constexpr int kPairBits = Pairs_;
  static constexpr bool kPairsW = (Pairs_ & kPairW) != 0;
  static_assert(!kPairs || Cols_ == 2, "pair boxes need two columns per stage");
  using Params = cute::conditional_t<kPairs, B32Params, KernelParams>;
  // W slots line-major (slot l * kCols + c) where W pairs may come (a W pair box needs a line's slots adjacent), else
  // column-major (slot c * kLines + l).
  static constexpr int slot_of(int line, int column) {
    return kPairsW ? line * kCols + column : column * kLines + line;
  }
  static constexpr int kActTileBytes = kTokens * BK * int(sizeof(T));  // 8 KB
  static constexpr int kWTileBytes = 32 * BK * int(sizeof(T));         // 2 KB

  struct alignas(1024) Stage {
    T act[kCols][kTokens * BK];
    // Slot slot_of(l, c): line l's block of the stage's column c (loaded if it has one); line-major with W pairs, so
    // that a line's blocks of both columns (adjacent in `data`) can arrive in one TMA box.
    T w[kLines * kCols][32 * BK];
  };
  struct SharedStorage {
    Stage stages[kStages];
    alignas(1024) T out[2][kOutLines][64 * 32];
    uint32_t bias[2][128];  // per consumer: the tile's 256 bias values as pairs
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int flags[kStages];  // bits 8 c .. 8 c + 7: the lines with a block in the stage's column c; kLast
    uint64_t lines_full[kTileSlots];  // producer -> consumers: the tile with its lines
    uint64_t lines_empty[kTileSlots];
    int tile_lines[kTileSlots][kLines + 2];  // tile, 8 lines, their count | 16 if any has a block
    // The planner -> issuer ring (plan_tiles, issue): per stage its block column, flags (as `flags`) and the 8
    // lines' W slots; per batch the stage count (-1: no more tiles) and the tile's first token.
    uint32_t line_columns[kLines][kMaxBlockCols / 32];  // the planned tile's lines as bitmaps of block columns
    int plan_column[kPlanBatches][kPlanBatch][kCols];
    int plan_flags[kPlanBatches][kPlanBatch][kCols];  // per column its lines (bits 0-7); column 0's kPlanLast
    int plan_slot[kPlanBatches][kPlanBatch][kCols][kLines];
    int plan_count[kPlanBatches];
    int plan_token0[kPlanBatches];
    uint64_t plan_full[kPlanBatches];
    uint64_t plan_empty[kPlanBatches];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// A shared-memory int written by another warp (ld.volatile.shared: a generic volatile load is a system-scope LD).
__device__ __forceinline__ int load_shared_volatile(const int* p) {
  int v;
  asm volatile("ld.volatile.shared.b32 %0, [%1];" : "=r"(v) : "r"(cute::cast_smem_ptr_to_uint(p)));
  return v;
}

// The producer is two warps (doc/kernels.md, "Blocks of 32 on Hopper", session 27): the merge of a tile's 8 block
// lists into stages took ~130 dependent instructions per stage in the one warp that also issued the loads, and
// bounded the kernel. Now warp 1 plans each tile at once: the lines' block columns become bitmaps in shared
// memory, and one pass over their union's words writes every stage's column, lines and W slots (32 stages per
// warp step) into a ring; warp 0 only reads a stage's plan and issues its loads.

// Warp 1: takes the tiles (the first is blockIdx.x, then the counter), posts each to the consumers with its
// lines, and writes its stages' plans into the ring, in batches that never mix tiles.
template <class Cfg>
__device__ __forceinline__ void plan_tiles(const KernelParams& p, typename Cfg::SharedStorage& sh) {
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int L = Cfg::kLines, NB = Cfg::kPlanBatches, PB = Cfg::kPlanBatch;
  const int lane = threadIdx.x % 32;
  const int words = (p.n_keys + 31) / 32;
  int batch = 0;  // batches written so far: the ring slot is batch % NB, its phase (batch / NB) & 1
  int unit = blockIdx.x;
  for (int n = 0;; ++n) {
    // A tile starts a batch of its own; waiting for that slot first means the next unit is claimed only when the
    // issuer has at most NB - 1 batches of the current tile left (tiles are handed out late: the SMs end together).
    const int slot = batch % NB;
    Barrier::wait(&sh.plan_empty[slot], ((batch / NB) & 1) ^ 1);
    if (n > 0) {
      int next = 0;
      if (lane == 0) next = sm90ws::next_unit<Cfg>(p, unit);
      unit = __shfl_sync(0xffffffffu, next, 0);
    }
    const int tile = unit < p.n_tiles ? sm90ws::tile_of(p, unit) : p.n_tiles;
    const int group = tile % p.n_groups, token0 = tile / p.n_groups * Cfg::kTokens;
    const int idx = group * L + lane;
    const bool mine = tile < p.n_tiles && lane < L && idx < p.n_lines;
    const int line = mine ? __ldg(p.order + idx) : 0;
    const int begin = mine ? __ldg(p.offsets + line) : 0, end = mine ? __ldg(p.offsets + line + 1) : 0;
    const int lines = tile < p.n_tiles ? min(L, p.n_lines - group * L) : 0;
    const bool any_block = __any_sync(0xffffffffu, begin < end);
    // Post the tile (a number >= n_tiles tells the consumers to stop).
    const int q = n % Cfg::kTileSlots;
    Barrier::wait(&sh.lines_empty[q], ((n / Cfg::kTileSlots) & 1) ^ 1);
    if (lane < L) sh.tile_lines[q][1 + lane] = line;
    if (lane == 0) {
      sh.tile_lines[q][0] = tile;
      sh.tile_lines[q][L + 1] = lines | (int(any_block) << 4);
    }
    __syncwarp();
    if (lane == 0) Barrier::arrive(&sh.lines_full[q]);
    if (tile >= p.n_tiles) {
      if (lane == 0) {
        sh.plan_count[slot] = -1;
        Barrier::arrive(&sh.plan_full[slot]);
      }
      break;
    }
    if (!any_block) continue;  // no stage: the consumers store the bias alone

    // The lines' block columns as bitmaps (keys are sorted and unique per line, so each bit is set once).
    for (int i = lane; i < L * words; i += 32) sh.line_columns[i / words][i % words] = 0;
    __syncwarp();
    // Every lane walks all 8 lists, 32 entries at a time: lane j takes entry j of each chunk.
    CUTE_UNROLL
    for (int l = 0; l < L; ++l) {
      const int b_l = __shfl_sync(0xffffffffu, begin, l), e_l = __shfl_sync(0xffffffffu, end, l);
      for (int e = b_l + lane; e < e_l; e += 32) {
        const int key = __ldg(p.keys + e);
        atomicOr(&sh.line_columns[l][key >> 5], 1u << (key & 31));
      }
    }
    __syncwarp();
    // One pass over the union's words: lane i of a word takes its i-th block column, if any.
    int entry = begin;  // lane l < 8: line l's next entry
    int fill = 0;       // columns in the current batch (kCols per stage)
    int last_slot = slot, last_index = 0;
    for (int w = 0; w < words; ++w) {
      const uint32_t mine_bits = lane < L ? sh.line_columns[lane][w] : 0u;
      const uint32_t any = __reduce_or_sync(0xffffffffu, mine_bits);
      if (any == 0) continue;
      const int count = __popc(any);
      const int bit = lane < count ? int(__fns(any, 0, lane + 1)) : 0;
      int flags = 0, slots[L];
      CUTE_UNROLL
      for (int l = 0; l < L; ++l) {
        const uint32_t bits_l = __shfl_sync(0xffffffffu, mine_bits, l);
        const bool has = lane < count && ((bits_l >> bit) & 1);
        const unsigned voters = __ballot_sync(0xffffffffu, has);
        const int e = __shfl_sync(0xffffffffu, entry, l) + __popc(voters & ((1u << lane) - 1));
        slots[l] = has ? (Cfg::TransposeW ? __ldg(p.slots + e) : e) : 0;
        flags |= int(has) << l;
        if (lane == l) entry += __popc(voters);
      }
      // Write the word's columns into stages, starting new batches as they fill.
      constexpr int C = Cfg::kCols;
      for (int done = 0; done < count;) {
        int cur = batch % NB;
        if (fill == C * PB) {  // publish the full batch, wait for the next slot
          __syncwarp();        // every lane's writes to it come first
          if (lane == 0) {
            sh.plan_count[cur] = PB;
            sh.plan_token0[cur] = token0;
            Barrier::arrive(&sh.plan_full[cur]);
          }
          ++batch, fill = 0;
          cur = batch % NB;
          Barrier::wait(&sh.plan_empty[cur], ((batch / NB) & 1) ^ 1);
        }
        const int take = min(count - done, C * PB - fill);
        const int at = (fill + lane - done) / C, col = (fill + lane - done) % C;
        if (lane >= done && lane < done + take) {
          sh.plan_column[cur][at][col] = w * 32 + bit;
          sh.plan_flags[cur][at][col] = flags;
          CUTE_UNROLL
          for (int l = 0; l < L; ++l) sh.plan_slot[cur][at][col][l] = slots[l];
        }
        last_slot = cur, last_index = fill + take - 1;
        fill += take, done += take;
      }
    }
    __syncwarp();
    if (lane == 0) {  // the tile's last stage ends the consumers' mainloop; publish the batch
      const int at = last_index / Cfg::kCols;
      if (Cfg::kCols == 2 && last_index % 2 == 0) sh.plan_flags[last_slot][at][1] = 0;  // a stage of one column
      sh.plan_flags[last_slot][at][0] |= Cfg::kPlanLast;
      sh.plan_count[last_slot] = (fill + Cfg::kCols - 1) / Cfg::kCols;
      sh.plan_token0[last_slot] = token0;
      Barrier::arrive(&sh.plan_full[last_slot]);
    }
    ++batch;
  }
  if (lane == 0) sm90ws::count_out(p);
}

// Warp 0: per planned stage, waits for its free slot, arms it, and issues the activation tiles (lane 0) and the W
// blocks (lane 8 c + l for line l of column c).
template <class Cfg>
__device__ __forceinline__ void issue(const typename Cfg::Params& p, typename Cfg::SharedStorage& sh) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int S = Cfg::kStages, B = Cfg::Block, NB = Cfg::kPlanBatches;
  const int lane = threadIdx.x % 32;
  int it = 0;
  for (int batch = 0;; ++batch) {
    const int slot = batch % NB;
    Barrier::wait(&sh.plan_full[slot], (batch / NB) & 1);
    const int count = load_shared_volatile(&sh.plan_count[slot]);
    if (count < 0) break;
    const int token0 = load_shared_volatile(&sh.plan_token0[slot]);
    constexpr int C = Cfg::kCols, L = Cfg::kLines;
    for (int i = 0; i < count; ++i, ++it) {
      int column[C], flags = 0, acts = 0;
      CUTE_UNROLL
      for (int c = 0; c < C; ++c) {
        column[c] = load_shared_volatile(&sh.plan_column[slot][i][c]);
        const int f = load_shared_volatile(&sh.plan_flags[slot][i][c]);
        flags |= (f & 0xff) << (8 * c);
        if (c == 0 && (f & Cfg::kPlanLast)) flags |= Cfg::kLast;
        acts += (f & 0xff) != 0;
      }
      // Lane 8 c + l loads line l's block of column c.
      const int w_slot = lane < C * L ? load_shared_volatile(&sh.plan_slot[slot][i][lane / L][lane % L]) : 0;
      // Pairs: lane l < 8 loads line l's blocks of both columns in one box when they are adjacent in `data`
      // (always for the dsd: no block of the line lies between two consecutive union columns), and lane 8 + l
      // then loads nothing.
      bool pair_w = false, pair_act = false;
      if constexpr (Cfg::kPairs) {
        // The lines with both blocks, from the flags alone: no shuffle on the issuer's path (its every instruction
        // delays the loads). W^T's blocks (the dds read from W) are adjacent only where their slots are.
        const int both = flags & (flags >> L) & 0xff;
        pair_w = Cfg::kPairsW && (p.pair_boxes & kPairW) && lane < C * L && ((both >> (lane % L)) & 1);
        if constexpr (Cfg::kPairsW && Cfg::TransposeW) {
          const int next_slot = __shfl_down_sync(0xffffffffu, w_slot, L);
          const bool lower = pair_w && lane < L && next_slot == w_slot + 1;
          const bool upper = __shfl_up_sync(0xffffffffu, lower, L);
          pair_w = lane < L ? lower : upper;
        }
        pair_act = (p.pair_boxes & kPairAct) && acts == 2 && column[1] == column[0] + 1;
      }
      const int s = it % S;
      Barrier::wait(&sh.empty[s], ((it / S) & 1) ^ 1);
      if (lane == 0) {
        sh.flags[s] = flags;
        TxBarrier::arrive_and_expect_tx(&sh.full[s], acts * Cfg::kActTileBytes +
                                                         __popc(flags & (Cfg::kLast - 1)) * Cfg::kWTileBytes);
        if constexpr (Cfg::kPairs) {
          if (pair_act) {
            sm90ws::tma_load_3d(sh.stages[s].act[0], &p.act_pair_map, &sh.full[s], 0, token0, column[0]);
          }
        }
        if (!pair_act) {
          CUTE_UNROLL
          for (int c = 0; c < C; ++c) {
            if ((flags >> (8 * c)) & 0xff) {
              sm90ws::tma_load_2d(sh.stages[s].act[c], &p.act_map, &sh.full[s], column[c] * B, token0);
            }
          }
        }
      }
      __syncwarp();  // the stage is armed before its W loads
      if (lane < C * L && ((flags >> lane) & 1)) {
        const int row = w_slot * (Cfg::kWideRows ? B / 2 : B);
        if constexpr (Cfg::kPairs) {
          void* dst = sh.stages[s].w[Cfg::slot_of(lane % L, lane / L)];
          if (lane < L && pair_w) {
            sm90ws::tma_load_2d(dst, &p.data_pair_map, &sh.full[s], 0, row);
          } else if (lane < L || !pair_w) {
            sm90ws::tma_load_2d(dst, &p.data_map, &sh.full[s], 0, row);
          }
        } else {
          sm90ws::tma_load_2d(sh.stages[s].w[lane], &p.data_map, &sh.full[s], 0, row);  // slot_of(lane % L, lane / L)
        }
      }
    }
    __syncwarp();
    if (lane == 0) Barrier::arrive(&sh.plan_empty[slot]);  // after the batch's last read
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) b32_kernel(const __grid_constant__ typename Cfg::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int S = Cfg::kStages, L = Cfg::kLines;
  extern __shared__ char smem_raw[];
  auto& sh = sm90ws::aligned_shared_storage<typename Cfg::SharedStorage>(smem_raw);
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int q = 0; q < Cfg::kTileSlots; ++q) {
      Barrier::init(&sh.lines_full[q], 1);
      Barrier::init(&sh.lines_empty[q], 256);  // both consumers
    }
    for (int b = 0; b < Cfg::kPlanBatches; ++b) {
      Barrier::init(&sh.plan_full[b], 1);   // the planner's lane 0
      Barrier::init(&sh.plan_empty[b], 1);  // the issuer's lane 0
    }
  }
  sm90ws::init_pipeline<S>(sh.full, sh.empty, 256);  // its fence covers the inits above (same thread)
  __syncthreads();
  wait_for_previous_grid_and_release_next();  // no global access above (grid_dependency.cuh)

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<96>();
    if (threadIdx.x < 32) issue<Cfg>(p, sh);
    else if (threadIdx.x < 64) plan_tiles<Cfg>(p, sh);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<200>();
  // h from a warp reduction: a uniform register, which keeps the A descriptors on the uniform datapath.
  const int h = __reduce_max_sync(0xffffffffu, warpgroup - 1), tid = threadIdx.x % 128;
  const T* bias = static_cast<const T*>(p.bias);

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  // The 8 lines' accumulators: line l's 64 x 32 fragment is registers 16 l .. 16 l + 15 (the N = 256 fragment
  // of the 64 x 32 atom tiles N by 8).
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<32 * L>>{});
  using LineFragment = decltype(partition_fragment_C(mma, Shape<_64, _32>{}));
  constexpr int kLineValues = decltype(size(LineFragment{}))::value;
  static_assert(kLineValues * L == decltype(size(acc))::value, "8 line fragments");
  const auto line_layout = LineFragment{}.layout();
  auto acc_line = [&](int l) { return make_tensor(acc.data() + l * kLineValues, line_layout); };
  Tensor coord = thr_mma.partition_C(make_identity_tensor(Shape<_64, _32>{}));  // a line's (token, feature)
  typename Cfg::TiledStoreOut store_out;
  auto thr_store = store_out.get_thread_slice(tid);

  // Per buffer (stage parity) and column, a consumer's A fragment: 64 tokens x 32, 8 registers a thread.
  typename Cfg::TiledLoadA load_a;
  auto thr_load_a = load_a.get_thread_slice(tid);
  using FragmentA = decltype(thr_mma.partition_fragment_A(
      make_tensor(make_smem_ptr(static_cast<T*>(nullptr)), typename Cfg::SmemLayoutA{})));
  FragmentA rA[2][Cfg::kCols];

  int it = 0;
  for (int n = 0;; ++n) {
    const int q = n % Cfg::kTileSlots;
    Barrier::wait(&sh.lines_full[q], (n / Cfg::kTileSlots) & 1);
    const volatile int* posted = sh.tile_lines[q];
    const int tile = posted[0];
    if (tile >= p.n_tiles) {
      Barrier::arrive(&sh.lines_empty[q]);
      break;
    }
    const int lines = posted[L + 1] & 15;
    const bool any_block = posted[L + 1] & 16;  // else the producer made no stage
    const int token0 = tile / p.n_groups * Cfg::kTokens + 64 * h;
    // Thread t's pair of bias values: features 2 (t % 16), + 1 of the tile's line t / 16, loaded now and used in
    // the epilogue (as kernel_sm90_ws.cuh, a pinned load that the mainloop hides).
    uint32_t bias_pair = 0;
    if (bias != nullptr && tid / 16 < lines) {  // two 16-bit loads: a bias view need not be 4-byte aligned
      const T* b = bias + posted[1 + tid / 16] * 32 + 2 * (tid % 16);
      bias_pair = uint32_t(sm90ws::load_u16_pinned(b)) | (uint32_t(sm90ws::load_u16_pinned(b + 1)) << 16);
    }
    clear(acc);
    if (any_block) {
      int pending = -1;  // stage whose wgmma may still be reading shared memory and registers rA[buf ^ 1]
      // One stage; buf (a compile-time 0 / 1) picks the A registers, so that the stage's ldmatrix never overwrites
      // registers the previous stage's wgmma may still read. Returns whether it was the tile's last stage.
      auto stage = [&](auto buf) -> bool {
        // The stage and its flags from warp reductions, i.e. in uniform registers: with h (above) that puts every
        // wgmma descriptor on the uniform datapath, without an R2UR per wgmma (2-12 % faster, H100, session 25).
        const int s = __reduce_max_sync(0xffffffffu, it % S);
        Barrier::wait(&sh.full[s], (it / S) & 1);
        const int flags = __reduce_or_sync(0xffffffffu, load_shared_volatile(&sh.flags[s]));
        // Each column's A once into registers: with A in shared memory (SS) every line's wgmma re-read it, 2 KB of
        // the 3 KB a 64 x 32 x 16 wgmma reads (session 29, 8192 x 4096 -> 4096: two columns 0-9 % faster, most at
        // density >= 0.5; one column 2 % slower below 0.5, 0-3 % faster from 0.5).
        CUTE_UNROLL
        for (int col = 0; col < Cfg::kCols; ++col) {
          Tensor sA = make_tensor(make_smem_ptr(sh.stages[s].act[col] + 64 * Cfg::BK * h), typename Cfg::SmemLayoutA{});
          copy(load_a, thr_load_a.partition_S(sA), thr_load_a.retile_D(rA[buf][col]));
        }
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int col = 0; col < Cfg::kCols; ++col) {
          // Line l's B descriptors: line 0's of this column advanced by l lines of kCols blocks (the descriptors
          // count 16-byte units), one add per line instead of a descriptor built from its address.
          Tensor sB0 = make_tensor(make_smem_ptr(sh.stages[s].w[Cfg::slot_of(0, col)]), typename Cfg::SmemLayoutB{});
          Tensor tCrB0 = thr_mma.make_fragment_B(thr_mma.partition_B(sB0));
          CUTE_UNROLL
          for (int l = 0; l < L; ++l) {
            if ((flags >> (8 * col + l)) & 1) {
              constexpr int kLineBlocks = Cfg::slot_of(1, 0) - Cfg::slot_of(0, 0);
              Tensor tCrB = make_tensor(tCrB0.data() + l * (kLineBlocks * Cfg::kWTileBytes / 16), tCrB0.layout());
              Tensor c = acc_line(l);
              gemm(mma, rA[buf][col], tCrB, c);
            }
          }
        }
        warpgroup_commit_batch();
        if constexpr (Cfg::kReleaseEarly) {
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc);
          Barrier::arrive(&sh.empty[s]);
        } else {
          warpgroup_wait<1>();  // the previous stage's wgmma are done
          warpgroup_fence_operand(acc);
          if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
          pending = s;
        }
        ++it;
        return flags & Cfg::kLast;
      };
      while (!stage(Int<0>{}) && !stage(Int<1>{})) {
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
    }

    // Epilogue of consumer h: its 64 tokens of the tile's lines.
    if (token0 < p.m) {
      if (tid == 0) sm90ws::tma_store_wait_read();  // the previous tile's stores have left sh.out[h]
      sh.bias[h][tid] = bias_pair;
      cutlass::arch::NamedBarrier::sync(128, 1 + h);
      const T* bias_values = reinterpret_cast<const T*>(sh.bias[h]);
      constexpr int R = Cfg::kOutLines;
      CUTE_UNROLL
      for (int l0 = 0; l0 < L; l0 += R) {  // rounds of R lines through the output tiles
        if (l0 >= lines) break;  // uniform
        if (l0 > 0) {
          if (tid == 0) sm90ws::tma_store_wait_read();  // the previous round's stores have left sh.out[h]
          cutlass::arch::NamedBarrier::sync(128, 1 + h);
        }
        CUTE_UNROLL
        for (int j = 0; j < R; ++j) {
          const int l = l0 + j;
          if (l >= lines) break;  // uniform
          Tensor c = acc_line(l);
          Tensor values = make_tensor_like<T>(c);
          CUTE_UNROLL
          for (int i = 0; i < size(c); ++i) {
            const int f = get<1>(coord(i));
            const float v = (Cfg::kWideRows && ((f >> 3) & 1)) ? c(i ^ 1) : c(i);  // see Config::kWideRows
            values(i) = T(v + float(bias_values[l * 32 + f]));
          }
          Tensor dst = thr_store.partition_D(make_tensor(make_smem_ptr(sh.out[h][j]), typename Cfg::SmemLayoutOut{}));
          copy(store_out, thr_store.retile_S(values), dst);
        }
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA stores
        cutlass::arch::NamedBarrier::sync(128, 1 + h);
        if (tid == 0) {
          for (int j = 0; j < R && l0 + j < lines; ++j) {
            sm90ws::tma_store_2d(&p.out_map, sh.out[h][j], posted[1 + l0 + j] * 32, token0);
          }
        }
      }
    }
    Barrier::arrive(&sh.lines_empty[q]);  // after the last read of the posted lines
  }
  if (tid == 0) sm90ws::tma_store_wait_read();  // shared memory must outlive the last stores' reads
#else
  __trap();  // never launched: the host picks this kernel only on sm_90 devices of a build with sm_90a
#endif
}

// act (M, n_other * 32), data [nnz, 32, 32] (nnz >= 1), out (M, n_lines * 32); one CTA per SM (`sms`).
template <class Cfg>
cudaError_t launch_config(const void* act, int64_t m, int n_other, const void* data, int64_t nnz,
                          const int32_t* offsets, const int32_t* keys, const int32_t* slots, const int32_t* order,
                          int* tile_counter, int n_lines, const void* bias, void* out, int sms, int pair_boxes,
                          bool programmatic, cudaStream_t stream) {
  using T = typename Cfg::T;
  if (m == 0 || n_lines == 0) return cudaSuccess;
  if (n_other > Cfg::kMaxBlockCols) return cudaErrorInvalidValue;  // the binding's rule keeps these on SM80
  constexpr int B = Cfg::Block;
  const CUtensorMapDataType dtype = std::is_same<T, cute::half_t>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  constexpr CUtensorMapSwizzle kSwizzle = CU_TENSOR_MAP_SWIZZLE_64B;  // 64-byte rows (32 16-bit values)
  typename Cfg::Params p;
  cudaError_t err = sm90ws::encode_2d_map(&p.act_map, dtype, act, uint64_t(n_other) * B, uint64_t(m), Cfg::BK,
                                          Cfg::kTokens, 2, kSwizzle);
  if (err != cudaSuccess) return err;
  if (Cfg::kWideRows) {  // [nnz * 16, 64]: a block is 16 rows of 128 bytes
    err = sm90ws::encode_2d_map(&p.data_map, dtype, data, 2 * B, uint64_t(nnz) * B / 2, 2 * B, B / 2, 2,
                                CU_TENSOR_MAP_SWIZZLE_128B);
  } else {
    err = sm90ws::encode_2d_map(&p.data_map, dtype, data, B, uint64_t(nnz) * B, B, B, 2, kSwizzle);
  }
  if (err != cudaSuccess) return err;
  err = sm90ws::encode_2d_map(&p.out_map, dtype, out, uint64_t(n_lines) * B, uint64_t(m), B, 64, 2, kSwizzle);
  if (err != cudaSuccess) return err;
  if constexpr (Cfg::kPairs) {
    p.pair_boxes = pair_boxes & Cfg::kPairBits;
    if (p.pair_boxes & kPairW) {  // as data_map, two blocks per box
      err = Cfg::kWideRows ? sm90ws::encode_2d_map(&p.data_pair_map, dtype, data, 2 * B, uint64_t(nnz) * B / 2, 2 * B,
                                                   B, 2, CU_TENSOR_MAP_SWIZZLE_128B)
                           : sm90ws::encode_2d_map(&p.data_pair_map, dtype, data, B, uint64_t(nnz) * B, B, 2 * B, 2,
                                                   kSwizzle);
      if (err != cudaSuccess) return err;
    }
    if (p.pair_boxes & kPairAct) {  // act as (32 values, M tokens, K / 32 block columns): two columns' tiles in a row
      const uint64_t dims[3] = {uint64_t(B), uint64_t(m), uint64_t(n_other)};
      const uint64_t strides[2] = {uint64_t(n_other) * B * sizeof(T), uint64_t(B) * sizeof(T)};
      const uint32_t box[3] = {uint32_t(B), uint32_t(Cfg::kTokens), 2};
      err = sm90ws::encode_3d_map(&p.act_pair_map, dtype, act, dims, strides, box, kSwizzle);
      if (err != cudaSuccess) return err;
    }
  }
  const int64_t groups = (int64_t(n_lines) + Cfg::kLines - 1) / Cfg::kLines;
  const int64_t token_tiles = (m + Cfg::kTokens - 1) / Cfg::kTokens;
  const int64_t tiles = groups * token_tiles;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  // The band (kernel_sm90_ws.cuh, tile_of): as many token tiles as ~16 MB of activations.
  const int64_t token_tile_bytes = int64_t(Cfg::kTokens) * n_other * B * int64_t(sizeof(T));
  const int64_t band = std::min<int64_t>(token_tiles, std::max<int64_t>(1, (int64_t(16) << 20) / token_tile_bytes));
  p.offsets = offsets;
  p.keys = keys;
  p.slots = slots;
  p.order = order;
  p.tile_counter = tile_counter;
  p.bias = bias;
  p.n_lines = n_lines;
  p.n_groups = int(groups);
  p.n_tiles = int(tiles);
  p.n_token_tiles = int(token_tiles);
  p.band = int(band);
  p.n_keys = n_other;
  p.m = m;
  err = sm80::prepare<b32_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int ctas = int(std::min<int64_t>(tiles, sms));
  return launch_kernel(b32_kernel<Cfg>, dim3(unsigned(ctas)), Cfg::kThreads, Cfg::kSmemBytes, stream, programmatic, 1,
                       p);
}

// columns: block columns per stage, 1 or 2 (the binding's choice, b32_columns in bindings.cpp).
template <class T, bool TransposeW>
cudaError_t launch(const void* act, int64_t m, int n_other, const void* data, int64_t nnz, const int32_t* offsets,
                   const int32_t* keys, const int32_t* slots, const int32_t* order, int* tile_counter, int n_lines,
                   const void* bias, void* out, int sms, int columns, int pair_boxes, bool programmatic,
                   cudaStream_t stream) {
  if (columns == 2 && pair_boxes == kPairAct) {  // column-major W slots
    return launch_config<Config<T, TransposeW, 2, kPairAct>>(act, m, n_other, data, nnz, offsets, keys, slots, order,
                                                             tile_counter, n_lines, bias, out, sms, pair_boxes,
                                                             programmatic, stream);
  }
  if (columns == 2 && pair_boxes != 0) {
    return launch_config<Config<T, TransposeW, 2, kPairW | kPairAct>>(act, m, n_other, data, nnz, offsets, keys, slots,
                                                                      order, tile_counter, n_lines, bias, out, sms,
                                                                      pair_boxes, programmatic, stream);
  }
  if (columns == 2) {
    return launch_config<Config<T, TransposeW, 2>>(act, m, n_other, data, nnz, offsets, keys, slots, order,
                                                   tile_counter, n_lines, bias, out, sms, 0, programmatic, stream);
  }
  if (columns != 1) return cudaErrorInvalidValue;
  return launch_config<Config<T, TransposeW, 1>>(act, m, n_other, data, nnz, offsets, keys, slots, order,
                                                 tile_counter, n_lines, bias, out, sms, 0, programmatic, stream);
}

}  // namespace sm90b32
}  // namespace pbsng
