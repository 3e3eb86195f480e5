// Bad and edge-case inputs for the public CPU ops. Every call must either
// return a valid tensor or throw kiln::Error: never crash, never throw another
// exception type (std::out_of_range, std::length_error, std::bad_alloc...),
// never hang. Two parts:
//   - a sweep of every op-table row (tests/ops_<family>.cpp) with variations of
//     the row's own samples: other dtypes, another rank, a size-0 dim, a
//     mismatched trailing size, non-contiguous, expanded and undefined inputs,
//     and out-of-range or negative indices; backward runs where the forward
//     succeeded with a floating output that requires grad;
//   - by hand, the dim and size arguments the rows fix: out-of-range dims (both
//     signs), negative sizes, kernels larger than the input, stride 0, groups
//     not dividing the channels, targets out of range, mismatched batches,
//     masks of the wrong shape. These must throw kiln::Error naming the op.
// A CrashReporter (tests/support/misuse_sweep.h) aborts, naming the case, if
// one call runs for a minute, and names the case that crashed.
// KILN_BAD_INPUTS_TRACE=1 prints each case before it runs and each failure as
// it happens.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <typeinfo>

#include "core/nn_ops.h"
#include "core/ops.h"
#include "tests/support/misuse_sweep.h"
#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

using Inputs = std::vector<Tensor>;
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::vector<OpInfo> all_rows() {
  std::vector<OpInfo> rows;
  for (auto family : {elementwise_op_infos, reduction_op_infos, linalg_op_infos, softmax_op_infos, indexing_op_infos,
                      shape_op_infos, view_op_infos, nn_op_infos, attention_op_infos}) {
    for (OpInfo& row : family()) rows.push_back(std::move(row));
  }
  return rows;
}

using sweep::demangled;

const bool kTrace = std::getenv("KILN_BAD_INPUTS_TRACE") != nullptr;  // see the top of the file

// The case running now, for the crash and hang reports (misuse_sweep.h's CrashReporter).
void set_current_case(const std::string& text) {
  sweep::set_case(text);
  if (kTrace) std::fprintf(stderr, "%s\n", text.c_str());
}

// What one call did.
struct Outcome {
  bool returned = false;    // no exception
  bool kiln_error = false;  // threw kiln::Error
  std::string message;      // the kiln::Error's message, or the foreign exception's type and what()
  std::string foreign;      // non-empty: threw something other than kiln::Error
};

template <typename Fn>
Outcome run_call(Fn&& fn) {
  Outcome outcome;
  try {
    fn();
    outcome.returned = true;
  } catch (const Error& error) {
    outcome.kiln_error = true;
    outcome.message = error.message();
  } catch (const std::exception& error) {
    outcome.foreign = demangled(typeid(error).name()) + ": " + error.what();
  } catch (...) {
    outcome.foreign = "an exception of unknown type";
  }
  return outcome;
}

// A kiln::Error from KILN_ASSERT: bad input reached an internal invariant.
bool is_internal_error(const Outcome& outcome) {
  return outcome.kiln_error && outcome.message.rfind("internal error", 0) == 0;
}

// "" when `t` is a defined tensor whose elements all lie inside its storage.
std::string invalid_tensor(const Tensor& t, const char* what) {
  if (!t.defined()) return std::string(what) + " is undefined";
  if (t.shape().size() != t.strides().size()) return std::string(what) + " has strides of another rank";
  for (int64_t size : t.shape()) {
    if (size < 0) return std::string(what) + " has a negative size: " + shape_str(t.shape());
  }
  if (t.numel() == 0) return "";
  int64_t low = t.offset(), high = t.offset();
  for (size_t d = 0; d < t.shape().size(); ++d) {
    const int64_t reach = (t.shape()[d] - 1) * t.strides()[d];
    (reach < 0 ? low : high) += reach;
  }
  const int64_t elements = static_cast<int64_t>(t.storage()->nbytes / t.element_size());
  if (low < 0 || high >= elements) {
    std::ostringstream out;
    out << what << " " << shape_str(t.shape()) << " strides " << shape_str(t.strides()) << " offset " << t.offset()
        << " reaches outside its storage of " << elements << " elements";
    return out.str();
  }
  return "";
}

// ---------------------------------------------------------------- input variations

// A tensor of `shape` in x's dtype holding x's values cyclically (zeros when x
// is empty): index inputs mostly stay in range, floating inputs stay random.
Tensor resized(const Tensor& x, const Shape& shape) {
  std::vector<double> source = x.numel() > 0 ? x.to_vector<double>() : std::vector<double>{0.0};
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = source[i % source.size()];
  return tensor<double>(values, shape).to(x.dtype());
}

// x's values in a view with a step-2 last dim.
Tensor sliced_copy(const Tensor& x) {
  Shape wide = x.shape();
  wide.back() *= 2;
  Tensor storage = zeros(wide, {.dtype = x.dtype()});
  Tensor view = storage.slice(-1, 0, wide.back(), 2);
  view.copy_(x);
  return view;
}

// x's first row along dim 0 broadcast (stride 0) to x's shape.
Tensor expanded_copy(const Tensor& x) { return x.narrow(0, 0, 1).contiguous().expand(x.shape()); }

// x (an integer tensor) with its first element set to `value`.
Tensor with_first_index(const Tensor& x, int64_t value) {
  std::vector<int64_t> values = x.to_vector<int64_t>();
  values[0] = value;
  return tensor<int64_t>(values, x.shape()).to(x.dtype());
}

struct Variation {
  std::string label;
  std::function<Inputs(const Inputs&)> apply;
};

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                            DType::i32, DType::i64, DType::u8,  DType::b8};
  return dtypes;
}

// Variations of one sample's inputs (made once, in float32).
std::vector<Variation> variations_of(const Inputs& base) {
  std::vector<Variation> out;
  auto one = [&](size_t i, std::string label, std::function<Tensor(const Tensor&)> change) {
    out.push_back({"input " + std::to_string(i) + ": " + std::move(label), [i, change](const Inputs& in) {
                     Inputs changed = in;
                     changed[i] = change(in[i]);
                     return changed;
                   }});
  };
  for (size_t i = 0; i < base.size(); ++i) {
    const Tensor& x = base[i];
    if (!x.defined()) continue;
    const Shape shape = x.shape();
    for (DType dtype : all_dtypes()) {
      if (dtype != x.dtype())
        one(i, std::string("cast to ") + std::string(dtype_name(dtype)),
            [dtype](const Tensor& t) { return t.to(dtype); });
    }
    {
      Shape s = shape;
      s.insert(s.begin(), 2);
      one(i, "a dim of 2 added at the front " + shape_str(s), [s](const Tensor& t) { return resized(t, s); });
    }
    if (!shape.empty()) {
      Shape s(shape.begin(), shape.end() - 1);
      one(i, "last dim dropped " + shape_str(s), [s](const Tensor& t) { return resized(t, s); });
      one(i, "0-d", [](const Tensor& t) { return resized(t, {}); });
      Shape plus = shape;
      plus.back() += 1;
      one(i, "last dim + 1 " + shape_str(plus), [plus](const Tensor& t) { return resized(t, plus); });
      if (shape.back() > 1) {
        Shape minus = shape;
        minus.back() -= 1;
        one(i, "last dim - 1 " + shape_str(minus), [minus](const Tensor& t) { return resized(t, minus); });
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] == 0) continue;
        Shape s0 = shape;
        s0[d] = 0;
        one(i, "dim " + std::to_string(d) + " set to 0 " + shape_str(s0),
            [s0](const Tensor& t) { return resized(t, s0); });
      }
      one(i, "sliced (step-2 last dim)", sliced_copy);
      if (shape[0] > 1) one(i, "expanded (stride 0 in dim 0)", expanded_copy);
    } else {
      one(i, "1-d (3)", [](const Tensor& t) { return resized(t, {3}); });
    }
    {
      Shape s = shape;
      s.insert(s.begin(), 0);
      one(i, "a size-0 dim added at the front " + shape_str(s), [s](const Tensor& t) { return resized(t, s); });
    }
    if (shape.size() >= 2) one(i, "non-contiguous (transposed storage)", non_contiguous_copy);
    one(i, "undefined", [](const Tensor&) { return Tensor(); });
    if (!is_floating(x.dtype()) && x.dtype() != DType::b8 && x.numel() > 0) {
      for (int64_t value : {int64_t{-1}, int64_t{-2}, int64_t{1} << 40, kInt64Min, kInt64Max}) {
        one(i, "index " + std::to_string(value), [value](const Tensor& t) { return with_first_index(t, value); });
      }
      one(i, "every index + 1", [](const Tensor& t) { return add(t.to(DType::f64), 1.0).to(t.dtype()); });
    }
  }
  for (DType dtype : all_dtypes()) {
    out.push_back({std::string("every input cast to ") + std::string(dtype_name(dtype)), [dtype](const Inputs& in) {
                     Inputs changed;
                     for (const Tensor& t : in) changed.push_back(t.defined() ? t.to(dtype) : t);
                     return changed;
                   }});
  }
  out.push_back({"every input non-contiguous", [](const Inputs& in) {
                   Inputs changed;
                   for (const Tensor& t : in) changed.push_back(t.defined() ? non_contiguous_copy(t) : t);
                   return changed;
                 }});
  if (base.size() >= 2) {
    out.push_back({"inputs in reverse order", [](const Inputs& in) { return Inputs(in.rbegin(), in.rend()); }});
  }
  return out;
}

// Runs `fn` on `inputs` (floating ones made to require grad), checks the
// output, and runs backward when it is floating and requires grad. Returns a
// failure description, or "" when the call returned a valid tensor or threw
// kiln::Error.
struct SweepCounts {
  int64_t calls = 0, returned = 0, kiln_errors = 0, backwards = 0, backward_errors = 0;
};

std::string sweep_one(const OpInfo& row, Inputs inputs, SweepCounts& counts, std::vector<std::string>& notes) {
  for (Tensor& t : inputs) {
    // A fresh leaf: the variations share tensors with the sample's inputs.
    if (t.defined()) t = t.detach();
    if (t.defined() && is_floating(t.dtype()) && row.differentiable) t.requires_grad_(true);
  }
  Tensor out;
  ++counts.calls;
  Outcome forward = run_call([&] { out = row.fn(inputs); });
  if (!forward.foreign.empty()) return "forward threw " + forward.foreign;
  if (is_internal_error(forward)) return "forward hit an internal check: " + forward.message;
  if (forward.kiln_error) {
    ++counts.kiln_errors;
    return "";
  }
  ++counts.returned;
  if (std::string bad = invalid_tensor(out, "the output"); !bad.empty()) return bad;
  if (!is_floating(out.dtype()) || !out.requires_grad()) return "";
  ++counts.backwards;
  Outcome backward = run_call([&] { out.backward(ones_like(out).detach()); });
  if (!backward.foreign.empty()) return "backward threw " + backward.foreign;
  if (is_internal_error(backward)) return "backward hit an internal check: " + backward.message;
  if (backward.kiln_error) {
    ++counts.backward_errors;
    notes.push_back(sweep::g_where +
                    ": backward threw kiln::Error after the forward succeeded: " + backward.message);
    return "";
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad() || !t.grad().defined()) continue;
    const Tensor grad = t.grad();
    if (std::string bad = invalid_tensor(grad, "a gradient"); !bad.empty()) return bad;
    if (grad.shape() != t.shape() || grad.dtype() != t.dtype()) {
      return "the gradient of input " + std::to_string(i) + " is " + shape_str(grad.shape()) + " " +
             std::string(dtype_name(grad.dtype())) + " for an input " + shape_str(t.shape()) + " " +
             std::string(dtype_name(t.dtype()));
    }
  }
  return "";
}

// (row, variation) pairs the row's own fn is not written for: it would break
// in the test's code, not in kiln's.
bool row_cannot_take(const OpInfo& row, const Inputs& inputs) {
  // split_leading (tests/ops_view.cpp) writes shape[0] of its input.
  return row.name == "view" && inputs[0].defined() && inputs[0].dim() == 0;
}

}  // namespace

TEST_CASE("bad inputs: every op-table row with variations of its samples returns or throws kiln::Error") {
  sweep::CrashReporter reporter("test_op_bad_inputs", 60);
  std::string where;
  INFO(where);  // the case running, also when a call crashes
  SweepCounts counts;
  int64_t rows = 0, variations = 0;
  std::vector<std::string> notes;
  for (const OpInfo& row : all_rows()) {
    ++rows;
    std::vector<std::string> failures;
    for (const OpSample& sample : row.samples) {
      Inputs base;
      try {
        base = row.make_inputs ? row.make_inputs(sample, DType::f32, 5) : default_inputs(sample, DType::f32, 5);
      } catch (const Error& error) {
        failures.push_back("sample '" + sample.label + "': make_inputs threw " + error.what());
        continue;
      }
      std::vector<Variation> cases = variations_of(base);
      for (const Variation& variation : cases) {
        where = "op '" + row.name + "' sample '" + sample.label + "' variation '" + variation.label + "'";
        set_current_case(where);
        ++variations;
        Inputs inputs;
        try {
          inputs = variation.apply(base);
        } catch (const Error& error) {
          failures.push_back(where + ": building the inputs threw " + error.what());
          continue;
        }
        if (row_cannot_take(row, inputs)) continue;
        std::string failure = sweep_one(row, std::move(inputs), counts, notes);
        if (!failure.empty()) failures.push_back(where + ": " + failure);
        if (kTrace && !failure.empty()) std::fprintf(stderr, "FAILED: %s: %s\n", where.c_str(), failure.c_str());
      }
    }
    where = "op '" + row.name + "' (all samples)";
    std::string report;
    for (const std::string& failure : failures) report += "\n  " + failure;
    CHECK_MESSAGE(failures.empty(), "op '" << row.name << "': " << failures.size() << " failure(s):" << report);
  }
  where.clear();
  set_current_case("(done)");
  MESSAGE("swept " << rows << " op rows, " << variations << " (sample, variation) cases: " << counts.returned
                   << " returned, " << counts.kiln_errors << " threw kiln::Error; backward ran " << counts.backwards
                   << " times, " << counts.backward_errors << " threw kiln::Error");
  for (const std::string& note : notes) MESSAGE(note);
}

// ---------------------------------------------------------------- by hand

namespace {

enum class Expect { error, either };

struct HandCase {
  std::string op;     // the op (or, where an allocation fails, the words) the error message must name
  std::string label;  // what is wrong
  std::function<Tensor()> call;
  Expect expect = Expect::error;
  // For Expect::either: "" when a returned result is right, else what is wrong.
  std::function<std::string(const Tensor&)> check_result;
};

Tensor randn_f32(const Shape& shape) { return randn(shape); }
Tensor index_tensor(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return tensor<int64_t>(values, {n});
}

// Runs one hand case; "" on success, else a description.
std::string run_hand_case(const HandCase& c) {
  Tensor out;
  Outcome outcome = run_call([&] {
    out = c.call();
    // Views must stay inside their storage; the backward of a bad call that
    // returned must not crash either.
    if (std::string bad = invalid_tensor(out, "the output"); !bad.empty()) KILN_THROW("invalid output: ", bad);
  });
  if (!outcome.foreign.empty()) return "threw " + outcome.foreign;
  if (is_internal_error(outcome)) return "hit an internal check: " + outcome.message;
  if (outcome.kiln_error) {
    if (outcome.message.rfind("invalid output: ", 0) == 0) return outcome.message;
    if (outcome.message.find(c.op) == std::string::npos) {
      return "kiln::Error does not name '" + c.op + "': " + outcome.message;
    }
    return "";
  }
  if (c.expect == Expect::error) return "returned " + shape_str(out.shape()) + " instead of throwing kiln::Error";
  if (c.check_result) return c.check_result(out);
  return "";
}

// A check that a result equals `expected()`.
std::function<std::string(const Tensor&)> equals(std::function<Tensor()> expected) {
  return [expected = std::move(expected)](const Tensor& out) -> std::string {
    Tensor reference = expected();
    std::string mismatch = compare(out.to(DType::f64), reference.to(DType::f64), 0.0, 0.0);
    return mismatch.empty() ? "" : "returned a wrong result: " + mismatch;
  };
}

std::vector<HandCase> hand_cases() {
  std::vector<HandCase> cases;
  auto error = [&](std::string op, std::string label, std::function<Tensor()> call) {
    cases.push_back({std::move(op), std::move(label), std::move(call), Expect::error, {}});
  };
  const Tensor x3 = randn_f32({2, 3, 4});
  const Tensor x2 = randn_f32({4, 5});
  const Tensor x0 = randn_f32({});
  const Tensor img = randn_f32({2, 4, 5, 6});  // (N, C, H, W)

  // ---- reductions, softmax, scan, topk: dims out of range, both signs
  for (int64_t dim : {int64_t{3}, int64_t{-4}, int64_t{100}, kInt64Min, kInt64Max}) {
    const std::string d = "dim " + std::to_string(dim) + " of a 3-d tensor";
    error("sum", d, [=] { return sum(x3, {dim}); });
    error("mean", d, [=] { return mean(x3, {dim}, true); });
    error("var", d, [=] { return var(x3, {dim}); });
    error("amax", d, [=] { return amax(x3, {dim}); });
    error("max", d, [=] { return max(x3, dim).values; });
    error("min", d, [=] { return min(x3, dim).indices; });
    error("argmax", d, [=] { return argmax(x3, dim); });
    error("norm", d, [=] { return norm(x3, 2.0, {dim}); });
    error("softmax", d, [=] { return softmax(x3, dim); });
    error("log_softmax", d, [=] { return log_softmax(x3, dim); });
    error("cumsum", d, [=] { return cumsum(x3, dim); });
    error("topk", d, [=] { return topk(x3, 1, dim).values; });
    error("narrow", d, [=] { return x3.narrow(dim, 0, 1); });
    error("select", d, [=] { return x3.select(dim, 0); });
    error("transpose", d, [=] { return x3.transpose(0, dim); });
    error("transpose", d + " (first)", [=] { return x3.transpose(dim, 0); });
    error("permute", d, [=] { return x3.permute({0, 1, dim}); });
    error("cat", d, [=] { return cat({x3, x3}, dim); });
    error("stack", d, [=] { return stack({x3, x3}, dim == 3 ? 4 : dim == -4 ? -5 : dim); });
    error("split", d, [=] { return split(x3, 1, dim)[0]; });
    error("split", d + " (sizes)", [=] { return split(x3, std::vector<int64_t>{1, 1}, dim)[0]; });
    error("chunk", d, [=] { return chunk(x3, 2, dim)[0]; });
    error("squeeze", d, [=] { return x3.squeeze(dim); });
    error("flatten", d, [=] { return x3.flatten(dim); });
    error("index_select", d, [=] { return index_select(x3, dim, index_tensor({0})); });
    error("gather", d, [=] { return gather(x3, dim, zeros({2, 3, 4}, {.dtype = DType::i64})); });
    error("scatter_add", d, [=] {
      return scatter_add(x3, dim, zeros({2, 3, 4}, {.dtype = DType::i64}), randn_f32({2, 3, 4}));
    });
  }
  error("sum", "the same dim twice", [=] { return sum(x3, {1, 1}); });
  error("sum", "the same dim twice, once negative", [=] { return sum(x3, {2, -1}); });
  error("mean", "the same dim twice", [=] { return mean(x3, {0, -3}); });
  error("amax", "the same dim twice", [=] { return amax(x3, {0, 0}); });
  error("sum", "dim 1 of a 0-d tensor", [=] { return sum(x0, {1}); });
  error("softmax", "dim -2 of a 0-d tensor", [=] { return softmax(x0, -2); });
  error("cumsum", "dim 1 of a 0-d tensor", [=] { return cumsum(x0, 1); });
  error("unsqueeze", "dim 4 of a 3-d tensor", [=] { return x3.unsqueeze(4); });
  error("unsqueeze", "dim -5 of a 3-d tensor", [=] { return x3.unsqueeze(-5); });
  error("stack", "dim 4 of 3-d tensors", [=] { return stack({x3, x3}, 4); });
  error("stack", "dim -5 of 3-d tensors", [=] { return stack({x3, x3}, -5); });
  error("permute", "a repeated dim", [=] { return x3.permute({0, 1, 1}); });
  error("permute", "a repeated dim, once negative", [=] { return x3.permute({0, 2, -1}); });
  error("permute", "too few dims", [=] { return x3.permute({0, 1}); });
  error("permute", "too many dims", [=] { return x3.permute({0, 1, 2, 3}); });
  error("flatten", "start_dim after end_dim", [=] { return x3.flatten(2, 1); });
  error("max", "over an empty dim", [=] { return max(randn_f32({3, 0}), 1).values; });
  error("argmax", "over an empty dim", [=] { return argmax(randn_f32({3, 0}), 1); });
  error("amax", "over an empty dim", [=] { return amax(randn_f32({3, 0}), {1}); });
  error("max", "of an empty tensor", [=] { return max(randn_f32({0, 3})); });
  // ---- topk: k out of range
  error("topk", "k larger than the dim", [=] { return topk(x3, 5, -1).values; });
  error("topk", "k negative", [=] { return topk(x3, -1, -1).values; });
  error("topk", "k = INT64_MIN", [=] { return topk(x3, kInt64Min, -1).values; });
  // ---- narrow, select, slice: starts and lengths
  error("narrow", "negative length", [=] { return x3.narrow(2, 0, -1); });
  error("narrow", "start + length past the end", [=] { return x3.narrow(2, 2, 3); });
  error("narrow", "start past the end", [=] { return x3.narrow(2, 5, 0); });
  error("narrow", "start below -size", [=] { return x3.narrow(2, -5, 1); });
  error("narrow", "length INT64_MAX", [=] { return x3.narrow(2, 1, kInt64Max); });
  error("select", "index = size", [=] { return x3.select(2, 4); });
  error("select", "index = -size - 1", [=] { return x3.select(2, -5); });
  error("select", "index INT64_MIN", [=] { return x3.select(2, kInt64Min); });
  error("select", "an empty dim", [=] { return randn_f32({3, 0}).select(1, 0); });
  error("slice", "step 0", [=] { return x3.slice(2, 0, 4, 0); });
  error("slice", "negative step", [=] { return x3.slice(2, 0, 4, -1); });
  cases.push_back({"slice", "step INT64_MAX", [=] { return x3.slice(2, 1, 4, kInt64Max); }, Expect::either,
                   equals([=] { return x3.slice(2, 1, 2); })});
  error("size", "dim -1 of a 0-d tensor", [=] { return full({1}, static_cast<double>(x0.size(-1))); });
  error("stride", "dim 0 of a 0-d tensor", [=] { return full({1}, static_cast<double>(x0.stride(0))); });
  error("slice", "a 0-d tensor", [=] { return x0.slice(0, 0, 1); });
  error("narrow", "a 0-d tensor", [=] { return x0.narrow(-1, 0, 1); });
  error("select", "a 0-d tensor", [=] { return x0.select(0, 0); });
  error("transpose", "dim 5 of a 0-d tensor", [=] { return x0.transpose(0, 5); });
  error("squeeze", "dim 2 of a 0-d tensor", [=] { return x0.squeeze(2); });
  error("expand", "a negative size for a size-1 dim", [=] { return randn_f32({1, 3}).expand({-2, 3}); });
  // ---- view, reshape, expand: sizes
  error("view", "the wrong number of elements", [=] { return x3.view({5, 5}); });
  error("view", "a negative size other than -1", [=] { return x3.view({-2, 12}); });
  error("view", "two -1 sizes", [=] { return x3.view({-1, -1}); });
  error("view", "-1 with a 0 size", [=] { return x3.view({0, -1}); });
  error("view", "-1 that does not divide", [=] { return x3.view({5, -1}); });
  error("view", "a non-viewable stride", [=] { return x3.transpose(0, 2).view({-1}); });
  error("reshape", "the wrong number of elements", [=] { return x3.reshape({7, -1}); });
  error("reshape", "a negative size", [=] { return x3.reshape({-3, -8}); });
  error("does not fit in 64 bits", "reshape: sizes whose product overflows", [=] {
    return x3.reshape({kInt64Max, 4, 0});
  });
  error("expand", "a size other than 1 changed", [=] { return x3.expand({2, 3, 5}); });
  error("expand", "fewer dims", [=] { return x3.expand({3, 4}); });
  error("expand", "a negative size in a new dim", [=] { return x3.expand({-1, 2, 3, 4}); });
  error("expand", "a negative size other than -1", [=] { return x3.expand({2, -2, 4}); });
  error("t", "a 3-d tensor", [=] { return x3.t(); });
  // ---- cat, stack, split, chunk
  error("cat", "no tensors", [=] { return cat({}, 0); });
  error("cat", "sizes differ outside the dim", [=] { return cat({x3, randn_f32({2, 4, 4})}, 0); });
  error("cat", "different ranks", [=] { return cat({x3, x2}, 0); });
  error("cat", "different dtypes", [=] { return cat({x3, x3.to(DType::f64)}, 0); });
  error("cat", "an undefined tensor", [=] { return cat({x3, Tensor()}, 0); });
  error("cat", "0-d tensors", [=] { return cat({x0, x0}, 0); });
  error("stack", "no tensors", [=] { return stack({}, 0); });
  error("stack", "different shapes", [=] { return stack({x3, randn_f32({2, 3, 5})}, 0); });
  error("split", "split_size 0", [=] { return split(x3, 0, 1)[0]; });
  error("split", "negative split_size", [=] { return split(x3, -1, 1)[0]; });
  error("split", "sizes that do not add up", [=] { return split(x3, std::vector<int64_t>{1, 1}, 1)[0]; });
  error("split", "a negative size", [=] { return split(x3, std::vector<int64_t>{4, -1}, 1)[0]; });
  error("chunk", "0 chunks", [=] { return chunk(x3, 0, 1)[0]; });
  error("chunk", "negative chunks", [=] { return chunk(x3, -2, 1)[0]; });
  // ---- indexing: indices out of range, wrong dtypes and shapes
  for (int64_t bad : {int64_t{4}, int64_t{-5}, int64_t{1} << 40, kInt64Min, kInt64Max}) {
    const std::string v = "index " + std::to_string(bad) + " for a dim of 4";
    error("index_select", v, [=] { return index_select(x3, 2, index_tensor({0, bad})); });
    error("gather", v, [=] { return gather(x3, 2, full({2, 3, 1}, static_cast<double>(bad), {.dtype = DType::i64})); });
    error("scatter_add", v, [=] {
      return scatter_add(x3, 2, full({2, 3, 1}, static_cast<double>(bad), {.dtype = DType::i64}), randn_f32({2, 3, 1}));
    });
    error("embedding", v, [=] { return embedding(randn_f32({4, 3}), index_tensor({1, bad})); });
  }
  for (int64_t bad : {int64_t{-1}, int64_t{-4}}) {
    // A negative index in range must not read before the data: either an
    // error or the wrapped index's value (as Python's negative indexing).
    const std::string v = "index " + std::to_string(bad) + " for a dim of 4";
    const int64_t wrapped = bad + 4;
    cases.push_back({"index_select", v, [=] { return index_select(x3, 2, index_tensor({bad})); }, Expect::either,
                     equals([=] { return index_select(x3, 2, index_tensor({wrapped})); })});
    cases.push_back({"gather", v,
                     [=] {
                       return gather(x3, 2, full({2, 3, 1}, static_cast<double>(bad), {.dtype = DType::i64}));
                     },
                     Expect::either, equals([=] {
                       return gather(x3, 2, full({2, 3, 1}, static_cast<double>(wrapped), {.dtype = DType::i64}));
                     })});
    cases.push_back({"embedding", v, [=] { return embedding(x2, index_tensor({bad})); }, Expect::either,
                     equals([=] { return embedding(x2, index_tensor({wrapped})); })});
  }
  error("index_select", "a float index", [=] { return index_select(x3, 0, zeros({2})); });
  error("index_select", "a 2-d index", [=] { return index_select(x3, 0, zeros({1, 1}, {.dtype = DType::i64})); });
  error("gather", "an index of another rank", [=] { return gather(x3, 0, zeros({2, 3}, {.dtype = DType::i64})); });
  error("gather", "an index larger outside the dim", [=] {
    return gather(x3, 0, zeros({2, 4, 4}, {.dtype = DType::i64}));
  });
  error("gather", "a float index", [=] { return gather(x3, 0, zeros({2, 3, 4})); });
  error("scatter_add", "src smaller than the index", [=] {
    return scatter_add(x3, 0, zeros({2, 3, 4}, {.dtype = DType::i64}), randn_f32({2, 3, 3}));
  });
  error("scatter_add", "src of another dtype", [=] {
    return scatter_add(x3, 0, zeros({2, 3, 4}, {.dtype = DType::i64}), randn_f32({2, 3, 4}).to(DType::f64));
  });
  error("scatter_add", "an index larger outside the dim", [=] {
    return scatter_add(x3, 0, zeros({2, 4, 4}, {.dtype = DType::i64}), randn_f32({2, 4, 4}));
  });
  error("embedding", "a 1-d weight", [=] { return embedding(randn_f32({4}), index_tensor({1})); });
  error("embedding", "float indices", [=] { return embedding(x2, zeros({2})); });
  error("masked_fill", "a float mask", [=] { return masked_fill(x2, zeros({4, 5}), 1.0); });
  error("masked_fill", "a mask that does not broadcast", [=] {
    return masked_fill(x2, zeros({3, 5}, {.dtype = DType::b8}), 1.0);
  });
  error("where", "a float condition", [=] { return where(zeros({4, 5}), x2, x2); });
  error("tril", "a 1-d tensor", [=] { return tril(randn_f32({4})); });
  error("triu", "a 0-d tensor", [=] { return triu(x0); });

  // ---- elementwise
  error("add", "shapes that do not broadcast", [=] { return add(x2, randn_f32({4, 4})); });
  error("add", "different dtypes", [=] { return add(x2, x2.to(DType::f64)); });
  error("mul", "an undefined operand", [=] { return mul(x2, Tensor()); });
  error("gelu", "an unknown approximation", [=] { return gelu(x2, "bogus"); });
  error("out of memory", "add: an output of 2^48 elements (more memory than exists)", [=] {
    return add(zeros({int64_t{1} << 24, 1}), zeros({1, int64_t{1} << 24}));
  });
  error("dropout", "p < 0", [=] { return dropout(x2, -0.5); });
  error("dropout", "p > 1", [=] { return dropout(x2, 1.5); });
  error("multinomial", "negative num_samples", [=] { return multinomial(softmax(x2, -1), -1); });
  error("multinomial", "more samples than categories without replacement",
        [=] { return multinomial(softmax(x2, -1), 6); });
  error("multinomial", "a 3-d input", [=] { return multinomial(softmax(x3, -1), 1); });

  // ---- matmul, linear
  error("matmul", "inner sizes differ", [=] { return matmul(x2, randn_f32({4, 5})); });
  error("matmul", "a 0-d operand", [=] { return matmul(x0, x2); });
  error("matmul", "batch sizes that do not broadcast", [=] {
    return matmul(randn_f32({2, 3, 4}), randn_f32({3, 4, 5}));
  });
  error("matmul", "1-d operands of different lengths", [=] { return matmul(randn_f32({3}), randn_f32({4})); });
  error("mm", "a 3-d operand", [=] { return mm(x3, x2); });
  error("bmm", "batch sizes differ", [=] { return bmm(randn_f32({2, 3, 4}), randn_f32({3, 4, 5})); });
  error("bmm", "2-d operands", [=] { return bmm(x2, randn_f32({5, 2})); });
  error("linear", "in-features differ", [=] { return linear(x2, randn_f32({3, 4})); });
  error("linear", "a bias of the wrong size", [=] { return linear(x2, randn_f32({3, 5}), randn_f32({4})); });
  error("linear", "a 2-d bias", [=] { return linear(x2, randn_f32({3, 5}), randn_f32({1, 3})); });
  error("linear", "a 1-d weight", [=] { return linear(x2, randn_f32({5})); });
  error("linear", "a 3-d weight", [=] { return linear(x2, randn_f32({1, 3, 5})); });
  error("linear", "a 0-d input", [=] { return linear(x0, randn_f32({3, 1})); });
  error("linear", "an undefined weight", [=] { return linear(x2, Tensor()); });

  // ---- losses
  const Tensor logits = randn_f32({3, 5});
  for (int64_t bad : {int64_t{5}, int64_t{-1}, int64_t{-101}, int64_t{1} << 40, kInt64Min, kInt64Max}) {
    const std::string v = "target " + std::to_string(bad) + " for 5 classes";
    error("cross_entropy", v, [=] { return cross_entropy(logits, index_tensor({0, bad, 1})); });
    error("cross_entropy", v + ", reduction none", [=] {
      return cross_entropy(logits, index_tensor({0, bad, 1}), Tensor(), -100, 0.0, Reduction::none);
    });
    error("cross_entropy", v + ", label smoothing", [=] {
      return cross_entropy(logits, index_tensor({0, bad, 1}), Tensor(), -100, 0.2);
    });
    error("cross_entropy", v + ", (N, C, d) logits", [=] {
      return cross_entropy(randn_f32({1, 5, 3}), tensor<int64_t>({0, bad, 1}, {1, 3}));
    });
    error("nll_loss", v, [=] { return nll_loss(log_softmax(logits, 1), index_tensor({0, bad, 1})); });
    error("nll_loss", v + ", weighted", [=] {
      return nll_loss(log_softmax(logits, 1), index_tensor({0, bad, 1}), ones({5}));
    });
  }
  error("cross_entropy", "a batch of 2 targets for 3 rows", [=] {
    return cross_entropy(logits, index_tensor({0, 1}));
  });
  error("cross_entropy", "a 2-d target for (N, C) logits", [=] {
    return cross_entropy(logits, zeros({3, 1}, {.dtype = DType::i64}));
  });
  error("cross_entropy", "a float target of the wrong shape", [=] { return cross_entropy(logits, zeros({3})); });
  error("cross_entropy", "a weight of the wrong size", [=] {
    return cross_entropy(logits, index_tensor({0, 1, 2}), ones({4}));
  });
  error("cross_entropy", "label smoothing 1.5", [=] {
    return cross_entropy(logits, index_tensor({0, 1, 2}), Tensor(), -100, 1.5);
  });
  error("cross_entropy", "label smoothing -0.5", [=] {
    return cross_entropy(logits, index_tensor({0, 1, 2}), Tensor(), -100, -0.5);
  });
  error("cross_entropy", "a 0-d input", [=] { return cross_entropy(x0, index_tensor({0})); });
  error("cross_entropy", "(N, C, d) logits with a mismatched d", [=] {
    return cross_entropy(randn_f32({2, 5, 3}), zeros({2, 4}, {.dtype = DType::i64}));
  });
  error("nll_loss", "a batch of 4 targets for 3 rows", [=] { return nll_loss(logits, index_tensor({0, 1, 2, 3})); });
  error("nll_loss", "a weight of the wrong size", [=] { return nll_loss(logits, index_tensor({0, 1, 2}), ones({6})); });
  error("nll_loss", "an int32 target",
        [=] { return nll_loss(logits, zeros({3}, {.dtype = DType::i32}).to(DType::i32)); });

  // ---- conv2d
  const Tensor w = randn_f32({6, 4, 3, 3});
  error("conv2d", "a kernel larger than the input", [=] { return conv2d(img, randn_f32({6, 4, 6, 3})); });
  error("conv2d", "a kernel larger than the input (width)", [=] { return conv2d(img, randn_f32({6, 4, 3, 7})); });
  error("conv2d", "a dilated kernel larger than the input", [=] { return conv2d(img, w, {}, 1, 0, 3); });
  error("conv2d", "stride 0", [=] { return conv2d(img, w, {}, 0); });
  error("conv2d", "stride (1, 0)", [=] { return conv2d(img, w, {}, Size2(1, 0)); });
  error("conv2d", "a negative stride", [=] { return conv2d(img, w, {}, -1); });
  error("conv2d", "a negative padding", [=] { return conv2d(img, w, {}, 1, -1); });
  error("conv2d", "dilation 0", [=] { return conv2d(img, w, {}, 1, 0, 0); });
  error("conv2d", "groups 0", [=] { return conv2d(img, w, {}, 1, 0, 1, 0); });
  error("conv2d", "negative groups", [=] { return conv2d(img, w, {}, 1, 0, 1, -2); });
  error("conv2d", "groups not dividing the input channels", [=] {
    return conv2d(img, randn_f32({6, 4, 3, 3}), {}, 1, 0, 1, 3);
  });
  error("conv2d", "groups not dividing the output channels", [=] {
    return conv2d(img, randn_f32({5, 2, 3, 3}), {}, 1, 0, 1, 2);
  });
  error("conv2d", "weight channels differ from the input's", [=] { return conv2d(img, randn_f32({6, 3, 3, 3})); });
  error("conv2d", "a bias of the wrong size", [=] { return conv2d(img, w, randn_f32({5})); });
  error("conv2d", "a 3-d weight", [=] { return conv2d(img, randn_f32({6, 4, 3})); });
  error("conv2d", "a 2-d input", [=] { return conv2d(x2, w); });
  error("conv2d", "a 5-d input", [=] { return conv2d(randn_f32({1, 2, 4, 5, 6}), w); });
  error("conv2d", "a weight of another dtype", [=] { return conv2d(img, w.to(DType::f64)); });
  error("conv2d", "an int64 input", [=] { return conv2d(img.to(DType::i64), w.to(DType::i64)); });
  error("overflows 64 bits", "conv2d: a huge padding (an output too large to count)",
        [=] { return conv2d(img, w, {}, 1, int64_t{1} << 61); });
  error("conv2d", "a padding of INT64_MAX", [=] { return conv2d(img, w, {}, 1, kInt64Max); });
  error("conv2d", "a dilation of INT64_MAX", [=] { return conv2d(img, w, {}, 1, 0, kInt64Max); });
  // 4 * 2^62 wraps to 0: a dilated 5x5 kernel of "size 1".
  error("conv2d", "a dilation of 2^62 (the dilated size wraps)", [=] {
    return conv2d(img, randn_f32({6, 4, 5, 5}), {}, 1, 0, int64_t{1} << 62);
  });
  error("conv2d", "a kernel of size 0", [=] { return conv2d(img, randn_f32({6, 4, 0, 3})); });

  // ---- pooling
  for (const std::string op : {"max_pool2d", "avg_pool2d"}) {
    auto pool = [op](const Tensor& x, Size2 kernel, std::optional<Size2> stride, Size2 padding) {
      return op == "max_pool2d" ? max_pool2d(x, kernel, stride, padding) : avg_pool2d(x, kernel, stride, padding);
    };
    error(op, "a kernel larger than the input", [=] { return pool(img, 6, std::nullopt, 0); });
    error(op, "a kernel larger than the input (width)", [=] { return pool(img, Size2(2, 7), std::nullopt, 0); });
    error(op, "kernel 0", [=] { return pool(img, 0, std::nullopt, 0); });
    error(op, "a negative kernel", [=] { return pool(img, -2, std::nullopt, 0); });
    error(op, "stride 0", [=] { return pool(img, 2, Size2(0), 0); });
    error(op, "stride (1, 0)", [=] { return pool(img, 2, Size2(1, 0), 0); });
    error(op, "a negative stride", [=] { return pool(img, 2, Size2(-1), 0); });
    error(op, "a negative padding", [=] { return pool(img, 2, std::nullopt, -1); });
    error(op, "padding more than half the kernel", [=] { return pool(img, 2, std::nullopt, 2); });
    error(op, "a 2-d input", [=] { return pool(x2, 2, std::nullopt, 0); });
    error(op, "a 5-d input", [=] { return pool(randn_f32({1, 2, 4, 5, 6}), 2, std::nullopt, 0); });
    error(op, "a kernel of INT64_MAX", [=] { return pool(img, kInt64Max, std::nullopt, 0); });
    error(op, "an int64 input", [=] { return pool(img.to(DType::i64), 2, std::nullopt, 0); });
  }
  error("max_pool2d", "dilation 0", [=] { return max_pool2d(img, 2, std::nullopt, 0, 0); });
  // 2^32 * 2^32 wraps to 0: a dilated kernel of "size 1".
  error("max_pool2d", "kernel 2^32 + 1 with dilation 2^32 (the dilated size wraps)",
        [=] { return max_pool2d(img, Size2((int64_t{1} << 32) + 1, 1), Size2(1), 0, Size2(int64_t{1} << 32, 1)); });
  error("max_pool2d", "kernel INT64_MAX with padding 2^62",
        [=] { return max_pool2d(img, kInt64Max, Size2(1), int64_t{1} << 62); });
  error("avg_pool2d", "a padding of INT64_MAX", [=] { return avg_pool2d(img, 2, Size2(1), kInt64Max); });
  error("max_pool2d", "a dilated kernel larger than the input", [=] { return max_pool2d(img, 2, std::nullopt, 0, 6); });
  error("adaptive_avg_pool2d", "output size 0", [=] { return adaptive_avg_pool2d(img, 0); });
  error("adaptive_avg_pool2d", "a negative output size", [=] { return adaptive_avg_pool2d(img, Size2(2, -1)); });
  error("adaptive_avg_pool2d", "a 2-d input", [=] { return adaptive_avg_pool2d(x2, 1); });

  // ---- normalization
  const Tensor stats = ones({4});
  error("layer_norm", "a normalized_shape the input does not end with", [=] { return layer_norm(x3, {3}); });
  error("layer_norm", "a normalized_shape longer than the input", [=] { return layer_norm(x3, {1, 2, 3, 4}); });
  error("layer_norm", "an empty normalized_shape", [=] { return layer_norm(x3, {}); });
  error("layer_norm", "a weight of the wrong shape", [=] { return layer_norm(x3, {4}, ones({3})); });
  error("layer_norm", "a bias of the wrong shape", [=] { return layer_norm(x3, {4}, ones({4}), zeros({2, 2})); });
  error("layer_norm", "a negative normalized size", [=] { return layer_norm(x3, {-4}); });
  error("rms_norm", "a normalized_shape the input does not end with", [=] { return rms_norm(x3, {3}); });
  error("rms_norm", "a weight of the wrong shape", [=] { return rms_norm(x3, {4}, ones({5})); });
  error("batch_norm", "running stats of the wrong size",
        [=] { return batch_norm(img, ones({3}), ones({3}), stats, stats, false); });
  error("batch_norm", "a weight of the wrong size",
        [=] { return batch_norm(img, stats, stats, ones({5}), stats, true); });
  error("batch_norm", "a bias of the wrong size", [=] {
    return batch_norm(img, stats, stats, stats, ones({2, 2}), true);
  });
  error("batch_norm", "eval without running stats",
        [=] { return batch_norm(img, Tensor(), Tensor(), stats, stats, false); });
  error("batch_norm", "a 1-d input", [=] { return batch_norm(randn_f32({4}), stats, stats, stats, stats, false); });
  error("batch_norm", "a 0-d input", [=] { return batch_norm(x0, stats, stats, stats, stats, true); });
  error("batch_norm", "one value per channel in training", [=] {
    return batch_norm(randn_f32({1, 4}), Tensor(), Tensor(), stats, stats, true);
  });
  error("batch_norm_relu", "running stats of the wrong size",
        [=] { return batch_norm_relu(img, ones({5}), ones({5}), stats, stats, false); });

  // ---- attention
  const Tensor q = randn_f32({2, 3, 5, 8}), k = randn_f32({2, 3, 7, 8}), v = randn_f32({2, 3, 7, 8});
  const std::string sdpa = "scaled_dot_product_attention";
  error(sdpa, "a mask of the wrong shape", [=] { return scaled_dot_product_attention(q, k, v, zeros({5, 6})); });
  error(sdpa, "a bool mask of the wrong shape", [=] {
    return scaled_dot_product_attention(q, k, v, ones({7, 5}, {.dtype = DType::b8}));
  });
  error(sdpa, "a mask with too many dims", [=] {
    return scaled_dot_product_attention(q, k, v, zeros({1, 2, 3, 5, 7}));
  });
  error(sdpa, "an int64 mask", [=] {
    return scaled_dot_product_attention(q, k, v, zeros({5, 7}, {.dtype = DType::i64}));
  });
  cases.push_back({sdpa, "a float64 mask for float32 inputs",
                   [=] {
                     return scaled_dot_product_attention(q, k, v, zeros({5, 7}, {.dtype = DType::f64}));
                   },
                   Expect::either, equals([=] { return scaled_dot_product_attention(q, k, v); })});
  error(sdpa, "a mask and is_causal", [=] { return scaled_dot_product_attention(q, k, v, zeros({5, 7}), 0.0, true); });
  error(sdpa, "key batch differs", [=] { return scaled_dot_product_attention(q, randn_f32({3, 3, 7, 8}), v); });
  error(sdpa, "key and value lengths differ", [=] {
    return scaled_dot_product_attention(q, k, randn_f32({2, 3, 6, 8}));
  });
  error(sdpa, "query and key head dims differ", [=] {
    return scaled_dot_product_attention(q, randn_f32({2, 3, 7, 4}), v);
  });
  error(sdpa, "key of another rank", [=] { return scaled_dot_product_attention(q, randn_f32({3, 7, 8}), v); });
  error(sdpa, "1-d query", [=] { return scaled_dot_product_attention(randn_f32({8}), k, v); });
  error(sdpa, "dropout_p -0.1", [=] { return scaled_dot_product_attention(q, k, v, Tensor(), -0.1); });
  error(sdpa, "dropout_p 1.5", [=] { return scaled_dot_product_attention(q, k, v, Tensor(), 1.5); });
  error(sdpa, "value of another dtype", [=] { return scaled_dot_product_attention(q, k, v.to(DType::f64)); });
  error(sdpa, "int64 query, key and value",
        [=] { return scaled_dot_product_attention(q.to(DType::i64), k.to(DType::i64), v.to(DType::i64)); });

  // ---- factories with nonsense sizes
  error("negative size", "zeros: a negative size", [] { return zeros({2, -3}); });
  error("negative size", "empty: a negative size", [] { return empty({-1}); });
  error("overflows 64 bits", "full: a shape whose product overflows", [] { return full({kInt64Max, 2}, 1.0); });
  error("out of memory", "ones: 2^48 elements (more memory than exists)", [] {
    return ones({int64_t{1} << 24, int64_t{1} << 24});
  });
  error("out of memory", "contiguous: an expanded view of 2^48 elements", [] {
    return zeros({1}).expand({int64_t{1} << 24, int64_t{1} << 24}).contiguous();
  });
  error("arange", "step 0", [] { return arange(0.0, 5.0, 0.0); });
  error("arange", "a step of the wrong sign", [] { return arange(0.0, 5.0, -1.0); });
  error("randperm", "a negative n", [] { return randperm(-3); });
  error("randint", "low >= high", [] { return randint(5, 5, {3}); });
  error("linspace", "negative steps", [] { return linspace(0.0, 1.0, -2); });
  return cases;
}

}  // namespace

TEST_CASE("bad inputs: dim and size arguments out of range throw kiln::Error naming the op") {
  sweep::CrashReporter reporter("test_op_bad_inputs", 60);
  std::string where;
  INFO(where);
  std::vector<HandCase> cases = hand_cases();
  std::map<std::string, std::vector<std::string>> failures_by_op;
  for (const HandCase& c : cases) {
    where = "op '" + c.op + "': " + c.label;
    set_current_case(where);
    std::string failure = run_hand_case(c);
    if (!failure.empty()) failures_by_op[c.op].push_back(c.label + ": " + failure);
    if (kTrace && !failure.empty()) std::fprintf(stderr, "FAILED: %s: %s\n", where.c_str(), failure.c_str());
  }
  where.clear();
  set_current_case("(done)");
  for (const auto& [op, failures] : failures_by_op) {
    std::string report;
    for (const std::string& failure : failures) report += "\n  " + failure;
    CHECK_MESSAGE(failures.empty(), "op '" << op << "': " << failures.size() << " failure(s):" << report);
  }
  MESSAGE("ran " << cases.size() << " hand-written bad-argument cases");
}

}  // namespace kiln::testing
