// Real Fashion-MNIST (Debian's dataset-fashion-mnist), and the shared
// memory-mapped cache: reuse, rebuild on source change, atomic writes.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/shared_cache.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-cache-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path)) names.push_back(entry.path().filename());
    return names;
  }
};

bool fashion_installed() {
  return std::filesystem::exists(std::string(FashionMNIST::default_root) + "/train-images-idx3-ubyte.gz") ||
         std::filesystem::exists(std::string(FashionMNIST::default_root) + "/train-images-idx3-ubyte");
}

#define KILN_REQUIRE_FASHION_MNIST()                                                                   \
  do {                                                                                                 \
    if (!fashion_installed()) {                                                                        \
      MESSAGE("SKIPPED (Fashion-MNIST not installed: apt-get install dataset-fashion-mnist): "        \
              << doctest::getContextOptions()->currentTest->m_name);                                        \
      return;                                                                                          \
    }                                                                                                  \
  } while (0)

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A tiny MNIST-format folder: n images 3x3 with pixel value `pixel`, labels i % 10.
void write_tiny_mnist(const std::filesystem::path& root, uint8_t n, uint8_t pixel) {
  // Sized up front (GCC 12 warns falsely about inserting after a braced list).
  std::vector<uint8_t> images(16 + static_cast<size_t>(n) * 9, pixel);
  const uint8_t images_header[16] = {0, 0, 8, 3, 0, 0, 0, n, 0, 0, 0, 3, 0, 0, 0, 3};
  std::copy(images_header, images_header + 16, images.begin());
  std::vector<uint8_t> labels(8 + static_cast<size_t>(n));
  const uint8_t labels_header[8] = {0, 0, 8, 1, 0, 0, 0, n};
  std::copy(labels_header, labels_header + 8, labels.begin());
  for (uint8_t i = 0; i < n; ++i) labels[8 + i] = i % 10;
  write_bytes(root / "train-images-idx3-ubyte", images);
  write_bytes(root / "train-labels-idx1-ubyte", labels);
}

}  // namespace

TEST_CASE("fashion-mnist: real train and test splits load with the right shapes and labels") {
  KILN_REQUIRE_FASHION_MNIST();
  TempDir cache;
  FashionMNIST train(MnistOptions{.cache_dir = cache.path.string()});
  FashionMNIST test(MnistOptions{.train = false, .cache_dir = cache.path.string()});
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.layout().input.shape == Shape{1, 28, 28});
  CHECK(train.layout().input.dtype == DType::f32);
  CHECK(train.layout().target.shape == Shape{});
  CHECK(train.layout().target.dtype == DType::i64);
  CHECK(train.shared());
  for (const FashionMNIST* split : {&train, &test}) {
    std::vector<int64_t> per_class(10, 0);
    const uint8_t* labels = split->labels().data<uint8_t>();
    for (int64_t i = 0; i < split->size(); ++i) {
      REQUIRE(labels[i] < 10);
      ++per_class[labels[i]];
    }
    for (int64_t count : per_class) CHECK(count == split->size() / 10);  // Fashion-MNIST is balanced
  }
  Example example = train.get(0);
  CHECK(example.input.shape() == Shape{1, 28, 28});
  CHECK(example.target.item<int64_t>() == 9);  // the first training image is an ankle boot
  CHECK(std::string(FashionMNIST::class_name(9)) == "Ankle boot");
  auto pixels = example.input.to_vector<float>();
  CHECK(*std::min_element(pixels.begin(), pixels.end()) == 0.0f);
  CHECK(*std::max_element(pixels.begin(), pixels.end()) <= 1.0f);
  CHECK_THROWS_WITH_AS(train.get(60000), doctest::Contains("FashionMNIST: example index 60000 out of range"), Error);

  // The usual statistics of the training set.
  auto normalize = Normalize::fit(train);
  CHECK(normalize->mean()[0] == doctest::Approx(0.2860).epsilon(1e-3));
  CHECK(normalize->std()[0] == doctest::Approx(0.3530).epsilon(1e-3));

  // A normalized batch: (B, 1, 28, 28) float32 and int64 labels.
  DataLoader loader(std::make_shared<FashionMNIST>(MnistOptions{.train = false, .cache_dir = cache.path.string()}),
                    {.batch_size = 128, .transforms = {normalize}});
  auto batch = loader.next();
  CHECK(batch->input.shape() == Shape{128, 1, 28, 28});
  CHECK(batch->target.shape() == Shape{128});
  CHECK(loader.size() == 79);
}

TEST_CASE("shared cache: built once, then mapped by later loads (real data)") {
  KILN_REQUIRE_FASHION_MNIST();
  TempDir cache;
  FashionMNIST first(MnistOptions{.train = false, .cache_dir = cache.path.string()});
  REQUIRE(first.shared());
  struct stat before{};
  REQUIRE(stat(first.cache_path().c_str(), &before) == 0);
  FashionMNIST second(MnistOptions{.train = false, .cache_dir = cache.path.string()});
  CHECK(second.shared());
  CHECK(second.cache_path() == first.cache_path());
  struct stat after{};
  REQUIRE(stat(second.cache_path().c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);  // not rewritten
  CHECK(second.images().to_vector<uint8_t>() == first.images().to_vector<uint8_t>());
  // Decoding without the cache gives the same data.
  FashionMNIST private_copy(MnistOptions{.train = false, .use_cache = false});
  CHECK(!private_copy.shared());
  CHECK(private_copy.labels().to_vector<uint8_t>() == first.labels().to_vector<uint8_t>());
}

TEST_CASE("shared cache: rebuilt when the source changes; never left half-written") {
  TempDir root, cache;
  write_tiny_mnist(root.path, 4, 10);
  bool rebuilt = false;
  {
    MNIST data(MnistOptions{.root = root.path.string(), .cache_dir = cache.path.string()});
    CHECK(data.shared());
    CHECK(data.size() == 4);
    CHECK(data.images().data<uint8_t>()[0] == 10);
  }
  // Only the cache file and its lock: no temporary left behind.
  for (const std::string& name : cache.files()) CHECK(name.find(".tmp") == std::string::npos);
  CHECK(cache.files().size() == 2);

  // New contents (a new size and mtime): the cache follows.
  write_tiny_mnist(root.path, 6, 200);
  MNIST changed(MnistOptions{.root = root.path.string(), .cache_dir = cache.path.string()});
  CHECK(changed.size() == 6);
  CHECK(changed.images().data<uint8_t>()[0] == 200);
  CHECK(cache.files().size() == 2);  // replaced in place (rename), not accumulated

  // A corrupted cache file is rebuilt, not trusted.
  {
    std::ofstream clobber(changed.cache_path(), std::ios::binary | std::ios::trunc);
    clobber << "KILNSHM1 garbage";
  }
  MNIST repaired(MnistOptions{.root = root.path.string(), .cache_dir = cache.path.string()});
  CHECK(repaired.shared());
  CHECK(repaired.size() == 6);
  CHECK(repaired.images().data<uint8_t>()[8] == 200);

  // The generic API: key match maps, key change rebuilds.
  auto build = [] { return NamedTensors{{"x", tensor(std::vector<float>{1.0f, 2.0f}, {2})}}; };
  auto a = load_shared_cache("generic", "key-1", build, cache.path.string(), &rebuilt);
  CHECK(rebuilt);
  CHECK(a->mapped());
  CHECK(a->get("x").to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  auto b = load_shared_cache("generic", "key-1", build, cache.path.string(), &rebuilt);
  CHECK(!rebuilt);
  CHECK(b->get("x").to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  load_shared_cache("generic", "key-2", build, cache.path.string(), &rebuilt);
  CHECK(rebuilt);
  CHECK_THROWS_WITH_AS(b->get("y"), doctest::Contains("no array named 'y'"), Error);
  CHECK_THROWS_WITH_AS(load_shared_cache("bad/name", "k", build, cache.path.string()),
                       doctest::Contains("may hold only letters"), Error);
  // A folder that cannot be written: decoded privately instead.
  auto fallback = load_shared_cache("generic", "key-1", build, "/nonexistent/kiln-cache", &rebuilt);
  CHECK(rebuilt);
  CHECK(!fallback->mapped());
  CHECK(fallback->get("x").to_vector<float>() == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("shared cache: processes started together build once and all read the same data") {
  TempDir root, cache;
  write_tiny_mnist(root.path, 9, 77);
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int status = 1;
      try {
        MNIST data(MnistOptions{.root = root.path.string(), .cache_dir = cache.path.string()});
        status = (data.shared() && data.size() == 9 && data.images().data<uint8_t>()[80] == 77) ? 0 : 2;
      } catch (...) {
        status = 3;
      }
      _exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = -1;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  for (const std::string& name : cache.files()) CHECK(name.find(".tmp") == std::string::npos);
  CHECK(cache.files().size() == 2);
}
