// MNIST and Fashion-MNIST from their IDX files (raw or .gz), decoded once and
// shared across processes through the memory-mapped cache (shared_cache.h).
//
// Fashion-MNIST is found in /usr/share/datasets/fashion-mnist by default,
// where Debian's `dataset-fashion-mnist` installs it. Each example is an input
// float32 (1, 28, 28) in [0, 1] (pixel / 255, as torchvision's ToTensor) and a
// target int64 class index in [0, 10). Normalize with transforms.h.
#pragma once

#include <string>

#include "data/dataset.h"

namespace kiln {

struct MnistOptions {
  std::string root;        // folder with the IDX files; empty: the data set's default folder
  bool train = true;       // train split (train-*) or test split (t10k-*)
  bool use_cache = true;   // decode once into a shared memory-mapped file (else private memory)
  std::string cache_dir;   // empty: default_cache_dir() (/dev/shm when present)
};

// The common reader of the MNIST family (same four file names, 10 classes).
class MnistFamily : public Dataset {
 public:
  static constexpr int64_t num_classes = 10;

  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  ExampleLayout layout() const override { return layout_; }
  void get_into(int64_t index, void* input, void* target) const override;
  // images uint8 (N, 1, H, W) scaled by 1/255, labels uint8 (N).
  std::optional<DenseData> dense() const override { return DenseData{images_, labels_, 1.0f / 255.0f}; }
  std::string name() const override { return name_; }

  const Tensor& images() const { return images_; }  // uint8 (N, 1, H, W)
  const Tensor& labels() const { return labels_; }  // uint8 (N)
  const std::string& root() const { return root_; }
  bool train() const { return train_; }
  // Whether the data is a shared mapping of the cache file (false: private memory).
  bool shared() const { return shared_; }
  const std::string& cache_path() const { return cache_path_; }

 protected:
  // Throws kiln::Error when the files are missing (saying how to get them) or
  // invalid (naming the file and the problem).
  MnistFamily(std::string name, const std::string& default_root, const std::string& install_hint,
              const MnistOptions& options);

 private:
  std::string name_, root_, cache_path_;
  bool train_ = true, shared_ = false;
  Tensor images_, labels_;
  ExampleLayout layout_;
};

class FashionMNIST : public MnistFamily {
 public:
  static constexpr const char* default_root = "/usr/share/datasets/fashion-mnist";
  explicit FashionMNIST(const MnistOptions& options = {});
  // "T-shirt/top", "Trouser", ... for class indices 0..9.
  static const char* class_name(int64_t index);
};

class MNIST : public MnistFamily {
 public:
  static constexpr const char* default_root = "/usr/share/datasets/mnist";
  explicit MNIST(const MnistOptions& options = {});
};

}  // namespace kiln
