// Counters that a kernel finds zeroed at its start and leaves zeroed at its end (the Hopper dsd / dds tile
// counter, the sdd's piece and tail counters, the one-block sdd's row counters, the split SM80 dsd's tile
// counters): no memset per call, in eager mode or in a CUDA graph.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

namespace pbsng {

// `count` zeroed int32 counters on `like`'s device for a kernel launched on `stream`; the kernel must leave them
// zeroed. Eager: one set per (device, stream, count), kept for the process. While `stream` is captured into a CUDA
// graph: a set of the graph's own, zeroed once and held until the graph (and every executable graph made from it)
// is destroyed. A memset node per launch instead cost ~3 us of each replay's critical path on an H100
// (benchmarks/results/graph_memset_node_*.txt). One executable graph never runs concurrently with itself, so its
// launches cannot race on their counters; a graph cloned with cudaGraphClone would share them.
int* self_resetting_counters(const at::Tensor& like, cudaStream_t stream, int64_t count);

}  // namespace pbsng
