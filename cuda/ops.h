// The three products as bindings.cpp exposes them (argument checks, then the launch on PyTorch's current
// stream), for the other C++ callers: the eager autograd function in linear_autograd.cpp.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

namespace pbsng {

// y (M, N) = x (M, K) W^T + bias
at::Tensor dsd(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& bias,
               const at::Tensor& row_offsets, const at::Tensor& col_indices, const at::Tensor& row_indices,
               const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t, const at::Tensor& perm_t,
               const at::Tensor& row_order, const at::Tensor& col_order);

// dx (M, K) = dy (M, N) W
at::Tensor dds(const at::Tensor& dy, const at::Tensor& data, const at::Tensor& row_offsets,
               const at::Tensor& col_indices, const at::Tensor& row_indices, const at::Tensor& col_offsets_t,
               const at::Tensor& row_indices_t, const at::Tensor& perm_t, const at::Tensor& row_order,
               const at::Tensor& col_order);

// dds whose output dx is allocated on the current stream while the kernel runs on `work_stream` when given: the
// caller orders the two streams (linear's backward on two streams).
at::Tensor dds_on(const std::optional<c10::cuda::CUDAStream>& work_stream, const at::Tensor& dy,
                  const at::Tensor& data, const at::Tensor& row_offsets, const at::Tensor& col_indices,
                  const at::Tensor& row_indices, const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t,
                  const at::Tensor& perm_t, const at::Tensor& row_order, const at::Tensor& col_order);

// (dW_b [nnz, B, B] = dy^T x on the kept blocks, dy.sum(0) when with_bias)
std::tuple<at::Tensor, std::optional<at::Tensor>> sdd(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& row_offsets, const at::Tensor& col_indices,
    const at::Tensor& row_indices, const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t,
    const at::Tensor& perm_t, const at::Tensor& row_order, const at::Tensor& col_order,
    std::vector<int64_t> block_shape, bool with_bias);

// y = x W^T + bias with its backward (dds, sdd and the bias sum) attached as a C++ autograd node;
// `index` holds the eight tensors of layout.INDEX_NAMES + ORDER_NAMES.
at::Tensor linear(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& bias,
                  const std::vector<at::Tensor>& index);

// linear's gradients for traced code (a custom op of _ops.py): dx when want_x, the kept blocks' when want_data,
// the bias's when want_bias (None where not wanted); the dds runs on a second stream beside the sdd when both
// are wanted, as in linear's backward.
std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>> linear_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& data, const std::vector<at::Tensor>& index,
    bool want_x, bool want_data, bool want_bias);

// Whether linear's backward runs the dds on a second stream beside the sdd (default true); returns the previous
// setting.
bool set_backward_overlap(bool enabled);

}  // namespace pbsng
