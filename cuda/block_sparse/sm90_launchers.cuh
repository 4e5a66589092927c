// Specializations of launch_{dsd,dds,sdd}_sm90 for one dtype (blocks 32, 64 and 128; others:
// cudaErrorInvalidValue). One translation unit per product and dtype keeps each compile short.
#pragma once

#include "block_sparse/kernel_sm90_b32.cuh"
#include "block_sparse/kernel_sm90_sdd.cuh"
#include "block_sparse/kernel_sm90_sdd_b32.cuh"
#include "block_sparse/kernel_sm90_sdd_cpasync.cuh"
#include "block_sparse/kernel_sm90_ws.cuh"
#include "block_sparse/kernel_transpose_blocks.cuh"

#define PBSNG_DEFINE_DSD_SM90_LAUNCHER(DTYPE)                                                                \
  namespace pbsng {                                                                                        \
  template <>                                                                                              \
  cudaError_t launch_dsd_sm90<DTYPE>(const DsdParams& p, cudaStream_t stream) {                            \
    if (p.splits != 1 || p.nnz < 1) return cudaErrorInvalidValue;                                          \
    if (p.block == 32) {                                                                                   \
      return sm90b32::launch<sm80::ElementFor<DTYPE>::type, false>(                                        \
          p.x, p.m, p.n_block_cols, p.data, p.nnz, p.row_offsets, p.col_indices, nullptr, p.row_order,     \
          p.tile_counter, p.n_block_rows, p.bias, p.y, p.sms, p.b32_columns, p.b32_pair_boxes, p.programmatic, \
          stream);                                                                                         \
    }                                                                                                      \
    if (p.few_rows_split > 0) {                                                                            \
      return sm90ws::launch_few_rows<sm80::ElementFor<DTYPE>::type, false>(                               \
          p.block, p.few_rows_split, p.x, p.m, p.n_block_cols, p.data, p.nnz, p.row_offsets, p.col_indices, \
          nullptr, p.row_order, p.n_block_rows, p.bias, p.y, p.sms, p.programmatic, stream);               \
    }                                                                                                      \
    return sm90ws::launch_for_block<sm80::ElementFor<DTYPE>::type, false>(                                 \
        p.block, p.stages, p.x, p.m, p.n_block_cols, p.data, p.nnz, p.row_offsets, p.col_indices, nullptr,           \
        p.row_order, p.tile_counter, p.n_block_rows, p.bias, p.y, p.sms, p.programmatic, stream);          \
  }                                                                                                        \
  }

#define PBSNG_DEFINE_DDS_SM90_LAUNCHER(DTYPE)                                                                \
  namespace pbsng {                                                                                        \
  template <>                                                                                              \
  cudaError_t launch_dds_sm90<DTYPE>(const DdsParams& p, cudaStream_t stream) {                            \
    if (p.nnz < 1) return cudaErrorInvalidValue;                                                           \
    if (p.block == 32 && p.data_t != nullptr) { /* the dsd of dy with W^T */                              \
      using T = sm80::ElementFor<DTYPE>::type;                                                             \
      const cudaError_t err = transpose_blocks::launch<T>(p.data, p.perm_t, p.nnz, p.data_t, stream);      \
      if (err != cudaSuccess) return err;                                                                  \
      return sm90b32::launch<T, false>(p.dy, p.m, p.n_block_rows, p.data_t, p.nnz, p.col_offsets_t,        \
                                       p.row_indices_t, nullptr, p.col_order, p.tile_counter,              \
                                       p.n_block_cols, nullptr, p.dx, p.sms, p.b32_columns,                \
                                       p.b32_pair_boxes, p.programmatic, stream);                          \
    }                                                                                                      \
    if (p.block == 32) {                                                                                   \
      return sm90b32::launch<sm80::ElementFor<DTYPE>::type, true>(                                         \
          p.dy, p.m, p.n_block_rows, p.data, p.nnz, p.col_offsets_t, p.row_indices_t, p.perm_t,            \
          p.col_order, p.tile_counter, p.n_block_cols, nullptr, p.dx, p.sms, p.b32_columns, p.b32_pair_boxes, \
          p.programmatic, stream);                                                                         \
    }                                                                                                      \
    if (p.few_rows_split > 0) {                                                                            \
      return sm90ws::launch_few_rows<sm80::ElementFor<DTYPE>::type, true>(                                \
          p.block, p.few_rows_split, p.dy, p.m, p.n_block_rows, p.data, p.nnz, p.col_offsets_t,           \
          p.row_indices_t, p.perm_t, p.col_order, p.n_block_cols, nullptr, p.dx, p.sms, p.programmatic,    \
          stream);                                                                                         \
    }                                                                                                      \
    return sm90ws::launch_for_block<sm80::ElementFor<DTYPE>::type, true>(                                  \
        p.block, p.stages, p.dy, p.m, p.n_block_rows, p.data, p.nnz, p.col_offsets_t, p.row_indices_t, p.perm_t,    \
        p.col_order, p.tile_counter, p.n_block_cols, nullptr, p.dx, p.sms, p.programmatic, stream);        \
  }                                                                                                        \
  }

#define PBSNG_DEFINE_SDD_SM90_LAUNCHER(DTYPE)                                                                \
  namespace pbsng {                                                                                        \
  template <>                                                                                              \
  cudaError_t launch_sdd_sm90<DTYPE>(const SddParams& p, cudaStream_t stream) {                            \
    using T = sm80::ElementFor<DTYPE>::type;                                                                \
    if (p.m < 1) return cudaErrorInvalidValue;                                                             \
    /* 64 tokens per stage: 32 (twice the stages) measured 10 % slower for blocks of 64 on an H100 */      \
    switch (p.block) {                                                                                     \
      case 32:                                                                                             \
        switch (p.b32_mode) {                                                                              \
          case sm90sddb32::kColumns: return sm90sddb32::launch<sm90sddb32::Config<T, sm90sddb32::kColumns>>(p, stream); \
          case sm90sddb32::kColumnPairs:                                                                   \
            return sm90sddb32::launch<sm90sddb32::Config<T, sm90sddb32::kColumnPairs>>(p, stream);         \
          case sm90sddb32::kQuads: return sm90sddb32::launch<sm90sddb32::Config<T, sm90sddb32::kQuads>>(p, stream); \
          case sm90sddb32::kColumnsT: { /* x^T first (kernel_transpose_blocks.cuh) */                     \
            const cudaError_t err = transpose_blocks::launch_matrix<T>(p.x, p.m, int64_t(p.n_block_cols) * 32, \
                                                                       p.x_t, p.x_t_row, stream);          \
            if (err != cudaSuccess) return err;                                                            \
            return sm90sddb32::launch<sm90sddb32::Config<T, sm90sddb32::kColumnsT>>(p, stream);            \
          }                                                                                                \
          default: return cudaErrorInvalidValue;                                                           \
        }                                                                                                  \
      case 64: return sm90sdd::launch_config<sm90sdd::Config<T, 64>>(p, stream);                          \
      case 128:                                                                                            \
        if (p.one_block_ctas) return sm90sddcp::launch<sm90sddcp::Config<T>>(p, stream);                   \
        return sm90sdd::launch_config<sm90sdd::Config<T, 128>>(p, stream);                                \
      default: return cudaErrorInvalidValue;                                                               \
    }                                                                                                      \
  }                                                                                                        \
  }
