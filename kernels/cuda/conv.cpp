// cuDNN convolutions (cuDNN 9 legacy API): forward, backward data, backward
// filter, backward bias.
//
// Invariants:
//  - One cudnnHandle_t per (thread, device), bound to the caller's stream on
//    every call and used with its device current (a DeviceGuard per call);
//    handles return to a pool when their thread exits (cuDNN
//    handles are costly to create and must not be shared by threads at once).
//  - Algorithms: cudnnGet*_v7 heuristics, cached per key; in benchmark mode
//    cudnnFind*AlgorithmEx once per key (it synchronizes), cached, counted.
//    The key holds every shape, the dtype, the layout, the operands'
//    alignment (up to 16 bytes), the device and the flags that restrict the
//    choice (deterministic, TF32).
//  - An algorithm cuDNN refuses at the call (its heuristics can rank one that
//    this layout, alignment or group count does not take) is replaced by the
//    next acceptable one that runs, which is cached instead, as PyTorch tries
//    them all; only when every one fails is it an error.
//  - float32 runs with CUDNN_FMA_MATH unless TF32 is allowed, so float32
//    results match the CPU to float32 tolerances; 16-bit types may use tensor
//    cores. An algorithm is used with the math type cuDNN reported for it.
//  - Workspace memory comes from the caller (stream-ordered caching allocator);
//    when the chosen algorithm's workspace cannot be allocated, the next
//    acceptable algorithm needing less is used (and cached) instead.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/graph.h"

namespace kiln::kernels {

namespace cudnn_conv {

cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  KILN_THROW("conv2d (cuda): expected float32, float64, float16 or bfloat16, got ", dtype_name(dtype));
}

const char* direction_name(Direction direction) {
  switch (direction) {
    case Direction::forward: return "conv2d forward (cuDNN)";
    case Direction::backward_data: return "conv2d backward data (cuDNN)";
    case Direction::backward_filter: return "conv2d backward filter (cuDNN)";
  }
  return "conv2d (cuDNN)";
}

}  // namespace cudnn_conv

namespace {

using cudnn_conv::Direction;
using cudnn_conv::Key;
using cudnn_conv::Operands;
using cudnn_conv::Scalars;
using cudnn_conv::kMaxWorkspaceBytes;
using cudnn_conv::alignment_of;
using cudnn_conv::data_type;
using cudnn_conv::direction_name;
using cudnn_conv::make_key;

// ---------------------------------------------------------------- handles

class HandlePool {
 public:
  static HandlePool& instance() {
    static HandlePool* pool = new HandlePool();  // never destroyed: handles outlive static teardown
    return *pool;
  }
  cudnnHandle_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[device];
      if (!free.empty()) {
        cudnnHandle_t handle = free.back();
        free.pop_back();
        return handle;
      }
    }
    cudnnHandle_t handle = nullptr;
    {
      cuda::DeviceGuard guard(device, "cudnnCreate");  // the handle belongs to the current device
      KILN_CUDNN_CHECK(cudnnCreate(&handle));
    }
    return handle;
  }
  void release(int device, cudnnHandle_t handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(handle);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudnnHandle_t>> free_;
};

// The calling thread's handles, one per device, returned to the pool at thread exit.
struct ThreadHandles {
  std::map<int, cudnnHandle_t> handles;
  ~ThreadHandles() {
    for (auto& [device, handle] : handles) HandlePool::instance().release(device, handle);
  }
};

cudnnHandle_t handle_for(int device, cuda::Stream stream) {
  thread_local ThreadHandles mine;
  auto it = mine.handles.find(device);
  if (it == mine.handles.end()) it = mine.handles.emplace(device, HandlePool::instance().acquire(device)).first;
  KILN_CUDNN_CHECK(cudnnSetStream(it->second, static_cast<cudaStream_t>(stream)));
  return it->second;
}

// ---------------------------------------------------------------- descriptors

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  Descriptors(const Conv2dParams& p, const ConvCudaConfig& config) {
    const cudnnDataType_t type = data_type(config.dtype);
    const cudnnTensorFormat_t format = config.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, type, dim(p.batch), dim(p.in_channels), dim(p.in_h),
                                                dim(p.in_w)));
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, format, type, dim(p.batch), dim(p.out_channels), dim(p.out_h),
                                                dim(p.out_w)));
    KILN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, type, format, dim(p.out_channels), dim(p.in_channels / p.groups),
                                                dim(p.kernel_h), dim(p.kernel_w)));
    const cudnnDataType_t compute = config.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, dim(p.pad_h), dim(p.pad_w), dim(p.stride_h),
                                                     dim(p.stride_w), dim(p.dilation_h), dim(p.dilation_w),
                                                     CUDNN_CROSS_CORRELATION, compute));
    KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, dim(p.groups)));
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, requested_math(config)));
  }
  ~Descriptors() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  static int dim(int64_t value) {
    KILN_CHECK(value <= INT32_MAX, "conv2d (cuda): size ", value, " exceeds cuDNN's int dimensions");
    return static_cast<int>(value);
  }
  static cudnnMathType_t requested_math(const ConvCudaConfig& config) {
    if (config.dtype == DType::f32) return config.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    if (config.dtype == DType::f64) return CUDNN_DEFAULT_MATH;
    return CUDNN_TENSOR_OP_MATH;
  }
};

// Whether an algorithm's math type keeps the requested precision.
bool math_allowed(cudnnMathType_t math, const ConvCudaConfig& config) {
  if (config.dtype != DType::f32) return true;
  if (math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;  // float32 through float16
  return config.allow_tf32 || math == CUDNN_FMA_MATH;
}

// ---------------------------------------------------------------- algorithm choice

struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

struct Candidate {
  int algo;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

struct AlgoCache {
  std::mutex mutex;
  std::map<Key, Choice> choices;
  CudnnConvCacheStats stats;
};
AlgoCache& algo_cache() {
  static AlgoCache* cache = new AlgoCache();
  return *cache;
}

void remember(const Key& key, const Choice& choice) {
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.choices[key] = choice;
  cache.stats.entries = cache.choices.size();
}

template <typename Perf>
Candidate to_candidate(const Perf& perf) {
  return {static_cast<int>(perf.algo), perf.status, perf.determinism, perf.mathType};
}

std::vector<Candidate> heuristic_candidates(Direction direction, cudnnHandle_t handle, const Descriptors& d) {
  std::vector<Candidate> out;
  int returned = 0;
  switch (direction) {
    case Direction::forward: {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.conv, d.y,
                                                              static_cast<int>(perf.size()), &returned, perf.data()));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
    case Direction::backward_data: {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          handle, d.w, d.y, d.conv, d.x, static_cast<int>(perf.size()), &returned, perf.data()));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
    case Direction::backward_filter: {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          handle, d.x, d.y, d.conv, d.w, static_cast<int>(perf.size()), &returned, perf.data()));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
  }
  return out;
}

// Workspace bytes of `algo`, or SIZE_MAX where cuDNN does not support it here.
size_t workspace_size(Direction direction, cudnnHandle_t handle, const Descriptors& d, int algo) {
  size_t bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  switch (direction) {
    case Direction::forward:
      status = cudnnGetConvolutionForwardWorkspaceSize(handle, d.x, d.w, d.conv, d.y,
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes);
      break;
    case Direction::backward_data:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w, d.y, d.conv, d.x,
                                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes);
      break;
    case Direction::backward_filter:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, d.x, d.y, d.conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes);
      break;
  }
  return status == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
}

// Candidates timed by cuDNN (fastest first); synchronizes.
std::vector<Candidate> find_candidates(Direction direction, cudnnHandle_t handle, const Descriptors& d,
                                       const Operands& ops, void* workspace, size_t workspace_bytes) {
  std::vector<Candidate> out;
  int returned = 0;
  switch (direction) {
    case Direction::forward: {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(handle, d.x, ops.x, d.w, ops.w, d.conv, d.y, ops.out,
                                                              static_cast<int>(perf.size()), &returned, perf.data(),
                                                              workspace, workspace_bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
    case Direction::backward_data: {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          handle, d.w, ops.w, d.y, ops.dy, d.conv, d.x, ops.out, static_cast<int>(perf.size()), &returned,
          perf.data(), workspace, workspace_bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
    case Direction::backward_filter: {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      KILN_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          handle, d.x, ops.x, d.y, ops.dy, d.conv, d.w, ops.out, static_cast<int>(perf.size()), &returned,
          perf.data(), workspace, workspace_bytes));
      for (int i = 0; i < returned; ++i) out.push_back(to_candidate(perf[i]));
      break;
    }
  }
  return out;
}

// Every acceptable algorithm of `ranked`, in preference order: first those
// whose math type keeps the precision, then the rest run with the requested
// math type (cuDNN ranked them under that setting). Each workspace size is
// queried under the math type the algorithm will run with: the size depends
// on it, and the descriptor's requested type can differ from the algorithm's
// (a 16-bit candidate reported with CUDNN_DEFAULT_MATH, say), which would size
// the workspace for another kernel than the one run.
std::vector<Choice> acceptable_choices(Direction direction, cudnnHandle_t handle, const Descriptors& d,
                                       const ConvCudaConfig& config, const std::vector<Candidate>& ranked) {
  auto acceptable = [&](const Candidate& c) {
    return c.status == CUDNN_STATUS_SUCCESS && (!config.deterministic || c.determinism == CUDNN_DETERMINISTIC);
  };
  std::vector<Choice> choices;
  for (int pass = 0; pass < 2; ++pass) {
    for (const Candidate& c : ranked) {
      if (!acceptable(c) || math_allowed(c.math, config) != (pass == 0)) continue;
      const cudnnMathType_t math = pass == 0 ? c.math : Descriptors::requested_math(config);
      KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math));
      const size_t bytes = workspace_size(direction, handle, d, c.algo);
      if (bytes != SIZE_MAX) choices.push_back({c.algo, math, bytes});
    }
  }
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, Descriptors::requested_math(config)));
  return choices;
}

Choice choose(Direction direction, cudnnHandle_t handle, const Descriptors& d, const Conv2dParams& p,
              const ConvCudaConfig& config, const Operands& ops, const WorkspaceAllocator& allocate) {
  const Key key = make_key(direction, p, config, ops);
  AlgoCache& cache = algo_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.choices.find(key);
    if (it != cache.choices.end()) {
      if (config.benchmark) ++cache.stats.hits;
      return it->second;
    }
  }
  std::vector<Candidate> heuristics = heuristic_candidates(direction, handle, d);
  std::vector<Candidate> ranked;
  if (config.benchmark) {
    // cudnnFind* times the algorithms (it synchronizes), which a CUDA graph capture cannot record: a
    // convolution first met inside a capture is refused (the Trainer's warm-up steps meet them eagerly).
    ::kiln::cuda::check_not_capturing(
        "cuDNN benchmark mode's search (legacy API) for a convolution not yet run eagerly");
    size_t find_bytes = 0;
    for (const Candidate& c : heuristics) {
      const size_t bytes = workspace_size(direction, handle, d, c.algo);
      if (bytes != SIZE_MAX && bytes <= kMaxWorkspaceBytes) find_bytes = std::max(find_bytes, bytes);
    }
    void* scratch = nullptr;
    try {
      scratch = find_bytes > 0 ? allocate(find_bytes) : nullptr;
    } catch (const OutOfMemoryError&) {
      find_bytes = 0;  // time only the algorithms that need no workspace
    }
    ranked = find_candidates(direction, handle, d, ops, scratch, find_bytes);
  } else {
    ranked = heuristics;
  }
  const std::vector<Choice> choices = acceptable_choices(direction, handle, d, config, ranked);
  KILN_CHECK(!choices.empty(), direction_name(direction), ": cuDNN offers no algorithm for this convolution (",
             config.deterministic ? "deterministic algorithms required, " : "", dtype_name(config.dtype),
             config.channels_last ? ", channels-last" : ", NCHW", ")");
  if (config.benchmark) {
    std::lock_guard<std::mutex> lock(cache.mutex);
    ++cache.stats.misses;
  }
  remember(key, choices.front());
  return choices.front();
}

// The chosen algorithm's workspace could not be allocated (the caching
// allocator already emptied its cache and retried): take the next acceptable
// algorithm that needs less, as PyTorch does, and cache it so later calls do
// not fail the same way. Empty when none fits.
std::optional<Choice> fall_back_for_workspace(Direction direction, cudnnHandle_t handle, const Descriptors& d,
                                              const Conv2dParams& p, const ConvCudaConfig& config,
                                              const Operands& ops, const Choice& failed,
                                              const WorkspaceAllocator& allocate, void*& workspace) {
  const std::vector<Choice> choices =
      acceptable_choices(direction, handle, d, config, heuristic_candidates(direction, handle, d));
  for (const Choice& choice : choices) {
    if (choice.workspace >= failed.workspace) continue;
    try {
      workspace = choice.workspace > 0 ? allocate(choice.workspace) : nullptr;
    } catch (const OutOfMemoryError&) {
      continue;
    }
    // Inside a capture the allocator cannot free its cached blocks first: a choice made for want of
    // memory there is used once, not remembered for the eager calls after it.
    if (!::kiln::cuda::capturing()) remember(make_key(direction, p, config, ops), choice);
    return choice;
  }
  return std::nullopt;
}

// One cuDNN call with `choice`; its status, not thrown.
cudnnStatus_t launch(Direction direction, cudnnHandle_t handle, const Descriptors& d, const ConvCudaConfig& config,
                     const Operands& ops, const Choice& choice, void* workspace) {
  KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, choice.math));
  const Scalars s(config.dtype);
  switch (direction) {
    case Direction::forward:
      return cudnnConvolutionForward(handle, s.one(), d.x, ops.x, d.w, ops.w, d.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), workspace, choice.workspace,
                                     s.zero(), d.y, ops.out);
    case Direction::backward_data:
      return cudnnConvolutionBackwardData(handle, s.one(), d.w, ops.w, d.y, ops.dy, d.conv,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), workspace,
                                          choice.workspace, s.zero(), d.x, ops.out);
    case Direction::backward_filter:
      return cudnnConvolutionBackwardFilter(handle, s.one(), d.x, ops.x, d.y, ops.dy, d.conv,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), workspace,
                                            choice.workspace, s.zero(), d.w, ops.out);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// cuDNN refused `failed` at the call: run the other acceptable algorithms in
// preference order and cache the first that succeeds. A refusal launches
// nothing, but a failed launch leaves an error behind for the next launch
// check to blame on another kernel: cleared after each failure.
void run_another(Direction direction, cudnnHandle_t handle, const Descriptors& d, const Conv2dParams& p,
                 const ConvCudaConfig& config, const Operands& ops, const Choice& failed, cudnnStatus_t status,
                 const WorkspaceAllocator& allocate) {
  (void)cudaGetLastError();
  int tried = 1;
  for (const Choice& other :
       acceptable_choices(direction, handle, d, config, heuristic_candidates(direction, handle, d))) {
    if (other.algo == failed.algo && other.math == failed.math) continue;
    void* workspace = nullptr;
    try {
      workspace = other.workspace > 0 ? allocate(other.workspace) : nullptr;
    } catch (const OutOfMemoryError&) {
      continue;
    }
    ++tried;
    if (launch(direction, handle, d, config, ops, other, workspace) == CUDNN_STATUS_SUCCESS) {
      remember(make_key(direction, p, config, ops), other);
      return;
    }
    (void)cudaGetLastError();
  }
  KILN_THROW(direction_name(direction), ": cuDNN refused algorithm ", failed.algo, " (",
             cudnnGetErrorString(status), ") and every other acceptable one, ", tried, " tried (",
             config.deterministic ? "deterministic algorithms required, " : "", dtype_name(config.dtype),
             config.channels_last ? ", channels-last" : ", NCHW", ", groups ", p.groups, ")");
}

void run(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config, const Operands& ops,
         const WorkspaceAllocator& allocate) {
  cudnnHandle_t handle = handle_for(config.device, config.stream);
  // The graph API, when chosen, runs the call unless no engine can (then the
  // legacy API does, and graph_cache_stats counts the fallback).
  if (config.graph_api && cudnn_conv::run_graph(direction, p, config, ops, handle, allocate).empty()) return;
  Descriptors d(p, config);
  Choice choice = choose(direction, handle, d, p, config, ops, allocate);
  void* workspace = nullptr;
  try {
    workspace = choice.workspace > 0 ? allocate(choice.workspace) : nullptr;
  } catch (const OutOfMemoryError&) {
    const std::optional<Choice> fallback =
        fall_back_for_workspace(direction, handle, d, p, config, ops, choice, allocate, workspace);
    if (!fallback) throw;
    choice = *fallback;
  }
  const cudnnStatus_t status = launch(direction, handle, d, config, ops, choice, workspace);
  if (status != CUDNN_STATUS_SUCCESS) run_another(direction, handle, d, p, config, ops, choice, status, allocate);
}

}  // namespace

void conv2d_forward_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* x, const void* weight,
                         void* y, const WorkspaceAllocator& workspace) {
  cuda::DeviceGuard guard(config.device, "conv2d (cuDNN)");  // cuDNN works on the current device
  run(Direction::forward, p, config, {x, weight, nullptr, y}, workspace);
}

void conv2d_backward_input_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* weight,
                                const void* dy, void* dx, const WorkspaceAllocator& workspace) {
  cuda::DeviceGuard guard(config.device, "conv2d backward (cuDNN)");
  run(Direction::backward_data, p, config, {nullptr, weight, dy, dx}, workspace);
}

void conv2d_backward_weight_cuda(const Conv2dParams& p, const ConvCudaConfig& config, const void* x, const void* dy,
                                 void* dweight, const WorkspaceAllocator& workspace) {
  cuda::DeviceGuard guard(config.device, "conv2d backward (cuDNN)");
  run(Direction::backward_filter, p, config, {x, nullptr, dy, dweight}, workspace);
}

CudnnConvCacheStats cudnn_conv_cache_stats() {
  const cudnn_conv::GraphCacheStats graph = cudnn_conv::graph_cache_stats();
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  CudnnConvCacheStats stats = cache.stats;
  stats.hits += graph.hits;
  stats.misses += graph.misses;
  stats.entries += graph.entries;
  stats.graph_entries = graph.entries;
  stats.graph_fallbacks = graph.fallbacks;
  return stats;
}

void cudnn_conv_cache_clear() {
  cudnn_conv::graph_cache_clear();
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.choices.clear();
  cache.stats = {};
}

std::string cudnn_graph_descriptors_check_for_testing(const Conv2dParams& p, const ConvCudaConfig& config,
                                                      int direction, int alignment) {
  KILN_CHECK(direction >= 0 && direction <= 2, "cudnn_graph_descriptors_check_for_testing: direction ", direction,
             " is not 0 (forward), 1 (backward data) or 2 (backward filter)");
  return cudnn_conv::check_graph_descriptors(static_cast<Direction>(direction), p, config, alignment);
}

int cudnn_conv_cache_put_refused_forward_for_testing(const Conv2dParams& p, const ConvCudaConfig& config) {
  KILN_CHECK(p.stride_h > 1 || p.stride_w > 1, "cudnn_conv_cache_put_refused_forward_for_testing: cuDNN's FFT "
             "forward takes stride 1; a stride above 1 is needed for a refusal");
  const Choice refused{static_cast<int>(CUDNN_CONVOLUTION_FWD_ALGO_FFT), Descriptors::requested_math(config), 0};
  remember(make_key(Direction::forward, p, config, Operands{}), refused);
  return refused.algo;
}

int cudnn_conv_cached_forward_algo_for_testing(const Conv2dParams& p, const ConvCudaConfig& config) {
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto it = cache.choices.find(make_key(Direction::forward, p, config, Operands{}));
  return it == cache.choices.end() ? -1 : it->second.algo;
}

}  // namespace kiln::kernels
