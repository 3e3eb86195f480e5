// Random factories (rand, randn, randint, randperm) and dropout.
//
// Every draw reserves its Philox counters from the default generator of the
// tensor's device (core/generator.h) and hands (seed, offset) to the kernel;
// kernels/random.h fixes which counter words each element reads, so the same
// seed gives the same numbers on CPU and CUDA and both advance the generator
// alike. Reserving is a host-side counter bump: nothing here synchronizes.
// dropout draws its mask inside the kernel and keeps it (bool) for backward.
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/launch.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/random.h"

namespace kiln {

namespace {

// An uninitialized tensor for a factory (requires_grad is applied after the fill).
Tensor factory_output(const Shape& shape, const TensorOptions& options) {
  TensorOptions plain = options;
  plain.requires_grad = false;
  return empty(shape, plain);
}

Tensor finish_factory(Tensor out, const TensorOptions& options) {
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

void check_floating_factory(DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype), op, ": expected a floating dtype (float32, float64, float16, bfloat16), got ",
             dtype_name(dtype));
}

// The integers a dtype holds exactly, as [lowest, highest].
void exact_integer_range(DType dtype, double* lowest, double* highest) {
  switch (dtype) {
    case DType::i32: *lowest = -2147483648.0; *highest = 2147483647.0; return;
    case DType::i64: *lowest = -9223372036854775808.0; *highest = 9223372036854775807.0; return;
    case DType::u8: *lowest = 0; *highest = 255; return;
    case DType::f16: *lowest = -2048; *highest = 2048; return;
    case DType::bf16: *lowest = -256; *highest = 256; return;
    case DType::f32: *lowest = -16777216.0; *highest = 16777216.0; return;
    case DType::f64: *lowest = -9007199254740992.0; *highest = 9007199254740992.0; return;
    case DType::b8: break;
  }
  KILN_THROW("bool cannot hold random integers");
}

}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options) {
  check_floating_factory(options.dtype, "rand");
  Tensor out = factory_output(shape, options);
  const int64_t n = out.numel();
  if (n > 0) {
    const GeneratorState state = default_generator(options.device).advance(kernels::uniform_counters(options.dtype, n));
    if (out.is_cpu()) {
      kernels::uniform_cpu(out.data_ptr(), options.dtype, n, state.seed, state.offset);
    } else {
      kernels::uniform_cuda(out.data_ptr(), options.dtype, n, state.seed, state.offset, launch_on(out, "random").stream,
                            state.replay);
    }
  }
  return finish_factory(out, options);
}

Tensor randn(const Shape& shape, const TensorOptions& options) {
  check_floating_factory(options.dtype, "randn");
  Tensor out = factory_output(shape, options);
  const int64_t n = out.numel();
  if (n > 0) {
    const GeneratorState state = default_generator(options.device).advance(kernels::normal_counters(options.dtype, n));
    if (out.is_cpu()) {
      kernels::normal_cpu(out.data_ptr(), options.dtype, n, state.seed, state.offset);
    } else {
      kernels::normal_cuda(out.data_ptr(), options.dtype, n, state.seed, state.offset, launch_on(out, "random").stream,
                            state.replay);
    }
  }
  return finish_factory(out, options);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const IntegerTensorOptions& integer_options) {
  const TensorOptions options = integer_options.tensor_options();
  KILN_CHECK(low < high, "randint: expected low < high, got low = ", low, ", high = ", high);
  KILN_CHECK(options.dtype != DType::b8, "randint: bool is not a supported dtype");
  double lowest = 0, highest = 0;
  exact_integer_range(options.dtype, &lowest, &highest);
  KILN_CHECK(static_cast<double>(low) >= lowest && static_cast<double>(high - 1) <= highest, "randint: [", low, ", ",
             high, ") does not fit in ", dtype_name(options.dtype), " (holds integers in [", lowest, ", ", highest,
             "] exactly)");
  Tensor out = factory_output(shape, options);
  const int64_t n = out.numel();
  if (n > 0) {
    const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
    const GeneratorState state = default_generator(options.device).advance(kernels::randint_counters(n));
    if (out.is_cpu()) {
      kernels::randint_cpu(out.data_ptr(), options.dtype, n, low, range, state.seed, state.offset);
    } else {
      kernels::randint_cuda(out.data_ptr(), options.dtype, n, low, range, state.seed, state.offset, launch_on(out, "random").stream,
                            state.replay);
    }
  }
  return finish_factory(out, options);
}

Tensor randperm(int64_t n, const IntegerTensorOptions& integer_options) {
  const TensorOptions options = integer_options.tensor_options();
  KILN_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  KILN_CHECK(options.dtype != DType::b8, "randperm: bool is not a supported dtype");
  double lowest = 0, highest = 0;
  exact_integer_range(options.dtype, &lowest, &highest);
  KILN_CHECK(n == 0 || static_cast<double>(n - 1) <= highest, "randperm: n = ", n, " does not fit in ",
             dtype_name(options.dtype), " (holds integers up to ", highest, " exactly)");
  // Sorting random keys is cheap next to anything that uses a permutation; it
  // runs on the host for every device, with the device's generator.
  Tensor host = empty({n}, {.dtype = DType::i64});
  if (n > 0) {
    const GeneratorState state = default_generator(options.device).advance(kernels::randint_counters(n));
    kernels::randperm_cpu(host.data<int64_t>(), n, state.seed, state.offset);
  }
  return finish_factory(host.to(options.device, options.dtype), options);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  check_defined(x, "dropout");
  KILN_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  KILN_CHECK(is_floating(x.dtype()), "dropout: expected a floating tensor, got ", dtype_name(x.dtype()),
             " of shape ", shape_str(x.shape()));
  if (!training || p == 0.0) return x;
  const TensorOptions like{.dtype = x.dtype(), .device = x.device()};
  if (p == 1.0) {  // everything dropped: no draw, and a zero gradient
    Tensor out = zeros(x.shape(), like);
    if (autograd::any_requires_grad({&x})) {
      autograd::record("dropout", {x}, {out}, [shape = x.shape(), like](const autograd::TensorList&) {
        return autograd::TensorList{zeros(shape, like)};
      });
    }
    return out;
  }
  const int64_t n = x.numel();
  const double scale = 1.0 / (1.0 - p);
  const bool need_mask = autograd::any_requires_grad({&x});
  Tensor input;
  {
    NoGradGuard no_grad;
    input = x.contiguous();
  }
  Tensor out = empty(x.shape(), like);
  Tensor mask = need_mask ? empty(x.shape(), {.dtype = DType::b8, .device = x.device()}) : Tensor();
  auto* mask_data = need_mask ? static_cast<uint8_t*>(mask.data_ptr()) : nullptr;
  if (n > 0) {
    const GeneratorState state = default_generator(x.device()).advance(kernels::dropout_counters(n));
    if (x.is_cpu()) {
      kernels::dropout_cpu(input.data_ptr(), out.data_ptr(), mask_data, x.dtype(), n, static_cast<float>(p), scale,
                           state.seed, state.offset);
    } else {
      kernels::dropout_cuda(input.data_ptr(), out.data_ptr(), mask_data, x.dtype(), n, static_cast<float>(p), scale,
                            state.seed, state.offset, launch_on(x, "random").stream, state.replay);
    }
  }
  if (need_mask) {
    // The mask is internal (no one else can write it): kept as is, no version check.
    autograd::record("dropout", {x}, {out}, [mask, scale](const autograd::TensorList& grads) {
      const Tensor dout = grads[0].contiguous();
      Tensor dx = empty(dout.shape(), {.dtype = dout.dtype(), .device = dout.device()});
      const auto* keep = static_cast<const uint8_t*>(mask.data_ptr());
      if (dout.numel() > 0) {
        if (dout.is_cpu()) {
          kernels::dropout_backward_cpu(dout.data_ptr(), keep, dx.data_ptr(), dout.dtype(), dout.numel(), scale);
        } else {
          kernels::dropout_backward_cuda(dout.data_ptr(), keep, dx.data_ptr(), dout.dtype(), dout.numel(), scale,
                                         launch_on(dout, "random").stream);
        }
      }
      return autograd::TensorList{dx};
    });
  }
  return out;
}

}  // namespace kiln

namespace kiln {

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  check_defined(probs, "multinomial");
  KILN_CHECK(probs.dim() == 1 || probs.dim() == 2, "multinomial: expected a 1-D or 2-D tensor of weights, got shape ",
             shape_str(probs.shape()));
  KILN_CHECK(is_floating(probs.dtype()), "multinomial: expected floating weights, got ", dtype_name(probs.dtype()));
  KILN_CHECK(num_samples > 0, "multinomial: num_samples must be positive, got ", num_samples);
  const int64_t categories = probs.size(-1);
  KILN_CHECK(categories > 0, "multinomial: the rows have no categories (shape ", shape_str(probs.shape()), ")");
  KILN_CHECK(replacement || num_samples <= categories, "multinomial: cannot draw ", num_samples,
             " samples without replacement from ", categories, " categories");
  NoGradGuard no_grad;
  Tensor p = probs.dim() == 1 ? probs.unsqueeze(0) : probs;
  p = cast(p, p.dtype() == DType::f64 ? DType::f64 : DType::f32);
  if (p.size(0) == 0) return empty(probs.dim() == 1 ? Shape{num_samples} : Shape{0, num_samples}, {.dtype = DType::i64, .device = probs.device()});
  // One read of the device: negative or non-finite weights, the smallest row
  // sum and the fewest nonzero weights in a row.
  const std::vector<double> checks =
      stack({sum(cast(lt(p, 0.0), DType::f64)), sum(cast(eq(isfinite(p), 0.0), DType::f64)),
             cast(amin(sum(p, {1})), DType::f64), amin(sum(cast(gt(p, 0.0), DType::f64), {1}))})
          .to_vector<double>();
  KILN_CHECK(checks[0] == 0, "multinomial: ", checks[0], " weights are negative");
  KILN_CHECK(checks[1] == 0, "multinomial: ", checks[1], " weights are infinite or NaN");
  KILN_CHECK(checks[2] > 0, "multinomial: a row of weights sums to 0");
  KILN_CHECK(replacement || checks[3] >= static_cast<double>(num_samples), "multinomial: a row has only ", checks[3],
             " nonzero weights, fewer than the ", num_samples, " samples to draw without replacement");
  // The exponential race: category j wins with key log(u_j) / p_j (u uniform
  // in (0, 1)) with probability p_j / sum(p); the top k keys are a draw of k
  // without replacement (Gumbel-top-k). Zero weights never win.
  const TensorOptions like{.dtype = p.dtype(), .device = p.device()};
  const Tensor never = scalar_tensor(-std::numeric_limits<double>::infinity(), like);
  const auto keys = [&] { return where(gt(p, 0.0), div(log(rand(p.shape(), like)), p), never); };
  Tensor samples;
  if (!replacement) {
    samples = topk(keys(), num_samples, 1).indices;
  } else {
    std::vector<Tensor> draws;
    for (int64_t s = 0; s < num_samples; ++s) draws.push_back(argmax(keys(), 1, /*keepdim=*/true));
    samples = cat(draws, 1);
  }
  return probs.dim() == 1 ? samples.squeeze(0) : samples;
}

}  // namespace kiln
