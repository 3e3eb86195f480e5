#include "data/fashion_mnist.h"

#include <cctype>
#include <filesystem>

#include "data/idx.h"
#include "data/shared_cache.h"

namespace kiln {

namespace {

// The file `stem` in `root`, raw or gzip (raw first: it reads faster); empty when neither exists.
std::string find_file(const std::string& root, const std::string& stem) {
  for (const std::string& candidate : {root + "/" + stem, root + "/" + stem + ".gz"}) {
    std::error_code error;
    if (std::filesystem::is_regular_file(candidate, error)) return candidate;
  }
  return "";
}

NamedTensors decode(const std::string& images_path, const std::string& labels_path, int64_t num_classes) {
  Tensor images = read_idx(images_path, IdxRole::images);  // (N, H, W)
  Tensor labels = read_idx(labels_path, IdxRole::labels);  // (N)
  check_idx_images_labels(images, labels, num_classes, images_path, labels_path);
  return {{"images", images.view({images.size(0), 1, images.size(1), images.size(2)})}, {"labels", labels}};
}

}  // namespace

MnistFamily::MnistFamily(std::string name, const std::string& default_root, const std::string& install_hint,
                         const MnistOptions& options)
    : name_(std::move(name)), root_(options.root.empty() ? default_root : options.root), train_(options.train) {
  const std::string split = train_ ? "train" : "t10k";
  const std::string images_path = find_file(root_, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(root_, split + "-labels-idx1-ubyte");
  for (const auto& [path, stem] : {std::pair{images_path, split + "-images-idx3-ubyte"},
                                   std::pair{labels_path, split + "-labels-idx1-ubyte"}}) {
    KILN_CHECK(!path.empty(), name_, ": data set not found: no ", stem, " or ", stem, ".gz in ", root_, ". ",
               install_hint);
  }

  NamedTensors arrays;
  if (options.use_cache) {
    // One cache file per source folder and split; the key changes whenever a source file does.
    std::error_code error;
    const std::string folder = std::filesystem::weakly_canonical(root_, error).string();
    std::string file_name = name_ + "-" + split + "-" + hash_hex(folder);
    for (char& c : file_name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    }
    const std::string key = "mnist-family v1|" + file_key(images_path) + "|" + file_key(labels_path);
    auto cache = load_shared_cache(file_name, key, [&] { return decode(images_path, labels_path, num_classes); },
                                   options.cache_dir);
    images_ = cache->get("images");
    labels_ = cache->get("labels");
    shared_ = cache->mapped();
    cache_path_ = cache->path();
    // Cheap recheck of what a cache file from elsewhere could get wrong.
    KILN_CHECK(images_.dtype() == DType::u8 && images_.dim() == 4 && images_.size(1) == 1, cache_path_,
               ": unexpected images array ", shape_str(images_.shape()), " (delete the file to rebuild it)");
    check_idx_images_labels(images_, labels_, num_classes, cache_path_, cache_path_);
  } else {
    arrays = decode(images_path, labels_path, num_classes);
    images_ = arrays[0].second;
    labels_ = arrays[1].second;
  }
  layout_.input = {{1, images_.size(2), images_.size(3)}, DType::f32};
  layout_.target = {{}, DType::i64};
}

Example MnistFamily::get(int64_t index) const {
  Example example{empty(layout_.input.shape), empty(layout_.target.shape, {.dtype = DType::i64})};
  get_into(index, example.input.data_ptr(), example.target.data_ptr());
  return example;
}

void MnistFamily::get_into(int64_t index, void* input, void* target) const {
  check_example_index(*this, index);
  const int64_t pixels = layout_.input.numel();
  const uint8_t* source = images_.data<uint8_t>() + index * pixels;
  auto* out = static_cast<float*>(input);
  constexpr float scale = 1.0f / 255.0f;
  for (int64_t i = 0; i < pixels; ++i) out[i] = static_cast<float>(source[i]) * scale;
  *static_cast<int64_t*>(target) = labels_.data<uint8_t>()[index];
}

FashionMNIST::FashionMNIST(const MnistOptions& options)
    : MnistFamily("FashionMNIST", default_root,
                  "Install it with `apt-get install dataset-fashion-mnist` (Debian), or pass the folder that "
                  "holds the IDX files as MnistOptions::root.",
                  options) {}

const char* FashionMNIST::class_name(int64_t index) {
  static const char* names[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  KILN_CHECK(index >= 0 && index < num_classes, "FashionMNIST::class_name: class index ", index,
             " out of range [0, 10)");
  return names[index];
}

MNIST::MNIST(const MnistOptions& options)
    : MnistFamily("MNIST", default_root,
                  "Put the four IDX files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                  "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) there, or pass their folder as "
                  "MnistOptions::root.",
                  options) {}

}  // namespace kiln
