// kiln::cuda::Graph (core/cuda_graph.h): capture, replay, the graph's memory
// pool, and what a capture refuses.
#include <doctest/doctest.h>

#include "core/allocator.h"
#include "core/cuda_graph.h"
#include "core/generator.h"
#include "core/ops.h"
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

}  // namespace kiln::testing
