// Self-resetting kernel counters (counters.h): kept per stream in eager mode, owned by the graph under capture.

#include "counters.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "checks.h"

namespace pbsng {
namespace {

// A CUDA runtime call's error as an exception (checks.h's check_cuda checks a tensor's device instead).
void check_runtime_call(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, cat(what, " failed: ", cudaGetErrorString(err)));
}

// Eager: one set per (device, stream, count), zeroed by a memset node when first asked for (less host time than
// at::zeros' fill kernel). Never destroyed: tensors freed during static destruction could outlive the CUDA context.
int* kept_counters(const at::Tensor& like, cudaStream_t stream, int64_t count) {
  static std::mutex* mutex = new std::mutex();
  static auto* kept = new std::map<std::tuple<int, cudaStream_t, int64_t>, at::Tensor>();
  std::lock_guard<std::mutex> lock(*mutex);
  const auto key = std::make_tuple(int(like.device().index()), stream, count);
  auto found = kept->find(key);
  if (found == kept->end()) {
    at::Tensor counters = at::empty({count}, like.options().dtype(at::kInt));
    check_runtime_call(cudaMemsetAsync(counters.data_ptr(), 0, count * sizeof(int), stream), "zeroing kernel counters");
    found = kept->emplace(key, counters).first;
  }
  return found->second.data_ptr<int>();
}

// cudaMalloc and a stream synchronisation are refused while this thread (or, in global mode, any thread)
// captures; they are safe here because they touch no captured stream.
struct RelaxedCaptureMode {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode); }
};

// `ints` zeroed int32 of device memory of the current device, for the life of the process. Zeroed on a stream of
// its own and waited for: cudaMemset would go through the legacy stream, which a capture on a blocking stream
// forbids.
int* zeroed_device_ints(int64_t ints) {
  RelaxedCaptureMode relaxed;
  void* memory = nullptr;
  check_runtime_call(cudaMalloc(&memory, ints * sizeof(int)), "allocating kernel counters for a CUDA graph");
  cudaStream_t zeroing = nullptr;
  check_runtime_call(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking), "creating a stream to zero counters");
  cudaError_t err = cudaMemsetAsync(memory, 0, ints * sizeof(int), zeroing);
  if (err == cudaSuccess) err = cudaStreamSynchronize(zeroing);
  cudaStreamDestroy(zeroing);
  check_runtime_call(err, "zeroing kernel counters for a CUDA graph");
  return static_cast<int*>(memory);
}

// Graph-owned counters: slots of size classes (powers of two, at least 8 ints: 32-byte aligned), carved from
// zeroed slabs. A slot goes back to its free list when CUDA destroys the user object that ties it to its graph
// (after the graph, its executable graphs and their launches are gone); every launch left it zeroed.
class GraphCounterArena {
 public:
  static constexpr int64_t kSlabInts = int64_t(1) << 16;  // 256 KB

  int* take(int device, int64_t ints) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int*>& free = free_[{device, ints}];
    if (!free.empty()) {
      int* slot = free.back();
      free.pop_back();
      return slot;
    }
    auto& [next, left] = slab_[device];
    if (left < ints) {  // a new slab; what the old one has left stays unused
      const int64_t slab = std::max(kSlabInts, ints);
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      next = zeroed_device_ints(slab);
      left = slab;
    }
    int* slot = next;
    next += ints;
    left -= ints;
    return slot;
  }

  // Called from CUDA's destructor thread: host bookkeeping only, no CUDA call.
  void give_back(int device, int64_t ints, int* slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[{device, ints}].push_back(slot);
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, int64_t>, std::vector<int*>> free_;
  std::map<int, std::pair<int*, int64_t>> slab_;  // device -> (next free int of its slab, ints left)
};

GraphCounterArena& graph_counter_arena() {
  static auto* arena = new GraphCounterArena();  // never destroyed: graphs may outlive static destruction
  return *arena;
}

struct GraphSlot {
  int device;
  int64_t ints;
  int* slot;
};

void CUDART_CB release_graph_slot(void* held) {
  const GraphSlot* slot = static_cast<const GraphSlot*>(held);
  graph_counter_arena().give_back(slot->device, slot->ints, slot->slot);
  delete slot;
}

int* graph_counters(cudaGraph_t graph, int device, int64_t count) {
  int64_t ints = 8;
  while (ints < count) ints *= 2;
  auto* held = new GraphSlot{device, ints, graph_counter_arena().take(device, ints)};
  int* slot = held->slot;
  cudaUserObject_t owner = nullptr;
  cudaError_t err = cudaUserObjectCreate(&owner, held, release_graph_slot, 1, cudaUserObjectNoDestructorSync);
  if (err != cudaSuccess) {
    release_graph_slot(held);
    check_runtime_call(err, "tying kernel counters to the CUDA graph being captured");
  }
  err = cudaGraphRetainUserObject(graph, owner, 1, cudaGraphUserObjectMove);
  if (err != cudaSuccess) {
    cudaUserObjectRelease(owner, 1);  // its destructor gives the slot back
    check_runtime_call(err, "tying kernel counters to the CUDA graph being captured");
  }
  return slot;
}

}  // namespace

int* self_resetting_counters(const at::Tensor& like, cudaStream_t stream, int64_t count) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  check_runtime_call(cudaStreamGetCaptureInfo(stream, &capture, nullptr, &graph),
                     "querying the stream's capture status");
  if (capture == cudaStreamCaptureStatusNone) return kept_counters(like, stream, count);
  TORCH_CHECK(capture == cudaStreamCaptureStatusActive && graph != nullptr,
              "the CUDA graph capture of the current stream was invalidated before a block-sparse kernel launch");
  return graph_counters(graph, int(like.device().index()), count);
}

}  // namespace pbsng
