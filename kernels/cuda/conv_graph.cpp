// cuDNN convolutions through the graph (backend) API: one convolution node per
// operation graph, engine configurations from heuristics mode A then the
// fallback list, an execution plan per configuration, cached per key and handle.
//
// Why a second way into cuDNN: on the H200 (session 19) kiln's legacy-API
// forward of the bf16 3x3 residual convolutions ran at 0.24-0.38x torch's,
// and torch 2.11 reaches cuDNN through this API, whose engine list includes
// kernels (Hopper's among them) that the legacy algorithm enums do not name.
// STATUS: ran on an H200 (b59d5ed): equal to the legacy API and the CPU on
// every [gpu] case, and faster in 16-bit (bench_conv_gpu, benchmark mode).
// Selected by set_cudnn_api (core/nn_ops.h): by default for float16 and
// bfloat16; float32 stays on the legacy API, whose search finds faster
// float32 algorithms than the engines this file's heuristics offer.
//
// Invariants:
//  - Numerics as the legacy path allows them (conv.cpp's math_allowed):
//    float32 without TF32 excludes tensor-core and down-converting engines;
//    every dtype excludes reduced-precision reductions (16-bit accumulation)
//    and engines compiled at run time (seconds of NVRTC in a training step);
//    deterministic mode excludes engines noted non-deterministic.
//  - Without benchmark mode the first configuration (heuristics' order) whose
//    plan builds and whose workspace can be allocated runs; in benchmark mode
//    each such plan is timed (CUDA events, synchronizing) and the fastest is
//    cached, as cudnnFind does for the legacy path. A call the graph API
//    cannot run launches nothing and says why; conv.cpp then runs the legacy
//    API and counts a fallback. A key for which no plan builds is remembered,
//    so its later calls skip the search.
//  - A plan holds its handle: the cache key includes it (kiln's handles are
//    per thread and device, so a plan is used by one thread at a time).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/conv_cudnn.h"
#include "kernels/cuda/graph.h"

namespace kiln::kernels::cudnn_conv {

namespace {

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  // Setting an attribute fails only for a kiln bug (a wrong type or count).
  void set(const char* what, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    const cudnnStatus_t status = cudnnBackendSetAttribute(d_, name, type, count, values);
    KILN_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN graph API: setting ", what, " failed: ",
               cudnnGetErrorString(status));
  }
  void set_descriptor(const char* what, cudnnBackendAttributeName_t name, const Descriptor& value) {
    cudnnBackendDescriptor_t raw = value.get();
    set(what, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  cudnnStatus_t finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

constexpr int64_t kX = 'x', kW = 'w', kY = 'y';  // unique ids of the graph's tensors

// A 4-D tensor in NCHW dimension order with the strides of the layout:
// NCHW contiguous, or NHWC (channels fastest), as kiln's tensors are.
std::unique_ptr<Descriptor> tensor(int64_t uid, std::array<int64_t, 4> dims, bool channels_last, DType dtype,
                                   int64_t alignment, std::string& error) {
  auto t = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const auto [n, c, h, w] = dims;
  const std::array<int64_t, 4> strides = channels_last ? std::array<int64_t, 4>{h * w * c, 1, w * c, c}
                                                       : std::array<int64_t, 4>{c * h * w, h * w, w, 1};
  const cudnnDataType_t type = data_type(dtype);
  t->set("tensor data type", CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  t->set("tensor dims", CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t->set("tensor strides", CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t->set("tensor uid", CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  t->set("tensor alignment", CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  const cudnnStatus_t status = t->finalize();
  if (status != CUDNN_STATUS_SUCCESS && error.empty()) {
    error = detail::concat("tensor '", static_cast<char>(uid), "' (", n, ", ", c, ", ", h, ", ", w,
                           channels_last ? ", NHWC" : ", NCHW", ") refused: ", cudnnGetErrorString(status));
  }
  return t;
}

// The backend's descriptor type and attribute names of one direction's operation.
struct OperationAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OperationAttributes operation_attributes(Direction direction) {
  switch (direction) {
    case Direction::forward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case Direction::backward_data:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case Direction::backward_filter:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// The descriptors of one convolution node, up to the operation; the graph,
// engine configuration and plan that were built from them keep them alive.
struct Node {
  std::unique_ptr<Descriptor> x, w, y, conv, op;
  std::string error;  // the first descriptor cuDNN refused, or ""
};

Node build_node(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config, int64_t alignment) {
  Node node;
  node.x = tensor(kX, {p.batch, p.in_channels, p.in_h, p.in_w}, config.channels_last, config.dtype, alignment,
                  node.error);
  node.w = tensor(kW, {p.out_channels, p.in_channels / p.groups, p.kernel_h, p.kernel_w}, config.channels_last,
                  config.dtype, alignment, node.error);
  node.y = tensor(kY, {p.batch, p.out_channels, p.out_h, p.out_w}, config.channels_last, config.dtype, alignment,
                  node.error);

  node.conv = std::make_unique<Descriptor>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const bool is_double = config.dtype == DType::f64;
  const cudnnDataType_t compute = is_double ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t pads[2] = {p.pad_h, p.pad_w}, strides[2] = {p.stride_h, p.stride_w},
                dilations[2] = {p.dilation_h, p.dilation_w};
  node.conv->set("compute type", CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  node.conv->set("mode", CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  node.conv->set("spatial dims", CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  node.conv->set("pre paddings", CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
  node.conv->set("post paddings", CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
  node.conv->set("strides", CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides);
  node.conv->set("dilations", CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations);
  if (const cudnnStatus_t status = node.conv->finalize(); status != CUDNN_STATUS_SUCCESS && node.error.empty()) {
    node.error = detail::concat("convolution descriptor refused: ", cudnnGetErrorString(status));
  }
  if (!node.error.empty()) return node;

  // alpha = 1, beta = 0: the output is written, not accumulated.
  const Scalars scalars(config.dtype);
  const cudnnBackendAttributeType_t scalar = scalars.is_double ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  // The graph's x, w and y are the operation's x, w, y (forward), dx, w, dy
  // (backward data) or x, dw, dy (backward filter).
  const OperationAttributes names = operation_attributes(direction);
  node.op = std::make_unique<Descriptor>(names.type);
  node.op->set_descriptor("operation x", names.x, *node.x);
  node.op->set_descriptor("operation w", names.w, *node.w);
  node.op->set_descriptor("operation y", names.y, *node.y);
  node.op->set_descriptor("operation convolution", names.conv, *node.conv);
  node.op->set("operation alpha", names.alpha, scalar, 1, scalars.one());
  node.op->set("operation beta", names.beta, scalar, 1, scalars.zero());
  if (const cudnnStatus_t status = node.op->finalize(); status != CUDNN_STATUS_SUCCESS) {
    node.error = detail::concat(direction_name(direction), " operation refused: ", cudnnGetErrorString(status));
  }
  return node;
}

// ---------------------------------------------------------------- engines

// Whether an engine's notes keep the numerics the caller asked for (above).
bool engine_allowed(const Descriptor& config_desc, const ConvCudaConfig& config) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t count = 0;
  cudnnBackendDescriptor_t raw = engine.get();
  if (cudnnBackendGetAttribute(config_desc.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &count, &raw) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> numerical{};
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  int64_t numerical_count = 0, behavior_count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(numerical.size()), &numerical_count,
                               numerical.data()) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               static_cast<int64_t>(behavior.size()), &behavior_count,
                               behavior.data()) != CUDNN_STATUS_SUCCESS) {
    return false;
  }
  for (int64_t i = 0; i < std::min<int64_t>(numerical_count, numerical.size()); ++i) {
    switch (numerical[i]) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return false;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (config.dtype == DType::f32 && !config.allow_tf32) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (config.deterministic) return false;
        break;
      default: break;
    }
  }
  for (int64_t i = 0; i < std::min<int64_t>(behavior_count, behavior.size()); ++i) {
    if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) return false;
  }
  return true;
}

// The engine configurations heuristics `mode` proposes, best first.
std::vector<std::unique_ptr<Descriptor>> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  std::vector<std::unique_ptr<Descriptor>> configs;
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set_descriptor("heuristics graph", CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heuristics.set("heuristics mode", CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heuristics.finalize() != CUDNN_STATUS_SUCCESS) return configs;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                               &count, nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0) {
    return configs;
  }
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(configs.back()->get());
  }
  int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &returned, raw.data()) != CUDNN_STATUS_SUCCESS) {
    configs.clear();
    return configs;
  }
  configs.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, count)));
  return configs;
}

// ---------------------------------------------------------------- plans

// A finalized execution plan and the engine configuration it was built from.
struct Plan {
  std::unique_ptr<Descriptor> config, plan;
  int64_t workspace = 0;
};

// The plans of one key: every one the heuristics propose and the numerics
// allow, in the heuristics' order, with the node and graph they were built
// from (which must outlive them).
struct Search {
  Node node;
  std::unique_ptr<Descriptor> graph;
  std::vector<std::unique_ptr<Plan>> plans;
  std::string why_none;  // when `plans` is empty
};

cudnnStatus_t execute(cudnnHandle_t handle, const Plan& plan, const Operands& ops, Direction direction,
                      void* workspace) {
  const void* x = direction == Direction::backward_data ? ops.out : ops.x;
  const void* w = direction == Direction::backward_filter ? ops.out : ops.w;
  const void* y = direction == Direction::forward ? ops.out : ops.dy;
  const int64_t uids[3] = {kX, kW, kY};
  void* pointers[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set("variant pack uids", CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set("variant pack pointers", CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
  pack.set("variant pack workspace", CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (const cudnnStatus_t status = pack.finalize(); status != CUDNN_STATUS_SUCCESS) return status;
  return cudnnBackendExecute(handle, plan.plan->get(), pack.get());
}

std::unique_ptr<Search> search(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config,
                               int64_t alignment, cudnnHandle_t handle) {
  auto s = std::make_unique<Search>();
  s->node = build_node(direction, p, config, alignment);
  if (!s->node.error.empty()) {
    s->why_none = s->node.error;
    return s;
  }
  s->graph = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t op = s->node.op->get();
  s->graph->set("graph ops", CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
  s->graph->set("graph handle", CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (const cudnnStatus_t status = s->graph->finalize(); status != CUDNN_STATUS_SUCCESS) {
    s->why_none = detail::concat("operation graph refused: ", cudnnGetErrorString(status));
    return s;
  }
  int proposed = 0, allowed = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (std::unique_ptr<Descriptor>& engine_config : engine_configs(*s->graph, mode)) {
      ++proposed;
      if (!engine_allowed(*engine_config, config)) continue;
      ++allowed;
      auto plan = std::make_unique<Plan>();
      plan->plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->plan->set("plan handle", CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      plan->plan->set_descriptor("plan engine config", CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *engine_config);
      if (plan->plan->finalize() != CUDNN_STATUS_SUCCESS) continue;
      int64_t count = 0;
      if (cudnnBackendGetAttribute(plan->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                   &count, &plan->workspace) != CUDNN_STATUS_SUCCESS ||
          plan->workspace < 0 || static_cast<size_t>(plan->workspace) > kMaxWorkspaceBytes) {
        continue;
      }
      plan->config = std::move(engine_config);
      s->plans.push_back(std::move(plan));
    }
  }
  if (s->plans.empty()) {
    s->why_none = detail::concat("no engine configuration built a plan (", proposed, " proposed, ", allowed,
                                 " with the requested numerics)");
  }
  return s;
}

// ---------------------------------------------------------------- cache

struct CacheKey {
  Key key;
  cudnnHandle_t handle;
  auto operator<=>(const CacheKey&) const = default;
};

struct Choice {
  std::shared_ptr<Search> search;  // keeps the plan's descriptors alive
  const Plan* plan;
};

struct Cache {
  std::mutex mutex;
  std::map<CacheKey, Choice> chosen;
  // Keys for which no plan could even be built (cuDNN refused the graph, or
  // every engine configuration): why, so that later calls go straight to the
  // legacy API instead of searching again. A search whose plans were built
  // but did not run (a workspace out of memory, say) is not remembered.
  std::map<CacheKey, std::string> unsupported;
  GraphCacheStats stats;
};
Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: plans hold handles that outlive static teardown
  return *c;
}

// Milliseconds of one execution of `plan` (the best of three after a warm-up),
// or a negative value when it fails. Synchronizes the stream.
float time_plan(cudnnHandle_t handle, const Plan& plan, const Operands& ops, Direction direction, void* workspace,
                cudaStream_t stream) {
  if (execute(handle, plan, ops, direction, workspace) != CUDNN_STATUS_SUCCESS) {
    (void)cudaGetLastError();
    return -1.0f;
  }
  struct Events {  // destroyed on every way out (a failed wait throws)
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
    }
  } events;
  KILN_CUDA_CHECK(cudaEventCreate(&events.start));
  KILN_CUDA_CHECK(cudaEventCreate(&events.stop));
  cudaEvent_t start = events.start, stop = events.stop;
  float best = -1.0f;
  for (int repeat = 0; repeat < 3; ++repeat) {
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    const cudnnStatus_t status = execute(handle, plan, ops, direction, workspace);
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (status != CUDNN_STATUS_SUCCESS) {
      (void)cudaGetLastError();
      best = -1.0f;
      break;
    }
    best = best < 0.0f ? ms : std::min(best, ms);
  }
  return best;
}

// Without benchmark mode: the first plan, in the heuristics' order, whose
// workspace can be allocated and that runs (it has then run: the output is written).
const Plan* first_that_runs(const Search& s, cudnnHandle_t handle, const Operands& ops, Direction direction,
                            const WorkspaceAllocator& allocate) {
  for (const std::unique_ptr<Plan>& plan : s.plans) {
    void* workspace = nullptr;
    try {
      workspace = plan->workspace > 0 ? allocate(static_cast<size_t>(plan->workspace)) : nullptr;
    } catch (const OutOfMemoryError&) {
      continue;  // one needing less may follow
    }
    if (execute(handle, *plan, ops, direction, workspace) == CUDNN_STATUS_SUCCESS) return plan.get();
    (void)cudaGetLastError();  // a refused launch leaves no error for the next kernel to be blamed for
  }
  return nullptr;
}

// Benchmark mode: every plan timed in one scratch buffer as large as the
// largest workspace (or, when that cannot be allocated, only the plans that
// need none); the fastest runs once more, so the output is its result.
const Plan* fastest(const Search& s, cudnnHandle_t handle, const Operands& ops, Direction direction,
                    const WorkspaceAllocator& allocate, cudaStream_t stream) {
  int64_t largest = 0;
  for (const std::unique_ptr<Plan>& plan : s.plans) largest = std::max(largest, plan->workspace);
  void* scratch = nullptr;
  try {
    scratch = largest > 0 ? allocate(static_cast<size_t>(largest)) : nullptr;
  } catch (const OutOfMemoryError&) {
    largest = 0;
  }
  const Plan* best = nullptr;
  float best_ms = 0.0f;
  for (const std::unique_ptr<Plan>& plan : s.plans) {
    if (plan->workspace > largest) continue;
    const float ms = time_plan(handle, *plan, ops, direction, scratch, stream);
    if (ms >= 0.0f && (best == nullptr || ms < best_ms)) {
      best = plan.get();
      best_ms = ms;
    }
  }
  if (best != nullptr) {
    KILN_CHECK(execute(handle, *best, ops, direction, scratch) == CUDNN_STATUS_SUCCESS, direction_name(direction),
               " (graph API): the fastest plan failed when run again");
  }
  return best;
}

}  // namespace

std::string run_graph(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config, const Operands& ops,
                      cudnnHandle_t handle, const WorkspaceAllocator& allocate) {
  Cache& c = cache();
  const CacheKey key{make_key(direction, p, config, ops), handle};
  const Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (const auto it = c.chosen.find(key); it != c.chosen.end()) {
      plan = it->second.plan;
      if (config.benchmark) ++c.stats.hits;
    } else if (const auto refused = c.unsupported.find(key); refused != c.unsupported.end()) {
      ++c.stats.fallbacks;
      return refused->second;
    }
  }
  if (plan != nullptr) {
    void* workspace = plan->workspace > 0 ? allocate(static_cast<size_t>(plan->workspace)) : nullptr;
    const cudnnStatus_t status = execute(handle, *plan, ops, direction, workspace);
    KILN_CHECK(status == CUDNN_STATUS_SUCCESS, direction_name(direction), " (graph API): the cached plan failed: ",
               cudnnGetErrorString(status));
    return "";
  }

  // Benchmark mode times the plans (it waits on events), which a CUDA graph capture cannot record:
  // a convolution first met inside a capture is refused (the Trainer's warm-up steps meet them eagerly).
  if (config.benchmark) {
    ::kiln::cuda::check_not_capturing(
        "cuDNN benchmark mode's search (graph API) for a convolution not yet run eagerly");
  }
  std::shared_ptr<Search> s = search(direction, p, config, alignment_of(ops), handle);
  const Plan* chosen = config.benchmark
                           ? fastest(*s, handle, ops, direction, allocate, static_cast<cudaStream_t>(config.stream))
                           : first_that_runs(*s, handle, ops, direction, allocate);
  std::lock_guard<std::mutex> lock(c.mutex);
  if (chosen == nullptr) {
    ++c.stats.fallbacks;
    // Not remembered from inside a capture: what failed there may run eagerly (the plan stays in
    // `chosen` otherwise: the captured graph launches its kernels).
    if (s->plans.empty() && !::kiln::cuda::capturing()) c.unsupported[key] = s->why_none;
    return s->why_none.empty() ? detail::concat(s->plans.size(), " plans built, none ran") : s->why_none;
  }
  if (config.benchmark) ++c.stats.misses;
  c.chosen[key] = {s, chosen};
  c.stats.entries = c.chosen.size();
  return "";
}

GraphCacheStats graph_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void graph_cache_clear() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.chosen.clear();
  c.unsupported.clear();
  c.stats = {};
}

std::string check_graph_descriptors(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config,
                                    int alignment) {
  return build_node(direction, p, config, alignment).error;
}

}  // namespace kiln::kernels::cudnn_conv
