// The layer's eager autograd path: y = x W^T + bias as a C++ autograd function whose backward is dds (grad
// input) and sdd (grad of the kept blocks, with the bias sum fused where the kernel can).
//
// Why C++: the autograd engine runs a CUDA backward on its own device thread. A Python backward
// (functional.BlockSparseLinearFunction) must take the GIL there and go through Python frames, which on the
// H100 machine cost more host time per training step than the GPU spends at density 0.1-0.25
// (benchmarks/profile/host_step.py). This node's backward runs without the GIL.
// Traced code (torch.compile, export) keeps the Python Function over the custom ops of _ops.py.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
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

// The backward runs the dds on a second stream beside the sdd on the current one, forked and joined by events
// (so CUDA graphs capture both branches). The sdd is launched first and its grid takes the SMs; the dds is
// persistent and takes its tiles from a counter, so its CTAs fill the SMs that the sdd's waves leave idle.
// H100 A/B of the training step (benchmarks/results/ab_backward_overlap_*.txt, 8192 x 4096 -> 4096): blocks of 64
// at density 0.1 / 0.25 / 0.5 / 1.0 0.88 / 0.91 / 0.95 / 1.0x the one-stream time eager and 0.86 / 0.91 / 0.96 /
// 1.0x in a CUDA graph, blocks of 128 0.94-0.96x eager at 0.1-0.5 and 0.98-1.0x in a graph, blocks of 32
// 0.97-0.99x. The dds had to be the side branch: with the sdd on the side stream, eager steps queued ahead of
// the GPU ran the dds first (the current stream's next kernel is ready first) and took up to 1.1x the
// one-stream time. set_backward_overlap(false): one stream.
bool g_backward_overlap = true;

// The second stream of a (device, current stream): one per current stream, kept (its tile counter too).
c10::cuda::CUDAStream side_stream_for(const c10::cuda::CUDAStream& current) {
  static std::mutex* mutex = new std::mutex();  // never destroyed, like the streams
  static auto* kept = new std::map<std::pair<int, cudaStream_t>, c10::cuda::CUDAStream>();
  std::lock_guard<std::mutex> lock(*mutex);
  const auto key = std::make_pair(int(current.device_index()), current.stream());
  auto found = kept->find(key);
  if (found == kept->end()) {
    found = kept->emplace(key, c10::cuda::getStreamFromPool(false, current.device_index())).first;
  }
  return found->second;
}

// Records `event` on `from` and makes `to` wait for it. On a capturing stream this forks (or joins) the
// captured graph.
void record_then_wait(cudaEvent_t event, cudaStream_t from, cudaStream_t to) {
  cudaError_t err = cudaEventRecord(event, from);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(to, event, 0);
  TORCH_CHECK(err == cudaSuccess, cat(kLinear, ": ordering the backward's two streams failed: ",
                                      cudaGetErrorString(err)));
}

// Two events without timing (fork and join) per thread and device: an event must belong to the device of the
// streams it orders. (ATen's CUDAEvent header needs cuSPARSE's headers, which a build machine may lack.)
const std::pair<cudaEvent_t, cudaEvent_t>& fork_join_events(c10::DeviceIndex device) {
  thread_local std::map<c10::DeviceIndex, std::pair<cudaEvent_t, cudaEvent_t>> events;
  auto found = events.find(device);
  if (found == events.end()) {
    c10::cuda::CUDAGuard guard(device);
    std::pair<cudaEvent_t, cudaEvent_t> e;
    cudaError_t err = cudaEventCreateWithFlags(&e.first, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e.second, cudaEventDisableTiming);
    TORCH_CHECK(err == cudaSuccess, cat(kLinear, ": creating CUDA events failed: ", cudaGetErrorString(err)));
    found = events.emplace(device, e).first;
  }
  return found->second;
}

using Gradients = std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>>;

// The wanted gradients of y = x W^T + bias from dy (contiguous, 16-byte aligned): dx by the dds, the kept blocks'
// by the sdd, the bias's fused into the sdd (or dy.sum(0) alone). `idx` points at the eight index tensors.
Gradients gradients(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& data, const at::Tensor* idx,
                    bool want_x, bool want_data, bool want_bias) {
  Gradients grads;
  // Both gradients wanted: the dds on the side stream, forked from the current one here and joined below.
  std::optional<c10::cuda::CUDAStream> side;
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(dy.device().index());
  if (want_x && want_data && g_backward_overlap) {
    side = side_stream_for(current);
    record_then_wait(fork_join_events(current.device_index()).first, current.stream(), side->stream());
  }
  if (want_data) {  // first: its grid takes the SMs, the dds fills those its waves leave idle
    auto [grad_data, grad_bias] = sdd(dy, x, idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7],
                                      {data.size(1), data.size(2)}, want_bias);
    std::get<1>(grads) = grad_data;
    if (want_bias) std::get<2>(grads) = *grad_bias;
  } else if (want_bias) {
    std::get<2>(grads) = dy.sum(0);
  }
  // dx is allocated on the current stream, so the allocator reuses its memory in that stream's order (no
  // record_stream); dy and data come from it too, and it waits for the side stream below.
  if (want_x) {
    std::get<0>(grads) = dds_on(side, dy, data, idx[0], idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7]);
  }
  if (side.has_value()) {
    record_then_wait(fork_join_events(current.device_index()).second, side->stream(), current.stream());
  }
  return grads;
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
    // Edges exist for tensor arguments only: x 0, data 1, bias 2 when given.
    auto [grad_x, grad_data, grad_bias] =
        gradients(aligned(grad_outputs[0]), x, data, idx, ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                  has_bias && ctx->needs_input_grad(2));
    variable_list grads(3 + kIndexTensors);
    if (grad_x.has_value()) grads[0] = *grad_x;
    if (grad_data.has_value()) grads[1] = *grad_data;
    if (grad_bias.has_value()) grads[2] = *grad_bias;
    return grads;
  }
};

}  // namespace

bool set_backward_overlap(bool enabled) {
  return std::exchange(g_backward_overlap, enabled);
}

std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>, std::optional<at::Tensor>> linear_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& data, const std::vector<at::Tensor>& index,
    bool want_x, bool want_data, bool want_bias) {
  constexpr const char* kBackward = "pytorch_block_sparse_ng._C.linear_backward";
  PBSNG_CHECK_VALUE(index.size() == kIndexTensors, kBackward, ": index must hold the ", kIndexTensors,
                    " index tensors of BlockSparseMatrix.indices(), got ", index.size());
  check_defined(x, kBackward, "x");
  check_defined(data, kBackward, "data");
  // Before the streams fork on dy's device: the products check the rest.
  check_cuda(dy, kBackward, "dy");
  check_same_device(x, dy, kBackward, "x", "dy");
  check_same_device(data, dy, kBackward, "data", "dy");
  return gradients(aligned(dy), aligned(x), aligned(data), index.data(), want_x, want_data, want_bias);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& bias,
                  const std::vector<at::Tensor>& index) {
  PBSNG_CHECK_VALUE(index.size() == kIndexTensors, kLinear, ": index must hold the ", kIndexTensors,
                    " index tensors of BlockSparseMatrix.indices(), got ", index.size());
  check_defined(x, kLinear, "x");
  check_defined(data, kLinear, "data");
  return LinearFunction::apply(x, data, bias, at::TensorList(index));
}

}  // namespace pbsng
