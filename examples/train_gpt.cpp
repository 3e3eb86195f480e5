// train_gpt: trains a GPT (nn::GPT, nanoGPT's shape) with kiln's Trainer.
//   train_gpt                        a task whose result is checked exactly:
//                                    D-digit addition ("123+456=" then the
//                                    sum's digits, least significant first),
//                                    reported as the share of exactly right
//                                    answers on problems never trained on
//   train_gpt --data FILE --sample N a character-level (byte) language model
//                                    of FILE, then N sampled bytes
//   train_gpt --model gpt2-124m      GPT-2 124M's shapes (vocabulary 50257,
//                                    context 1024) on random tokens: tokens/s
//                                    and model FLOP utilization
// Every Trainer flag of train_fashion applies (--max-steps, --precision, ...).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "examples/trainer_flags.h"
#include "kernels/cuda/runtime.h"
#include "nn/models.h"
#include "optim/lr_scheduler.h"
#include "trainer/trainer.h"

using namespace kiln;

namespace {

struct Recipe {
  std::string model = "small";  // small (the task and text default), or a GPT-2 name
  std::string data;             // a text file; empty: the addition task
  int64_t sample = 0;
  std::string prompt;
  int64_t digits = 3;
  int64_t batch_size = 64;
  int64_t block_size = 0;  // 0: the task's length, 128 for text, 1024 for GPT-2
  int64_t n_layer = 4, n_head = 4, n_embd = 128;
  double lr = 3e-3;
  double weight_decay = 0.1;
  double dropout = 0.0;
  int64_t train_examples = 200000;
  int num_workers = 1;
};

// ---------------------------------------------------------------- the addition task
// "aaa+bbb=" then the D+1 digits of the sum, least significant first (the
// order in which a carry is computed). Targets are -1 (ignored) except on
// the answer, so the model learns only to add.
struct Addition {
  int64_t digits;
  int64_t length() const { return 3 * digits + 3; }  // prompt 2D + 2, answer D + 1
  int64_t prompt_length() const { return 2 * digits + 2; }
  // 1 in 10 problems is never trained on: the held-out set, chosen by a
  // mixing hash so that it does not correlate with any digit of a, b or the
  // sum (a linear rule such as (7919 a + 104729 b) % 10 held out every sum
  // ending in 7, a digit the model then never learned to write).
  static bool held_out(int64_t a, int64_t b) {
    uint64_t z = static_cast<uint64_t>(a) * 1000003u + static_cast<uint64_t>(b) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finalizer
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) % 10 == 0;
  }
  std::string text(int64_t a, int64_t b) const {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%0*lld+%0*lld=", static_cast<int>(digits), static_cast<long long>(a),
                  static_cast<int>(digits), static_cast<long long>(b));
    std::string s = buffer;
    int64_t sum = a + b;
    for (int64_t d = 0; d <= digits; ++d, sum /= 10) s += static_cast<char>('0' + sum % 10);
    return s;
  }
  // (count, length) whole problems drawn at random from one side of the split.
  Tensor problems(int64_t count, bool held, uint64_t seed) const {
    std::mt19937_64 engine(seed);
    int64_t limit = 1;
    for (int64_t d = 0; d < digits; ++d) limit *= 10;
    std::uniform_int_distribution<int64_t> number(0, limit - 1);
    std::vector<int64_t> tokens;
    tokens.reserve(static_cast<size_t>(count * length()));
    for (int64_t n = 0; n < count;) {
      const int64_t a = number(engine), b = number(engine);
      if (held_out(a, b) != held) continue;
      for (char c : text(a, b)) tokens.push_back(static_cast<unsigned char>(c));
      ++n;
    }
    return tensor<int64_t>(tokens, {count, length()});
  }
  // Inputs (all but the last token) and targets (the next token on the
  // answer, -1 on the prompt) of whole problems.
  std::pair<Tensor, Tensor> examples(const Tensor& whole) const {
    const int64_t T = length() - 1;
    Tensor targets = whole.narrow(1, 1, T).contiguous();
    targets.narrow(1, 0, prompt_length() - 1).fill_(-1.0);
    return {whole.narrow(1, 0, T).contiguous(), targets};
  }
};

// The share of held-out problems whose D + 1 answer digits the model writes
// exactly, greedily, from the prompt alone.
double addition_accuracy(nn::GPT& gpt, const Addition& task, const Tensor& problems, Device device) {
  const int64_t count = problems.size(0), answer = task.digits + 1;
  const Tensor prompts = problems.narrow(1, 0, task.prompt_length()).to(device);
  const Tensor written =
      gpt.generate(prompts, answer, 1.0, /*top_k=*/1).narrow(1, task.prompt_length(), answer).cpu().contiguous();
  const Tensor expected = problems.narrow(1, task.prompt_length(), answer).contiguous();

  // A problem is right when all of its answer digits are.
  const Tensor right = eq(sum(cast(eq(written, expected), DType::i64), {1}), static_cast<double>(answer));
  return static_cast<double>(sum(cast(right, DType::i64)).item<int64_t>()) / static_cast<double>(count);
}

// ---------------------------------------------------------------- text
// Windows of block_size + 1 bytes at every offset of the file: input the
// first block_size, target the last (shifted by one).
class TextWindows : public Dataset {
 public:
  TextWindows(std::vector<uint8_t> bytes, int64_t block_size) : bytes_(std::move(bytes)), block_size_(block_size) {
    KILN_CHECK(static_cast<int64_t>(bytes_.size()) > block_size_ + 1, "--data: the file has ", bytes_.size(),
               " bytes, fewer than one window of ", block_size_ + 1);
  }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()) - block_size_ - 1; }
  Example get(int64_t index) const override {
    check_example_index(*this, index);
    std::vector<int64_t> input(bytes_.begin() + index, bytes_.begin() + index + block_size_);
    std::vector<int64_t> target(bytes_.begin() + index + 1, bytes_.begin() + index + block_size_ + 1);
    return {tensor<int64_t>(input, {block_size_}), tensor<int64_t>(target, {block_size_})};
  }
  ExampleLayout layout() const override {
    return {{{block_size_}, DType::i64}, {{block_size_}, DType::i64}};
  }
  std::string name() const override { return "TextWindows"; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
  int64_t block_size_;
};

// ---------------------------------------------------------------- the module
class LanguageModel : public TrainModule {
 public:
  LanguageModel(std::shared_ptr<nn::GPT> gpt, const Recipe& recipe, int64_t total_steps)
      : gpt_(std::move(gpt)), recipe_(recipe), total_steps_(total_steps) {}
  nn::Module& model() override { return *gpt_; }

  Tensor training_step(const Batch& batch, int64_t) override {
    Tensor loss = gpt_->loss(gpt_->forward(batch.input), batch.target);
    log("train_loss", loss, std::nullopt, std::nullopt, /*prog_bar=*/true, batch.size());
    tokens_ += batch.input.numel();
    return loss;
  }
  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", gpt_->loss(gpt_->forward(batch.input), batch.target), false, true, true, batch.size());
  }
  // nanoGPT's recipe: AdamW (0.9, 0.95) with weight decay on matrices and
  // embeddings only, linear warm-up then cosine decay to a tenth.
  OptimizerConfigs configure_optimizers() override {
    std::vector<optim::ParamGroup> groups(2);
    groups[0].params = gpt_->decay_parameters();
    groups[0].weight_decay = recipe_.weight_decay;
    groups[1].params = gpt_->no_decay_parameters();
    groups[1].weight_decay = 0.0;
    optim::AdamWOptions adamw;
    adamw.lr = recipe_.lr;
    adamw.beta2 = 0.95;
    auto optimizer = std::make_unique<optim::AdamW>(groups, adamw);
    optim::OneCycleLROptions schedule;
    schedule.max_lr = {recipe_.lr};
    schedule.total_steps = std::max<int64_t>(total_steps_, 1);
    schedule.pct_start = 0.05;
    schedule.div_factor = 10;
    schedule.final_div_factor = 1;
    schedule.cycle_momentum = false;
    OptimizerConfig config;
    config.scheduler = std::make_unique<optim::OneCycleLR>(*optimizer, schedule);
    config.optimizer = std::move(optimizer);
    return config;
  }
  int64_t tokens() const { return tokens_; }

 private:
  std::shared_ptr<nn::GPT> gpt_;
  Recipe recipe_;
  int64_t total_steps_;
  int64_t tokens_ = 0;
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "--data: cannot open '", path, "'");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string as_text(const Tensor& tokens) {
  std::string text;
  for (int64_t t : tokens.contiguous().to_vector<int64_t>()) text += static_cast<char>(t);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT with kiln: exact addition, a byte-level language model of a file, or GPT-2 124M's step"};
  examples::TrainerFlags flags;
  TrainerOptions& trainer_options = flags.trainer;
  trainer_options.max_epochs = 1;
  trainer_options.max_steps = 2000;
  trainer_options.default_root_dir = "./runs";
  trainer_options.log_every_n_steps = 50;
  Recipe recipe;
  app.add_option("--model", recipe.model, "small (set by --n-layer/--n-head/--n-embd), or gpt2-124m, gpt2-medium, ...")
      ->capture_default_str();
  app.add_option("--data", recipe.data, "A text file to model byte by byte (default: the addition task)");
  app.add_option("--sample", recipe.sample, "Bytes to sample after training (with --data)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--prompt", recipe.prompt, "The start of the sample (default: the file's first bytes)");
  app.add_option("--digits", recipe.digits, "Digits of each addend in the addition task")
      ->capture_default_str()
      ->check(CLI::Range(1, 9));
  examples::add_trainer_flags(app, flags);
  examples::add_fit_flags(app, flags);
  app.add_option("--batch-size", recipe.batch_size, "Sequences per batch")->capture_default_str()->check(examples::kPositive);
  app.add_option("--block-size", recipe.block_size, "Context length (0: the task's, 128 for text, 1024 for GPT-2)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--n-layer", recipe.n_layer, "Blocks (small model)")->capture_default_str()->check(examples::kPositive);
  app.add_option("--n-head", recipe.n_head, "Attention heads (small model)")->capture_default_str()->check(examples::kPositive);
  app.add_option("--n-embd", recipe.n_embd, "Width (small model)")->capture_default_str()->check(examples::kPositive);
  app.add_option("--dropout", recipe.dropout, "Dropout")->capture_default_str()->check(examples::in_range(0.0, 0.99));
  app.add_option("--lr", recipe.lr, "Peak learning rate")->capture_default_str()->check(examples::kPositive);
  app.add_option("--weight-decay", recipe.weight_decay, "AdamW weight decay on matrices")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--train-examples", recipe.train_examples, "Addition problems to train on")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--num-workers", recipe.num_workers, "Data-loading worker threads")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "train_gpt: " << error.what() << " (see --help)\n";
    return 2;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    Trainer trainer(flags.options());
    const Device device = trainer.device();
    const bool gpt2 = recipe.model != "small";
    const bool text = !recipe.data.empty();
    KILN_CHECK(!(gpt2 && text), "--model ", recipe.model, " measures GPT-2's step on random tokens; drop --data");
    const Addition task{recipe.digits};
    nn::GPTConfig config;
    if (gpt2) {
      config = nn::GPTConfig::named(recipe.model);
      if (recipe.block_size > 0) config.block_size = recipe.block_size;
    } else {
      config.vocab_size = 256;  // bytes
      config.block_size = recipe.block_size > 0 ? recipe.block_size : text ? 128 : task.length() - 1;
      config.n_layer = recipe.n_layer;
      config.n_head = recipe.n_head;
      config.n_embd = recipe.n_embd;
    }
    config.dropout = recipe.dropout;
    manual_seed(flags.seed);
    auto gpt = std::make_shared<nn::GPT>(config);

    std::shared_ptr<Dataset> train_set, val_set;
    Tensor held_problems;
    if (gpt2) {
      // Random tokens: the step costs what it costs on real text.
      const int64_t sequences = recipe.batch_size * 8;
      Tensor tokens = randint(0, config.vocab_size, {sequences, config.block_size + 1});
      train_set = std::make_shared<TensorDataset>(tokens.narrow(1, 0, config.block_size).contiguous(),
                                                  tokens.narrow(1, 1, config.block_size).contiguous());
    } else if (text) {
      std::vector<uint8_t> bytes = read_file(recipe.data);
      const size_t split = bytes.size() * 9 / 10;  // the last tenth validates
      std::vector<uint8_t> head(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(split));
      std::vector<uint8_t> tail(bytes.begin() + static_cast<std::ptrdiff_t>(split), bytes.end());
      train_set = std::make_shared<TextWindows>(std::move(head), config.block_size);
      if (static_cast<int64_t>(tail.size()) > config.block_size + 1) {
        val_set = std::make_shared<TextWindows>(std::move(tail), config.block_size);
      }
    } else {
      auto [inputs, targets] = task.examples(task.problems(recipe.train_examples, /*held=*/false, flags.seed));
      train_set = std::make_shared<TensorDataset>(inputs, targets);
      held_problems = task.problems(2000, /*held=*/true, flags.seed + 1);
      auto [held, held_targets] = task.examples(held_problems);
      val_set = std::make_shared<TensorDataset>(held, held_targets);
    }
    DataLoaderOptions loader_options;
    loader_options.batch_size = recipe.batch_size;
    loader_options.shuffle = true;
    loader_options.seed = flags.seed;
    loader_options.num_workers = recipe.num_workers;
    loader_options.drop_last = true;
    DataLoader train_loader(train_set, loader_options);
    DataLoaderOptions val_options = loader_options;
    val_options.shuffle = false;
    val_options.drop_last = false;
    std::optional<DataLoader> val_loader;
    if (val_set) val_loader.emplace(val_set, val_options);
    if (gpt2 || text) trainer_options.max_epochs = -1;  // bounded by --max-steps
    Trainer run(flags.options());
    LanguageModel module(gpt, recipe, run.estimated_stepping_batches(train_loader));
    std::cerr << "train_gpt: GPT with " << gpt->parameter_count() << " parameters (" << config.n_layer << " layers, "
              << config.n_head << " heads, width " << config.n_embd << ", context " << config.block_size
              << ", vocabulary " << config.vocab_size << ") on " << device.str() << "\n";
    const auto fit_start = std::chrono::steady_clock::now();
    run.fit(module, train_loader, val_loader ? &*val_loader : nullptr, flags.ckpt_path);
    if (device.is_cuda()) cuda::device_synchronize(device.index);
    const double fit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
    const double tokens_per_second = static_cast<double>(module.tokens()) / fit_seconds;
    // Model FLOPs per token: 6 per parameter (forward and backward) plus
    // attention's 12 * layers * context * width (nanoGPT's estimate_mfu).
    const double flops_per_token = 6.0 * static_cast<double>(gpt->parameter_count()) +
                                   12.0 * static_cast<double>(config.n_layer * config.block_size * config.n_embd);
    std::printf("trained %lld steps, %lld tokens in %.1f s: %.0f tokens/s, %.2f TFLOP/s of model FLOPs\n",
                static_cast<long long>(run.global_step()), static_cast<long long>(module.tokens()), fit_seconds,
                tokens_per_second, tokens_per_second * flops_per_token / 1e12);
    if (!gpt2 && !text) {
      const double accuracy = addition_accuracy(*gpt, task, held_problems, device);
      std::printf("addition_accuracy %.4f  (%lld held-out %lld-digit problems answered exactly, %.1f s)\n", accuracy,
                  static_cast<long long>(held_problems.size(0)), static_cast<long long>(recipe.digits),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (text && recipe.sample > 0) {
      const auto& bytes = std::static_pointer_cast<TextWindows>(train_set)->bytes();
      std::string prompt = recipe.prompt.empty() ? std::string(bytes.begin(), bytes.begin() + std::min<size_t>(bytes.size(), 16))
                                                 : recipe.prompt;
      std::vector<int64_t> ids;
      for (unsigned char c : prompt) ids.push_back(c);
      const Tensor idx = tensor<int64_t>(ids, {1, static_cast<int64_t>(ids.size())}).to(device);
      const Tensor out = gpt->generate(idx, recipe.sample, 0.8, /*top_k=*/40);
      std::printf("----- sample -----\n%s\n------------------\n", as_text(out.cpu().reshape({-1})).c_str());
    }
    if (run.logger()) std::cerr << "train_gpt: logs in " << run.logger()->log_dir() << "\n";
  } catch (const Error& error) {
    std::cerr << "train_gpt: " << error.message() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "train_gpt: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
