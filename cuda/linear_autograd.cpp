// The layer's eager autograd path: y = x W^T + bias as a C++ autograd function whose backward is dds (grad
// input) and sdd (grad of the kept blocks, with the bias sum fused where the kernel can).
//
// Why C++: the autograd engine runs a CUDA backward on its own device thread. A Python backward
// (functional.BlockSparseLinearFunction) must take the GIL there and go through Python frames, which on the
// H100 machine cost more host time per training step than the GPU spends at density 0.1-0.25
// (benchmarks/profile/host_step.py). This node's backward runs without the GIL.
// Traced code (torch.compile, export) keeps the Python Function over the custom ops of _ops.py.

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "checks.h"
#include "ops.h"

namespace pbsng {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kLinear = "pytorch_block_sparse_ng._C.linear";
constexpr size_t kIndexTensors = 8;  // layout.INDEX_NAMES + layout.ORDER_NAMES

// The kernels load 16 bytes at a time: contiguous, 16-byte aligned storage (as _ops._aligned).
at::Tensor aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  // Saved: x, data, then the eight index tensors.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& data,
                            const std::optional<at::Tensor>& bias, at::TensorList index) {
    const at::Tensor xa = aligned(x), da = aligned(data);
    std::optional<at::Tensor> b;
    if (bias.has_value() && bias->defined()) b = bias->contiguous();
    at::Tensor y = dsd(xa, da, b, index[0], index[1], index[2], index[3], index[4], index[5], index[6], index[7]);
    std::vector<at::Tensor> saved{xa, da};
    saved.insert(saved.end(), index.begin(), index.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["has_bias"] = b.has_value();
    return y;
  }

  // One gradient per forward argument: x, data, bias (undefined when there is none), the eight index tensors.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The kernels' outputs have no autograd history of their own: a graph of the backward would be wrong.
    PBSNG_CHECK_VALUE(!at::GradMode::is_enabled(), kLinear, ": double backward (create_graph=True) is not "
                      "supported by the block-sparse kernels");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& data = saved[1];
    const at::Tensor* idx = saved.data() + 2;
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const at::Tensor dy = aligned(grad_outputs[0]);
    // Edges exist for tensor arguments only: x 0, data 1, bias 2 when given.
    const bool want_x = ctx->needs_input_grad(0), want_data = ctx->needs_input_grad(1);
    const bool want_bias = has_bias && ctx->needs_input_grad(2);
    variable_list grads(3 + kIndexTensors);
    if (want_x) grads[0] = dds(dy, data, idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7]);
    if (want_data) {
      auto [grad_data, grad_bias] = sdd(dy, x, idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7],
                                        {data.size(1), data.size(2)}, want_bias);
      grads[1] = grad_data;
      if (want_bias) grads[2] = *grad_bias;
    } else if (want_bias) {
      grads[2] = dy.sum(0);
    }
    return grads;
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& bias,
                  const std::vector<at::Tensor>& index) {
  PBSNG_CHECK_VALUE(index.size() == kIndexTensors, kLinear, ": index must hold the ", kIndexTensors,
                    " index tensors of BlockSparseMatrix.indices(), got ", index.size());
  check_defined(x, kLinear, "x");
  check_defined(data, kLinear, "data");
  return LinearFunction::apply(x, data, bias, at::TensorList(index));
}

}  // namespace pbsng
