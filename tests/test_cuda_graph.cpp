// kiln::cuda::Graph (core/cuda_graph.h): capture, replay, the graph's memory
// pool, and what a capture refuses.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <stdexcept>
#include <thread>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/cuda_graph.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

TEST_CASE("cuda::Graph without a GPU fails clearly") {
  if (cuda::is_available()) return;  // the [gpu] cases below cover a GPU
  CHECK(error_of([] { cuda::Graph graph; }).find("cuda::Graph: no CUDA device is available") != std::string::npos);
  CHECK_FALSE(cuda::capturing());
  CHECK_NOTHROW(cuda::check_not_capturing("anything"));
}

TEST_CASE("a generator inside a graph counts draws from 0 against the graph's replay state, and the host state stays") {
  Generator generator(99);
  generator.set_state({99, 40});
  philox::ReplayState slot{};
  generator.begin_graph(&slot);
  const GeneratorState first = generator.advance(5), second = generator.advance(3);
  CHECK(first.replay == &slot);
  CHECK(first.offset == 0);
  CHECK(second.offset == 5);
  CHECK(generator.end_graph() == 8);
  CHECK(generator.state().offset == 40);  // the captured draws reserved nothing yet
  const GeneratorState eager = generator.advance(2);
  CHECK(eager.replay == nullptr);
  CHECK(eager.offset == 40);
}

TEST_CASE("a generator's state in a graph is the graph's: set_state repeats draws, end_graph counts the most reached") {
  Generator generator(7);
  generator.set_state({7, 100});
  philox::ReplayState slot{};
  generator.begin_graph(&slot);
  (void)generator.advance(4);
  const GeneratorState saved = generator.state();
  CHECK(saved.replay == &slot);
  CHECK(saved.offset == 4);
  (void)generator.advance(6);           // a forward's draws, say
  generator.set_state(saved);           // a recompute goes back to them
  CHECK(generator.advance(6).offset == 4);
  CHECK(generator.state().offset == 10);
  generator.set_state(saved);           // left behind the most reached
  // Another thread draws from the host state, not the graph's.
  GeneratorState other;
  std::thread([&] { other = generator.advance(2); }).join();
  CHECK(other.replay == nullptr);
  CHECK(other.offset == 100);
  CHECK(error_of([&] { generator.set_state({7, 3}); }).find("cannot be set inside its capture") != std::string::npos);
  CHECK(generator.end_graph() == 10);  // one replay reserves every counter a draw used
  CHECK(error_of([&] { generator.set_state(saved); }).find("cannot be set outside it") != std::string::npos);
  CHECK(generator.state().offset == 102);
}

TEST_CASE("activation checkpointing inside a graph's capture recomputes the forward's dropout mask") {
  // On the CPU generator, as a capture puts the CUDA one: draws relative to a replay state.
  const Tensor x = ones({2000});
  Generator& generator = default_generator(Device::cpu());
  const GeneratorState before = generator.state();
  philox::ReplayState slot{};
  generator.begin_graph(&slot);
  Tensor leaf = x.detach().requires_grad_();
  const Tensor y = nn::checkpoint([](const std::vector<Tensor>& in) { return dropout(mul(in[0], 3.0), 0.5); }, {leaf});
  sum(y).backward();
  (void)generator.end_graph();
  generator.set_state(before);
  // dy/dx = 3 * mask * 2 where the forward kept the element: the recompute's mask must be the forward's.
  const std::vector<float> kept = y.to_vector<float>(), grad = leaf.grad().to_vector<float>();
  int64_t mismatched = 0, zeros = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    mismatched += (kept[i] != 0.0f) != (grad[i] != 0.0f);
    zeros += kept[i] == 0.0f;
  }
  CHECK(mismatched == 0);
  CHECK(zeros > 800);
  CHECK(zeros < 1200);
}

TEST_CASE("cuda::Graph records a region once and replays it on new inputs, allocating nothing [gpu]") {
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = zeros({1000}, {.device = gpu});
  Tensor w = full({1000}, 2.0, {.device = gpu});
  (void)add(mul(x, w), 1.0);  // warm-up outside the capture (kernel loading)
  cuda::Graph graph;
  graph.capture_begin();
  CHECK(cuda::capturing());
  Tensor y = add(mul(x, w), 1.0);  // recorded, not run
  graph.capture_end();
  CHECK_FALSE(cuda::capturing());
  CHECK(graph.captured());
  CHECK(memory_stats(gpu).graph_pool_bytes > 0);
  const AllocatorStats before = memory_stats(gpu);
  for (double value : {1.0, 5.0, -3.0}) {
    x.copy_(full({1000}, value, {.device = gpu}));
    graph.replay();
    CHECK(y.cpu().to_vector<float>()[999] == static_cast<float>(2 * value + 1));
  }
  // The replays reuse the recorded memory; nothing new came from the device.
  CHECK(memory_stats(gpu).device_malloc_calls - before.device_malloc_calls <= 3);  // only the copies' sources
  CHECK(error_of([&] { graph.capture_begin(); }).find("reset() it first") != std::string::npos);
  graph.reset();
  CHECK_THROWS_AS(graph.replay(), Error);
}

TEST_CASE("cuda::Graph records zero fills and contiguous copies (cudaMemsetAsync, cudaMemcpyAsync) [gpu]") {
  // Both ask for their stream's device first; cudaStreamGetDevice is refused
  // during a capture (the first H200 run lost every 16-mixed graph to it).
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor source = zeros({256}, {.device = gpu});
  Tensor copied = full({256}, 7.0, {.device = gpu});
  Tensor cleared = full({256}, 7.0, {.device = gpu});
  cuda::Graph graph;
  graph.capture_begin();
  copied.copy_(source);  // same dtype, contiguous: one cudaMemcpyAsync
  cleared.fill_(0.0);    // all-zero bits: one cudaMemsetAsync
  graph.capture_end();
  REQUIRE(graph.captured());
  CHECK(copied.cpu().to_vector<float>()[0] == 7.0f);  // recorded, not run
  for (double value : {3.0, -1.5}) {
    source.fill_(value);
    cleared.fill_(9.0);
    graph.replay();
    CHECK(copied.cpu().to_vector<float>()[255] == static_cast<float>(value));
    CHECK(cleared.cpu().to_vector<float>()[255] == 0.0f);
  }
}

TEST_CASE("cuda::Graph refuses a host read inside the capture and names it [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = ones({10}, {.device = Device::cuda(0)});
  cuda::Graph graph;
  graph.capture_begin();
  const std::string message = error_of([&] { (void)sum(x).item<float>(); });
  CHECK(message.find("while this thread captures a CUDA graph") != std::string::npos);
  CHECK(error_of([&] { graph.capture_end(); }).find("abandoned: a device-to-host copy was refused") !=
        std::string::npos);
  CHECK_FALSE(graph.captured());
  CHECK_FALSE(cuda::capturing());
  CHECK(sum(x).item<float>() == 10.0f);  // the device works normally afterwards
}

TEST_CASE("a convolution first met inside a capture in cuDNN benchmark mode is refused, both APIs; eager runs after [gpu]") {
  KILN_REQUIRE_GPU();
  struct Restore {
    bool benchmark = cudnn_benchmark();
    CudnnApi api = cudnn_api();
    ~Restore() {
      set_cudnn_benchmark(benchmark);
      set_cudnn_api(api);
    }
  } restore;
  set_cudnn_benchmark(true);
  int64_t channels = 5;  // a new cache key for each API: benchmark mode must search
  for (CudnnApi api : {CudnnApi::legacy, CudnnApi::graph}) {
    INFO((api == CudnnApi::legacy ? "legacy API" : "graph API"));
    set_cudnn_api(api);
    const Tensor x = randn({2, channels, 12, 12}).to(DType::bf16).cuda();
    const Tensor w = randn({channels + 1, channels, 3, 3}).to(DType::bf16).cuda();
    ++channels;
    cuda::Graph graph;
    graph.capture_begin();
    const std::string message = error_of([&] { (void)conv2d(x, w, Tensor(), 1, 1); });
    CHECK(message.find("cuDNN benchmark mode's search") != std::string::npos);
    CHECK(message.find("while this thread captures a CUDA graph") != std::string::npos);
    CHECK(error_of([&] { graph.capture_end(); }).find("cuDNN benchmark mode's search") != std::string::npos);
    CHECK_FALSE(cuda::capturing());
    // Eagerly the same convolution is searched, timed and right.
    const Tensor expected = conv2d(x.cpu().to(DType::f32), w.cpu().to(DType::f32), Tensor(), 1, 1);
    KILN_CHECK_CLOSE(conv2d(x, w, Tensor(), 1, 1).cpu().to(DType::f32), expected, 2e-2, 5e-2);
  }
}

TEST_CASE("cuda::Graph refuses a copy from pinned host memory in the capture (a replay would read it again) [gpu]") {
  KILN_REQUIRE_GPU();
  const Tensor host = ones({256}).pin_memory();
  cuda::Graph graph;
  graph.capture_begin();
  const std::string message = error_of([&] { (void)host.to(Device::cuda(0), /*non_blocking=*/true); });
  CHECK(message.find("a host-to-device copy was called") != std::string::npos);
  CHECK(error_of([&] { graph.capture_end(); }).find("a host-to-device copy was refused") != std::string::npos);
  CHECK(sum(host.to(Device::cuda(0), true)).item<float>() == 256.0f);
}

TEST_CASE("cuda::Graph destroyed inside its capture (an exception) leaves the thread on its own stream again [gpu]") {
  KILN_REQUIRE_GPU();
  const cuda::Stream before = cuda::current_stream(0);
  try {
    cuda::Graph graph;
    graph.capture_begin();
    (void)add(ones({16}, {.device = Device::cuda(0)}), 1.0);
    throw std::runtime_error("unwinding through the captured region");
  } catch (const std::runtime_error&) {
  }
  CHECK_FALSE(cuda::capturing());
  CHECK(cuda::current_stream(0) == before);
  CHECK(sum(ones({16}, {.device = Device::cuda(0)})).item<float>() == 16.0f);  // kernels run on a live stream
}

TEST_CASE("a graph's output freed while a second graph captures goes back to the device after that capture [gpu]") {
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = ones({4096}, {.device = gpu});
  (void)mul(x, 2.0);
  Tensor old_output;
  {
    cuda::Graph first;
    first.capture_begin();
    old_output = mul(x, 2.0);
    first.capture_end();
    first.replay();
  }  // the first graph is gone; its pool is released, its output still held
  cuda::Graph second;
  second.capture_begin();
  old_output = mul(x, 3.0);  // frees the first graph's block: inside a capture, nothing goes back to the device
  second.capture_end();
  second.replay();
  CHECK(old_output.cpu().to_vector<float>()[4095] == 3.0f);  // the second graph's output
  empty_cache(gpu);  // the first call outside the capture returns the deferred block
  CHECK(memory_stats(gpu).graph_pool_bytes > 0);  // the second graph's, still held
}

TEST_CASE("another thread allocating and freeing pinned memory during a capture leaves the capture intact [gpu]") {
  KILN_REQUIRE_GPU();
  // The Trainer's loader threads do this (pinned batch buffers) while the main thread captures a step.
  const Device gpu = Device::cuda(0);
  Tensor x = ones({1024}, {.device = gpu});
  (void)add(x, 1.0);
  cuda::Graph graph;
  graph.capture_begin();
  Tensor y = add(x, 1.0);
  std::thread([] {
    for (int i = 0; i < 4; ++i) {
      const Tensor pinned = ones({1 << 16}).pin_memory();  // cudaHostAlloc, then cudaFreeHost at scope end
      CHECK(pinned.is_pinned());
    }
  }).join();
  Tensor z = mul(y, 2.0);
  graph.capture_end();
  graph.replay();
  CHECK(z.cpu().to_vector<float>()[1023] == 4.0f);
}

TEST_CASE("dropout inside a graph draws new numbers at every replay, the ones eager dropout would draw [gpu]") {
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = ones({4096}, {.device = gpu});
  (void)dropout(x, 0.5);  // warm-up
  cuda::Graph graph;
  graph.capture_begin();
  Tensor y = dropout(x, 0.5);
  graph.capture_end();
  manual_seed(17);
  graph.replay();
  const std::vector<float> first = y.cpu().to_vector<float>();
  graph.replay();
  const std::vector<float> second = y.cpu().to_vector<float>();
  CHECK(first != second);
  manual_seed(17);
  CHECK(dropout(x, 0.5).cpu().to_vector<float>() == first);
  CHECK(dropout(x, 0.5).cpu().to_vector<float>() == second);
}

// Outside the Trainer, as bench_transformer --cuda-graph times GPT-2: a GPT
// step in bf16-mixed (fused attention with dropout, GELU, LayerNorm, the tied
// head's cross-entropy, AdamW with two parameter groups) captured once and
// replayed gives the eager steps' losses and parameters, bit for bit.
TEST_CASE("cuda::Graph replays a small GPT's bf16-mixed AdamW step: 4 replays equal 4 eager steps bit for bit [gpu]") {
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  nn::GPTConfig config;
  config.vocab_size = 64;
  config.block_size = 32;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 64;
  config.dropout = 0.1;
  struct Result {
    std::vector<float> losses;
    std::vector<Tensor> parameters;
  };
  auto run = [&](bool graphed) {
    manual_seed(7);
    auto model = std::make_shared<nn::GPT>(config);
    model->to(gpu);
    const Tensor tokens = randint(0, config.vocab_size, {4, config.block_size + 1}).to(gpu);
    const Tensor inputs = tokens.narrow(1, 0, config.block_size).contiguous();
    const Tensor targets = tokens.narrow(1, 1, config.block_size).contiguous();
    optim::AdamWOptions options;
    options.lr = 1e-3;
    options.weight_decay = 0.1;
    std::vector<optim::ParamGroup> groups(2);
    groups[0].params = model->decay_parameters();
    groups[1].params = model->no_decay_parameters();
    groups[1].weight_decay = 0.0;
    optim::AdamW optimizer(groups, options);
    auto step = [&] {
      Tensor loss;
      {
        AutocastGuard autocast(DeviceType::cuda, DType::bf16);
        loss = model->loss(model->forward(inputs), targets);
      }
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      return loss;
    };
    (void)step();  // eager: creates the optimizer's state
    Result result;
    if (graphed) {
      cuda::Graph graph;
      graph.capture_begin();
      const Tensor loss = step();
      graph.capture_end();
      for (int i = 0; i < 4; ++i) {
        graph.replay();
        result.losses.push_back(loss.item<float>());
      }
    } else {
      for (int i = 0; i < 4; ++i) result.losses.push_back(step().item<float>());
    }
    for (const Tensor& parameter : model->parameters()) result.parameters.push_back(parameter.detach().cpu());
    return result;
  };
  const Result eager = run(false), graphed = run(true);
  CHECK(graphed.losses == eager.losses);
  CHECK(eager.losses.front() != eager.losses.back());  // the steps trained
  REQUIRE(graphed.parameters.size() == eager.parameters.size());
  for (size_t i = 0; i < eager.parameters.size(); ++i) {
    CAPTURE(i);
    const std::vector<float> got = graphed.parameters[i].to_vector<float>();
    const std::vector<float> want = eager.parameters[i].to_vector<float>();
    REQUIRE(got.size() == want.size());
    int64_t differing = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      differing += std::bit_cast<uint32_t>(got[k]) != std::bit_cast<uint32_t>(want[k]);
    }
    CHECK(differing == 0);
  }
}

}  // namespace kiln::testing
