// scaled_dot_product_attention beyond the op table: agreement with the plain
// math, masks, a row with no allowed key, dropout, memory, errors, and the
// CUDA kernels against the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "kernels/attention.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

using doctest::Contains;

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  return tensor<double>(random_values(shape_numel(shape), seed), shape).to(dtype);
}

// softmax(q k^T * scale + mask) v written out with matmul, in float64.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& additive, double scale) {
  Tensor scores = mul(matmul(q.to(DType::f64), k.to(DType::f64).transpose(-2, -1)), scale);
  if (additive.defined()) scores = add(scores, additive.to(DType::f64));
  return matmul(softmax(scores, -1), v.to(DType::f64));
}

// Sets which CUDA kernels take 16-bit problems for a scope, and restores the setting.
class CudaKernelsScope {
 public:
  explicit CudaKernelsScope(kernels::AttentionCudaKernels which) { kernels::set_attention_cuda_kernels(which); }
  ~CudaKernelsScope() { kernels::set_attention_cuda_kernels(saved_); }
  CudaKernelsScope(const CudaKernelsScope&) = delete;
  CudaKernelsScope& operator=(const CudaKernelsScope&) = delete;

 private:
  kernels::AttentionCudaKernels saved_ = kernels::attention_cuda_kernels();
};

const char* kernels_name(kernels::AttentionCudaKernels which) {
  return which == kernels::AttentionCudaKernels::reference ? "reference kernels" : "tensor-core kernels";
}

int64_t nan_count(const Tensor& t) {
  int64_t count = 0;
  for (double value : t.to_vector<double>()) count += std::isnan(value) ? 1 : 0;
  return count;
}

// A dense copy of t on the GPU whose data starts 2 bytes past a 16-byte
// boundary: the kernels' unaligned path (plain loads instead of cp.async).
Tensor unaligned_cuda(const Tensor& t) {
  Tensor base = zeros({t.numel() + 8}, {.dtype = t.dtype(), .device = Device::cuda()});
  Tensor view = base.narrow(0, 1, t.numel()).reshape(t.shape());
  view.copy_(t.cuda());
  REQUIRE(reinterpret_cast<uintptr_t>(view.data_ptr()) % 16 != 0);
  return view.detach();
}

// The forward's out and lse and the backward's dq, dk, dv from the CUDA
// kernels called directly, on outputs poisoned with NaN (an element no
// kernel writes stays NaN; the op's own outputs come from empty()).
// `additive`: float32 on the GPU, (L, S) or (B, 1, 1, S), or undefined.
struct KernelOutputs {
  Tensor out, lse, dq, dk, dv;
};

KernelOutputs run_kernels(kernels::AttentionCudaKernels which, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& additive, bool causal, const Tensor& dout) {
  const CudaKernelsScope scope(which);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  kernels::AttentionArgs args;
  args.dtype = q.dtype();
  args.batch = q.size(0);
  args.heads = q.size(1);
  args.q_len = q.size(2);
  args.kv_len = k.size(2);
  args.head_dim = q.size(3);
  args.q = q.data_ptr();
  args.k = k.data_ptr();
  args.v = v.data_ptr();
  args.causal = causal;
  args.scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  if (additive.defined()) {
    args.mask.data = additive.data<float>();
    if (additive.dim() == 2) {  // (L, S)
      args.mask.stride_q = additive.stride(0);
      args.mask.stride_k = additive.stride(1);
    } else {  // (B, 1, 1, S)
      args.mask.stride_b = additive.stride(0);
      args.mask.stride_k = additive.stride(3);
    }
  }
  const cuda::Stream stream = cuda::current_stream(q.device().index);
  KernelOutputs r;
  r.out = full(q.shape(), nan, {.dtype = q.dtype(), .device = q.device()});
  r.lse = full({q.size(0), q.size(1), q.size(2)}, nan, {.dtype = DType::f32, .device = q.device()});
  kernels::attention_forward_cuda(args, r.out.data_ptr(), r.lse.data_ptr(), stream);
  kernels::AttentionGradArgs grad;
  grad.forward = args;
  grad.out = r.out.data_ptr();
  grad.lse = r.lse.data_ptr();
  grad.dout = dout.data_ptr();
  r.dq = full(q.shape(), nan, {.dtype = q.dtype(), .device = q.device()});
  r.dk = full(k.shape(), nan, {.dtype = q.dtype(), .device = q.device()});
  r.dv = full(v.shape(), nan, {.dtype = q.dtype(), .device = q.device()});
  grad.dq = r.dq.data_ptr();
  grad.dk = r.dk.data_ptr();
  grad.dv = r.dv.data_ptr();
  const Tensor workspace = empty({static_cast<int64_t>(std::max<size_t>(kernels::attention_backward_workspace_bytes(grad), 1))},
                                 {.dtype = DType::u8, .device = q.device()});
  kernels::attention_backward_cuda(grad, workspace.data_ptr(), stream);
  cuda::stream_synchronize(stream);
  return r;
}

Tensor causal_additive(int64_t L, int64_t S) {
  std::vector<double> values(static_cast<size_t>(L * S), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = i + 1; j < S; ++j) values[static_cast<size_t>(i * S + j)] = -std::numeric_limits<double>::infinity();
  }
  return tensor<double>(values, {L, S});
}

// Attention on q, k, v read in place from a fused projection (B, T, 3 E)
// split into heads, against the same inputs copied dense: equal outputs and
// input gradients, out laid out (B, T, H, D) so that merging its heads is a
// view. Also a key with a last dim that is not dense (copied by the op) and
// a value broadcast over the batch (stride 0).
void check_strided_heads(Device device, DType dtype, int64_t head_dim) {
  const int64_t B = 2, T = 70, H = 3, E = H * head_dim;
  const TensorOptions options{.dtype = dtype, .device = device};
  for (const bool causal : {false, true}) {
    CAPTURE(causal);
    const Tensor projection = random_tensor({B, T, 3 * E}, 50, dtype).to(device).requires_grad_();
    const auto heads = [&](const Tensor& x) { return x.reshape({B, T, H, head_dim}).transpose(1, 2); };
    const std::vector<Tensor> qkv = split(projection, E, 2);
    const Tensor strided_out = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), Tensor(), 0.0, causal);
    CHECK(strided_out.transpose(1, 2).is_contiguous());  // (B, T, H, D) in memory
    const Tensor merged = strided_out.transpose(1, 2).reshape({B, T, E});
    CHECK(merged.data_ptr() == strided_out.data_ptr());  // a view, no copy
    const Tensor dmerged = random_tensor({B, T, E}, 51, dtype).to(device);
    merged.backward(dmerged);

    const Tensor dense = projection.detach().clone().requires_grad_();
    const std::vector<Tensor> dense_qkv = split(dense, E, 2);
    const Tensor dense_out = scaled_dot_product_attention(heads(dense_qkv[0]).contiguous(), heads(dense_qkv[1]).contiguous(),
                                                          heads(dense_qkv[2]).contiguous(), Tensor(), 0.0, causal);
    CHECK(dense_out.is_contiguous());
    dense_out.backward(dmerged.reshape({B, T, H, head_dim}).transpose(1, 2).contiguous());
    // The same kernels on the same values, read through other strides: the same bits.
    CHECK(strided_out.cpu().to(DType::f64).to_vector<double>() == dense_out.cpu().to(DType::f64).to_vector<double>());
    CHECK(projection.grad().cpu().to(DType::f64).to_vector<double>() ==
          dense.grad().cpu().to(DType::f64).to_vector<double>());
  }
  // A key whose head dim is not dense, and a value broadcast over the batch.
  const Tensor q = random_tensor({B, H, T, head_dim}, 52, dtype).to(device).requires_grad_();
  const Tensor k_t = random_tensor({B, H, head_dim, T}, 53, dtype).to(device).requires_grad_();
  const Tensor v_one = random_tensor({1, H, T, head_dim}, 54, dtype).to(device).requires_grad_();
  const Tensor out = scaled_dot_product_attention(q, k_t.transpose(2, 3), v_one.expand({B, H, T, head_dim}));
  const Tensor dout = random_tensor({B, H, T, head_dim}, 55, dtype).to(device);
  out.backward(dout);
  const Tensor q2 = q.detach().clone().requires_grad_(), k2 = k_t.detach().transpose(2, 3).contiguous().requires_grad_(),
               v2 = v_one.detach().expand({B, H, T, head_dim}).contiguous().requires_grad_();
  const Tensor out2 = scaled_dot_product_attention(q2, k2, v2);
  out2.backward(dout);
  CHECK(out.cpu().to(DType::f64).to_vector<double>() == out2.cpu().to(DType::f64).to_vector<double>());
  CHECK(q.grad().cpu().to(DType::f64).to_vector<double>() == q2.grad().cpu().to(DType::f64).to_vector<double>());
  CHECK(k_t.grad().transpose(2, 3).cpu().to(DType::f64).to_vector<double>() ==
        k2.grad().cpu().to(DType::f64).to_vector<double>());
  KILN_CHECK_CLOSE(v_one.grad().cpu().to(DType::f64), sum(v2.grad(), {0}, true).cpu().to(DType::f64), 1e-5, 1e-5);
  // A query broadcast over B, H and T (strides 0, 0, 0, 1) and an output gradient broadcast the same
  // way: read in place as broadcasts, not as dense tensors (which would read past their one row).
  const Tensor q_row = random_tensor({1, 1, 1, head_dim}, 56, dtype).to(device).requires_grad_();
  const Tensor k = random_tensor({B, H, T, head_dim}, 57, dtype).to(device);
  const Tensor v = random_tensor({B, H, T, head_dim}, 58, dtype).to(device);
  const Tensor dout_row = random_tensor({1, 1, 1, head_dim}, 59, dtype).to(device);
  const Tensor broadcast_out = scaled_dot_product_attention(q_row.expand({B, H, T, head_dim}), k, v, Tensor(), 0.0, true);
  broadcast_out.backward(dout_row.expand({B, H, T, head_dim}));
  const Tensor q_dense = q_row.detach().expand({B, H, T, head_dim}).contiguous().requires_grad_();
  const Tensor dense_result = scaled_dot_product_attention(q_dense, k, v, Tensor(), 0.0, true);
  dense_result.backward(dout_row.expand({B, H, T, head_dim}).contiguous());
  CHECK(broadcast_out.cpu().to(DType::f64).to_vector<double>() == dense_result.cpu().to(DType::f64).to_vector<double>());
  KILN_CHECK_CLOSE(q_row.grad().cpu().to(DType::f64), sum(q_dense.grad(), {0, 1, 2}, true).cpu().to(DType::f64), 1e-4,
                   1e-4);
  (void)options;
}

}  // namespace

TEST_CASE("attention: the fused CPU kernel equals softmax(q k^T / sqrt(E)) v, causal and not, across tiles") {
  for (const auto& [L, S] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {64, 64}, {65, 129}, {130, 70}}) {
    for (bool causal : {false, true}) {
      INFO("L " << L << " S " << S << (causal ? " causal" : ""));
      const Tensor q = random_tensor({2, 3, L, 16}, 1), k = random_tensor({2, 3, S, 16}, 2),
                   v = random_tensor({2, 3, S, 16}, 3);
      const Tensor expected = reference_attention(q, k, v, causal ? causal_additive(L, S) : Tensor(), 0.25);
      for (DType dtype : {DType::f64, DType::f32}) {
        const Tensor got = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), Tensor(), 0.0, causal);
        const double tolerance = dtype == DType::f64 ? 1e-12 : 2e-6;
        KILN_CHECK_CLOSE(got.to(DType::f64), expected, tolerance, tolerance);
      }
    }
  }
}

TEST_CASE("attention: causal with a value width other than the head dim (the matmul + softmax path)") {
  // The fused kernels need value dim = head dim: this takes composite_attention, whose causal mask is made on the device.
  for (const auto& [L, S] : std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {4, 7}, {7, 4}}) {
    INFO("L " << L << " S " << S);
    const Tensor q = random_tensor({2, 3, L, 8}, 11), k = random_tensor({2, 3, S, 8}, 12),
                 v = random_tensor({2, 3, S, 5}, 13);
    const Tensor expected = reference_attention(q, k, v, causal_additive(L, S), 1.0 / std::sqrt(8.0));
    KILN_CHECK_CLOSE(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true), expected, 1e-12,
                     1e-12);
  }
}

TEST_CASE("attention: heads are read in place from a fused projection and out is written for merging (CPU)") {
  for (const DType dtype : {DType::f64, DType::f32}) {
    CAPTURE(dtype);
    check_strided_heads(Device::cpu(), dtype, 24);
  }
}

TEST_CASE("attention: a bool mask equals its additive form; broadcast masks are not expanded in memory") {
  const Tensor q = random_tensor({2, 2, 6, 8}, 4), k = random_tensor({2, 2, 9, 8}, 5), v = random_tensor({2, 2, 9, 8}, 6);
  std::vector<uint8_t> allowed(2 * 9);
  for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = i % 3 != 0;
  const Tensor bool_mask = tensor<uint8_t>(allowed, {2, 1, 1, 9}).to(DType::b8);  // a key-padding mask
  const Tensor additive = where(bool_mask, zeros({}, {.dtype = DType::f64}),
                                full({}, -std::numeric_limits<double>::infinity(), {.dtype = DType::f64}));
  const Tensor expected = reference_attention(q, k, v, additive, 1.0 / std::sqrt(8.0));
  KILN_CHECK_CLOSE(scaled_dot_product_attention(q, k, v, bool_mask), expected, 1e-12, 1e-12);
  KILN_CHECK_CLOSE(scaled_dot_product_attention(q, k, v, additive), expected, 1e-12, 1e-12);
  // A float mask of the scores' full shape, and an explicit scale.
  const Tensor full_mask = random_tensor({2, 2, 6, 9}, 7);
  KILN_CHECK_CLOSE(scaled_dot_product_attention(q, k, v, full_mask, 0.0, false, 0.5),
                   reference_attention(q, k, v, full_mask, 0.5), 1e-12, 1e-12);
}

TEST_CASE("attention: a row with no allowed key gives zeros and zero gradients, never NaN") {
  Tensor q = random_tensor({1, 1, 3, 4}, 8).requires_grad_(), k = random_tensor({1, 1, 5, 4}, 9).requires_grad_(),
         v = random_tensor({1, 1, 5, 4}, 10).requires_grad_();
  std::vector<uint8_t> allowed(15, 1);
  for (int j = 0; j < 5; ++j) allowed[5 + j] = 0;  // row 1 may attend to nothing
  const Tensor mask = tensor<uint8_t>(allowed, {3, 5}).to(DType::b8);
  for (bool fused : {true, false}) {
    INFO(std::string(fused ? "fused" : "matmul path (Ev != E)"));
    Tensor vv = fused ? v : random_tensor({1, 1, 5, 3}, 11).requires_grad_();
    Tensor out = scaled_dot_product_attention(q, k, vv, mask);
    const std::vector<double> values = out.to_vector<double>();
    const int64_t ev = vv.size(-1);
    for (int64_t d = 0; d < ev; ++d) CHECK(values[static_cast<size_t>(ev + d)] == 0.0);
    for (double value : values) CHECK(std::isfinite(value));
    q.zero_grad_();
    sum(out).backward();
    const std::vector<double> dq = q.grad().to_vector<double>();
    for (double value : dq) CHECK(std::isfinite(value));
    for (int64_t d = 0; d < 4; ++d) CHECK(dq[static_cast<size_t>(4 + d)] == 0.0);
  }
}

TEST_CASE("attention: dropout follows the generator, keeps the mean, and its gradient matches its forward") {
  const Tensor q = random_tensor({2, 2, 40, 8}, 12), k = random_tensor({2, 2, 50, 8}, 13), v = random_tensor({2, 2, 50, 8}, 14);
  manual_seed(3);
  const Tensor a = scaled_dot_product_attention(q, k, v, Tensor(), 0.3);
  manual_seed(3);
  const Tensor b = scaled_dot_product_attention(q, k, v, Tensor(), 0.3);
  const Tensor c = scaled_dot_product_attention(q, k, v, Tensor(), 0.3);
  KILN_CHECK_CLOSE(a, b, 0, 0);
  CHECK_FALSE(compare(a, c, 0, 0).empty());  // the generator moved on
  const Tensor plain = scaled_dot_product_attention(q, k, v);
  CHECK_FALSE(compare(a, plain, 1e-3, 1e-3).empty());
  // With v = 1 each output is the row's kept probability mass / (1 - p): its mean is 1.
  const Tensor ones_v = ones({2, 2, 50, 8}, {.dtype = DType::f64});
  manual_seed(4);
  CHECK(mean(scaled_dot_product_attention(q, k, ones_v, Tensor(), 0.3)).item<double>() == doctest::Approx(1.0).epsilon(0.03));
  // The backward regenerates the forward's mask: gradcheck with a reseeded generator.
  const std::string failure = gradcheck(
      [](const std::vector<Tensor>& in) {
        manual_seed(9);
        return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.25, /*is_causal=*/true);
      },
      {random_tensor({1, 2, 6, 4}, 15).requires_grad_(), random_tensor({1, 2, 7, 4}, 16).requires_grad_(),
       random_tensor({1, 2, 7, 4}, 17).requires_grad_()});
  CHECK_MESSAGE(failure.empty(), failure);
}

TEST_CASE("attention: the CPU forward holds tiles, not the L x S matrix") {
  const int64_t L = 2048, S = 2048, E = 64;
  const Tensor q = random_tensor({1, 1, L, E}, 18, DType::f32), k = random_tensor({1, 1, S, E}, 19, DType::f32),
               v = random_tensor({1, 1, S, E}, 20, DType::f32);
  reset_peak_memory_stats(Device::cpu());
  const size_t before = memory_stats(Device::cpu()).allocated_bytes;
  const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  const size_t peak = memory_stats(Device::cpu()).peak_allocated_bytes - before;
  MESSAGE("peak tensor memory of a 2048 x 2048 attention: " << peak << " bytes (scores would be "
                                                            << L * S * 4 << ")");
  CHECK(peak < static_cast<size_t>(L * S * 4) / 8);  // output + lse: L * (E + 1) * 4 bytes
  CHECK(peak >= static_cast<size_t>(L * E * 4));
}

TEST_CASE("attention: 16-bit inputs on the CPU compute in float32") {
  const Tensor q = random_tensor({1, 2, 5, 8}, 21), k = random_tensor({1, 2, 6, 8}, 22), v = random_tensor({1, 2, 6, 8}, 23);
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Tensor got = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype));
    CHECK(got.dtype() == dtype);
    const Tensor expected = scaled_dot_product_attention(q.to(dtype).to(DType::f32), k.to(dtype).to(DType::f32),
                                                         v.to(dtype).to(DType::f32));
    KILN_CHECK_CLOSE(got.to(DType::f32), expected.to(dtype).to(DType::f32), 0, 0);
  }
}

TEST_CASE("attention: bad inputs are refused, naming what is wrong") {
  const Tensor q = random_tensor({2, 3, 5, 8}, 24), k = random_tensor({2, 3, 7, 8}, 25), v = random_tensor({2, 3, 7, 8}, 26);
  CHECK(error_of([&] { scaled_dot_product_attention(q, random_tensor({2, 3, 7, 6}, 1), v); })
            .find("key's last dim 6 differs from query's 8") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, random_tensor({2, 3, 6, 8}, 1)); })
            .find("value has 6 positions and key 7") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, random_tensor({2, 4, 7, 8}, 1), v); })
            .find("same batch dims") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k.to(DType::f32), v); }).find("dtype") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, random_tensor({5, 7}, 1), 0.0, true); })
            .find("cannot be combined with is_causal") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, random_tensor({5, 6}, 1)); })
            .find("attn_mask") != std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, Tensor(), 1.0); }).find("dropout_p must be in [0, 1)") !=
        std::string::npos);
  CHECK(error_of([&] { scaled_dot_product_attention(q, k, v, zeros({5, 7}, {.dtype = DType::i64})); })
            .find("attn_mask must be bool or floating") != std::string::npos);
}

// scaled_dot_product_attention of q, k, v (host tensors of one dtype; mask
// on the host or undefined) on the GPU against the CPU in float32: out within
// (rtol, atol), and the input gradients for the output gradient
// random_tensor(out's shape, grad_seed) within 4 rtol, 4 atol.
void check_cuda_against_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                            std::optional<double> scale, double rtol, double atol, uint64_t grad_seed) {
  // Leaves of their own (detach): for float32, to(f32) returns q itself.
  std::vector<Tensor> cpu = {q.to(DType::f32).detach().requires_grad_(), k.to(DType::f32).detach().requires_grad_(),
                             v.to(DType::f32).detach().requires_grad_()};
  std::vector<Tensor> gpu = {q.cuda().requires_grad_(), k.cuda().requires_grad_(), v.cuda().requires_grad_()};
  const Tensor cpu_out = scaled_dot_product_attention(cpu[0], cpu[1], cpu[2], mask, 0.0, causal, scale);
  const Tensor gpu_out = scaled_dot_product_attention(gpu[0], gpu[1], gpu[2], mask.defined() ? mask.cuda() : mask, 0.0,
                                                      causal, scale);
  KILN_CHECK_CLOSE(gpu_out.cpu().to(DType::f32), cpu_out, rtol, atol);
  if (cpu_out.numel() == 0) return;
  const Tensor seed = random_tensor(cpu_out.shape(), grad_seed, DType::f32);
  cpu_out.backward(seed);
  gpu_out.backward(seed.to(Device::cuda(), q.dtype()));
  for (int i = 0; i < 3; ++i) {
    INFO("gradient of input " << i);
    KILN_CHECK_CLOSE(gpu[i].grad().cpu().to(DType::f32), cpu[i].grad(), 4 * rtol, 4 * atol);
  }
}

TEST_CASE("attention: the CUDA kernels match the CPU, forward and backward, in every dtype and head dim [gpu]") {
  KILN_REQUIRE_GPU();
  struct Case {
    int64_t B, H, L, S;
    bool causal;
    int mask;  // 0 none, 1 additive (L, S), 2 bool key padding (B, 1, 1, S)
  };
  const std::vector<Case> cases = {{2, 3, 5, 7, false, 0},   {1, 2, 130, 70, false, 0}, {2, 2, 257, 257, true, 0},
                                   {1, 1, 70, 200, true, 0}, {2, 2, 33, 97, false, 1},  {2, 2, 64, 65, false, 2},
                                   {1, 1, 3, 0, false, 0}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t E : {32, 64, 96, 128}) {
      REQUIRE(kernels::attention_cuda_supports(dtype, E));
      for (const Case& c : cases) {
        INFO(dtype_name(dtype) << " E " << E << " B " << c.B << " H " << c.H << " L " << c.L << " S " << c.S
                               << (c.causal ? " causal" : "") << " mask " << c.mask);
        Tensor q = random_tensor({c.B, c.H, c.L, E}, 30, dtype), k = random_tensor({c.B, c.H, c.S, E}, 31, dtype),
               v = random_tensor({c.B, c.H, c.S, E}, 32, dtype);
        Tensor mask;
        if (c.mask == 1) mask = random_tensor({c.L, c.S}, 33, dtype);
        if (c.mask == 2) mask = gt(random_tensor({c.B, 1, 1, c.S}, 34), -1.0);
        // 16-bit: P and dS are rounded to the input type before their products
        // (as flash-attention does), an absolute error of about half an ulp.
        const Tolerance tol = parity_tolerance(dtype);
        const double rtol = dtype == DType::f32 ? 1e-5 : 2 * tol.rtol;
        const double atol = dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 1e-3 : 5e-3;
        check_cuda_against_cpu(q, k, v, mask, c.causal, std::nullopt, rtol, atol, 35);
      }
    }
  }
  // Dropout draws the same Philox words on both devices.
  const Tensor q = random_tensor({2, 2, 70, 64}, 36, DType::f32), k = random_tensor({2, 2, 90, 64}, 37, DType::f32),
               v = random_tensor({2, 2, 90, 64}, 38, DType::f32);
  manual_seed(5);
  const Tensor cpu_drop = scaled_dot_product_attention(q, k, v, Tensor(), 0.2, true);
  manual_seed(5);
  const Tensor gpu_drop = scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), Tensor(), 0.2, true);
  KILN_CHECK_CLOSE(gpu_drop.cpu(), cpu_drop, 1e-5, 1e-5);
  // A scale that is not positive (the tensor-core forward takes a row's max
  // before scaling, so these go to the reference kernels): still the CPU's
  // result, forward and backward, causal with a partial key block.
  for (const double scale : {-0.3, 0.0}) {
    INFO("scale " << scale);
    check_cuda_against_cpu(random_tensor({1, 2, 40, 64}, 39, DType::bf16), random_tensor({1, 2, 70, 64}, 40, DType::bf16),
                           random_tensor({1, 2, 70, 64}, 41, DType::bf16), Tensor(), /*causal=*/true, scale,
                           2 * parity_tolerance(DType::bf16).rtol, 5e-3, 42);
  }
}

// Problems for comparing one set of CUDA kernels with another: partial
// blocks of rows and keys, several key blocks, causal and not.
struct KernelCase {
  int64_t B, H, L, S;
  bool causal;
};
constexpr KernelCase kKernelCases[] = {{2, 3, 5, 7, false},   {1, 2, 130, 70, false},  {2, 2, 257, 257, true},
                                       {1, 1, 70, 200, true}, {1, 2, 300, 384, false}, {1, 2, 1024, 1024, true}};

// The backward on wgmma (set_attention_wgmma_backward) gives the mma.sync
// backward's dq, dk and dv on the head dims it runs for, on kKernelCases; off
// compute capability 9.0 it refuses.
TEST_CASE("attention: the wgmma backward gives the mma.sync backward's gradients [gpu]") {
  KILN_REQUIRE_GPU();
  struct Restore {
    bool saved = kernels::attention_wgmma_backward();
    ~Restore() { kernels::set_attention_wgmma_backward(saved); }
  } restore;
  const cuda::DeviceProperties properties = cuda::device_properties(0);
  const bool sm90 = properties.major == 9 && properties.minor == 0;
  for (int64_t D : {64, 128}) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      for (const KernelCase& c : kKernelCases) {
        INFO(dtype_name(dtype) << " D " << D << " B " << c.B << " H " << c.H << " L " << c.L << " S " << c.S
                               << (c.causal ? " causal" : ""));
        const Tensor q = random_tensor({c.B, c.H, c.L, D}, 70, dtype).cuda().requires_grad_();
        const Tensor k = random_tensor({c.B, c.H, c.S, D}, 71, dtype).cuda().requires_grad_();
        const Tensor v = random_tensor({c.B, c.H, c.S, D}, 72, dtype).cuda().requires_grad_();
        const Tensor dout = random_tensor({c.B, c.H, c.L, D}, 73, dtype).cuda();
        const auto grads = [&] {
          return autograd::grad({scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal)}, {q, k, v}, {dout});
        };
        kernels::set_attention_wgmma_backward(false);
        const autograd::TensorList expected = grads();
        kernels::set_attention_wgmma_backward(true);
        if (!sm90) {
          CHECK_THROWS_WITH_AS(grads(), doctest::Contains("compute capability 9.0"), Error);
          continue;
        }
        const autograd::TensorList got = grads();
        const Tolerance tol = parity_tolerance(dtype);
        for (int i = 0; i < 3; ++i) {
          KILN_CHECK_CLOSE(got[i].cpu().to(DType::f32), expected[i].cpu().to(DType::f32), 4 * tol.rtol,
                           dtype == DType::f16 ? 4e-3 : 2e-2);
        }
      }
    }
  }
}

TEST_CASE("attention: the wgmma backward's switch is kept and read back") {
  const bool saved = kernels::attention_wgmma_backward();
  kernels::set_attention_wgmma_backward(!saved);
  CHECK(kernels::attention_wgmma_backward() == !saved);
  kernels::set_attention_wgmma_backward(saved);
  CHECK(kernels::attention_wgmma_backward() == saved);
}

// The tensor-core kernels index a tile's rows in 32 bits: a q whose row
// stride exceeds attention_tc::kMaxRowStride goes to the reference kernels,
// and gives what its dense copy gives, forward and backward.
TEST_CASE("attention: a row stride beyond the tensor-core kernels' 32-bit tile indexing is still right [gpu]") {
  KILN_REQUIRE_GPU();
  const int64_t stride = kernels::attention_tc::kMaxRowStride + 64;
  for (DType dtype : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dtype));
    const Tensor base = random_tensor({2, stride}, 60, dtype).cuda();  // (2, stride): 2 rows far apart
    const Tensor q = base.narrow(1, 0, 64).unsqueeze(0).unsqueeze(0).detach().requires_grad_();  // (1, 1, 2, 64)
    REQUIRE(q.stride(2) == stride);
    const Tensor k = random_tensor({1, 1, 3, 64}, 61, dtype).cuda().requires_grad_();
    const Tensor v = random_tensor({1, 1, 3, 64}, 62, dtype).cuda().requires_grad_();
    const Tensor dout = random_tensor({1, 1, 2, 64}, 63, dtype).cuda();
    const Tensor dense = q.detach().contiguous().requires_grad_();
    const Tensor out = scaled_dot_product_attention(q, k, v);
    const autograd::TensorList grads = autograd::grad({out}, {q, k, v}, {dout});
    const Tensor dense_out = scaled_dot_product_attention(dense, k, v);
    const autograd::TensorList dense_grads = autograd::grad({dense_out}, {dense, k, v}, {dout});
    KILN_CHECK_CLOSE(out.cpu().to(DType::f32), dense_out.cpu().to(DType::f32), 2e-2, 1e-2);
    for (int i = 0; i < 3; ++i) {
      KILN_CHECK_CLOSE(grads[i].cpu().to(DType::f32), dense_grads[i].cpu().to(DType::f32), 2e-2, 1e-2);
    }
  }
}

TEST_CASE("attention: the tensor-core forward's shape knob refuses an index out of range and names its shapes") {
  const int saved = kernels::attention_forward_shape();
  const int shapes = kernels::attention_forward_shape_count();
  for (int index = 0; index < shapes; ++index) CHECK(std::string(kernels::attention_forward_shape_name(index)).size() > 0);
  // The default runs for every head dim; no shape for one the kernels lack.
  for (int64_t D : {32, 64, 96, 128}) CHECK(kernels::attention_forward_shape_applies(0, D));
  for (int index = 1; index < shapes; ++index) CHECK_FALSE(kernels::attention_forward_shape_applies(index, 48));
  CHECK_FALSE(kernels::attention_forward_shape_applies(shapes, 64));
  CHECK(std::string(kernels::attention_forward_shape_name(shapes)).empty());
  CHECK_THROWS_WITH_AS(kernels::set_attention_forward_shape(shapes), doctest::Contains("is not a shape index"),
                       Error);
  CHECK_THROWS_WITH_AS(kernels::set_attention_forward_shape(-1), doctest::Contains("is not a shape index"), Error);
  CHECK(kernels::attention_forward_shape() == saved);
}

TEST_CASE("attention: CUDA reads heads in place from a fused projection and writes out for merging [gpu]") {
  KILN_REQUIRE_GPU();
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const int64_t head_dim : {32, 64, 128}) {
      for (const kernels::AttentionCudaKernels which :
           {kernels::AttentionCudaKernels::tensor_core, kernels::AttentionCudaKernels::reference}) {
        INFO(dtype_name(dtype) << " head_dim " << head_dim << " " << kernels_name(which));
        const CudaKernelsScope scope(which);
        check_strided_heads(Device::cuda(), dtype, head_dim);
      }
    }
  }
}

TEST_CASE("attention: the tensor-core kernels match the reference kernels and the CPU, forward and backward, in float16 and bfloat16 [gpu]") {
  KILN_REQUIRE_GPU();
  using kernels::AttentionCudaKernels;
  struct Case {
    int64_t B, H, L, S;
    bool causal;
    int mask;  // 0 none, 1 additive (L, S), 2 bool key padding (B, 1, 1, S), 3 bool (L, S) with rows that allow no key
    bool unaligned = false;  // q, k, v start 2 bytes past a 16-byte boundary
  };
  // The CUDA parity case's list, then: six full 64-key blocks and a partial
  // 128-row block; rows without keys; the unaligned path, causal and masked;
  // 16 key blocks per CTA through the double buffer, causal.
  const std::vector<Case> cases = {{2, 3, 5, 7, false, 0},      {1, 2, 130, 70, false, 0},  {2, 2, 257, 257, true, 0},
                                   {1, 1, 70, 200, true, 0},    {2, 2, 33, 97, false, 1},   {2, 2, 64, 65, false, 2},
                                   {1, 1, 3, 0, false, 0},      {1, 2, 300, 384, false, 0}, {1, 2, 40, 90, false, 3},
                                   {1, 2, 70, 90, true, 0, true}, {2, 1, 129, 200, false, 2, true},
                                   {1, 2, 1024, 1024, true, 0}};
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tolerance tol = parity_tolerance(dtype);
    const double rtol = 2 * tol.rtol, atol = dtype == DType::f16 ? 1e-3 : 5e-3;
    for (int64_t E : {32, 64, 96, 128}) {
      REQUIRE(kernels::attention_tc::supports(dtype, E));
      for (const Case& c : cases) {
        INFO(dtype_name(dtype) << " E " << E << " B " << c.B << " H " << c.H << " L " << c.L << " S " << c.S
                               << (c.causal ? " causal" : "") << " mask " << c.mask << (c.unaligned ? " unaligned" : ""));
        const Tensor q = random_tensor({c.B, c.H, c.L, E}, 40, dtype), k = random_tensor({c.B, c.H, c.S, E}, 41, dtype),
                     v = random_tensor({c.B, c.H, c.S, E}, 42, dtype);
        Tensor mask;
        if (c.mask == 1) mask = random_tensor({c.L, c.S}, 43, dtype);
        if (c.mask == 2) mask = gt(random_tensor({c.B, 1, 1, c.S}, 44), -1.0);
        if (c.mask == 3) {  // about a third of the rows allow no key
          const std::vector<double> element = random_values(c.L * c.S, 45), row = random_values(c.L, 46);
          std::vector<uint8_t> allowed(static_cast<size_t>(c.L * c.S));
          for (size_t e = 0; e < allowed.size(); ++e) allowed[e] = row[e / static_cast<size_t>(c.S)] > -0.5 && element[e] > -1.0;
          mask = tensor<uint8_t>(allowed, {c.L, c.S}).to(DType::b8);
        }
        Tensor additive;  // the kernels' form of the mask
        if (c.mask == 1) additive = mask.to(DType::f32);
        if (c.mask >= 2) {
          additive = where(mask, zeros({}, {.dtype = DType::f32}),
                           full({}, -std::numeric_limits<double>::infinity(), {.dtype = DType::f32}));
        }
        const Tensor dout = random_tensor({c.B, c.H, c.L, E}, 47, DType::f32);

        // The CPU in float32 on the same (rounded) inputs.
        std::vector<Tensor> cpu = {q.to(DType::f32).detach().requires_grad_(), k.to(DType::f32).detach().requires_grad_(),
                                   v.to(DType::f32).detach().requires_grad_()};
        const Tensor cpu_out = scaled_dot_product_attention(cpu[0], cpu[1], cpu[2], mask, 0.0, c.causal);
        if (cpu_out.numel() > 0 && c.S > 0) cpu_out.backward(dout);

        // Both CUDA paths through the op, forward and backward.
        std::vector<Tensor> outs, grads[3];
        for (AttentionCudaKernels which : {AttentionCudaKernels::reference, AttentionCudaKernels::tensor_core}) {
          const CudaKernelsScope scope(which);
          std::vector<Tensor> gpu = {c.unaligned ? unaligned_cuda(q) : q.cuda(), c.unaligned ? unaligned_cuda(k) : k.cuda(),
                                     c.unaligned ? unaligned_cuda(v) : v.cuda()};
          for (Tensor& t : gpu) t.requires_grad_();
          const Tensor out = scaled_dot_product_attention(gpu[0], gpu[1], gpu[2], mask.defined() ? mask.cuda() : mask,
                                                          0.0, c.causal);
          outs.push_back(out.cpu().to(DType::f32));
          if (out.numel() > 0 && c.S > 0) {
            out.backward(dout.to(Device::cuda(), dtype));
            for (int i = 0; i < 3; ++i) grads[i].push_back(gpu[i].grad().cpu().to(DType::f32));
          }
        }
        KILN_CHECK_CLOSE(outs[1], cpu_out, rtol, atol);
        KILN_CHECK_CLOSE(outs[1], outs[0], rtol, atol);
        for (int i = 0; i < 3 && !grads[i].empty(); ++i) {
          INFO("gradient of input " << i);
          KILN_CHECK_CLOSE(grads[i][1], cpu[i].grad(), 4 * rtol, 4 * atol);
          KILN_CHECK_CLOSE(grads[i][1], grads[i][0], 4 * rtol, 4 * atol);
        }

        // The kernels called directly: every output element written (none
        // left NaN), lse equal on both paths (-inf for rows without keys).
        if (c.L == 0 || c.S == 0) continue;
        const Tensor gq = c.unaligned ? unaligned_cuda(q) : q.cuda(), gk = c.unaligned ? unaligned_cuda(k) : k.cuda(),
                     gv = c.unaligned ? unaligned_cuda(v) : v.cuda();
        const Tensor gdout = dout.to(Device::cuda(), dtype), gadditive = additive.defined() ? additive.cuda() : additive;
        const KernelOutputs ref = run_kernels(AttentionCudaKernels::reference, gq, gk, gv, gadditive, c.causal, gdout);
        const KernelOutputs fast = run_kernels(AttentionCudaKernels::tensor_core, gq, gk, gv, gadditive, c.causal, gdout);
        CHECK(nan_count(fast.out) == 0);
        CHECK(nan_count(fast.lse) == 0);
        CHECK(nan_count(fast.dq) == 0);
        CHECK(nan_count(fast.dk) == 0);
        CHECK(nan_count(fast.dv) == 0);
        KILN_CHECK_CLOSE(fast.out.cpu().to(DType::f32), ref.out.cpu().to(DType::f32), rtol, atol);
        KILN_CHECK_CLOSE(fast.lse.cpu(), ref.lse.cpu(), 1e-4, 1e-4);
        KILN_CHECK_CLOSE(fast.dq.cpu().to(DType::f32), ref.dq.cpu().to(DType::f32), 4 * rtol, 4 * atol);
        KILN_CHECK_CLOSE(fast.dk.cpu().to(DType::f32), ref.dk.cpu().to(DType::f32), 4 * rtol, 4 * atol);
        KILN_CHECK_CLOSE(fast.dv.cpu().to(DType::f32), ref.dv.cpu().to(DType::f32), 4 * rtol, 4 * atol);
      }
    }

    // Dropout: both CUDA paths and the CPU draw the same Philox words per
    // score (the backward regenerates them), causal and with an additive mask.
    for (int64_t E : {64, 128}) {
      for (bool causal : {true, false}) {
        INFO(dtype_name(dtype) << " dropout E " << E << (causal ? " causal" : " additive mask"));
        const Tensor q = random_tensor({2, 2, 70, E}, 48, dtype), k = random_tensor({2, 2, 90, E}, 49, dtype),
                     v = random_tensor({2, 2, 90, E}, 50, dtype);
        const Tensor mask = causal ? Tensor() : random_tensor({70, 90}, 51, dtype);
        const Tensor dout = random_tensor({2, 2, 70, E}, 52, DType::f32);
        std::vector<Tensor> cpu = {q.to(DType::f32).detach().requires_grad_(), k.to(DType::f32).detach().requires_grad_(),
                                   v.to(DType::f32).detach().requires_grad_()};
        manual_seed(5);
        const Tensor cpu_out = scaled_dot_product_attention(cpu[0], cpu[1], cpu[2], mask, 0.2, causal);
        cpu_out.backward(dout);
        std::vector<Tensor> outs, grads[3];
        for (AttentionCudaKernels which : {AttentionCudaKernels::reference, AttentionCudaKernels::tensor_core}) {
          INFO(kernels_name(which));
          const CudaKernelsScope scope(which);
          std::vector<Tensor> gpu = {q.cuda().requires_grad_(), k.cuda().requires_grad_(), v.cuda().requires_grad_()};
          manual_seed(5);
          const Tensor out = scaled_dot_product_attention(gpu[0], gpu[1], gpu[2], mask.defined() ? mask.cuda() : mask,
                                                          0.2, causal);
          out.backward(dout.to(Device::cuda(), dtype));
          outs.push_back(out.cpu().to(DType::f32));
          for (int i = 0; i < 3; ++i) grads[i].push_back(gpu[i].grad().cpu().to(DType::f32));
          KILN_CHECK_CLOSE(outs.back(), cpu_out, rtol, atol);
        }
        KILN_CHECK_CLOSE(outs[1], outs[0], rtol, atol);
        for (int i = 0; i < 3; ++i) {
          INFO("gradient of input " << i);
          KILN_CHECK_CLOSE(grads[i][1], cpu[i].grad(), 4 * rtol, 4 * atol);
          KILN_CHECK_CLOSE(grads[i][1], grads[i][0], 4 * rtol, 4 * atol);
        }
      }
    }
  }
}

// The tensor-core forward's candidate CTA shapes (bench_attention times them):
// each gives the default shape's out on the head dims it runs for (64; the
// wgmma shapes 128 too) on kKernelCases; and the knob refuses an index out of
// range. Last in the file: shape 12 waits on barriers (a bug there hangs, and
// the GPU kit's deadline would then cost the cases after it).
TEST_CASE("attention: every candidate CTA shape of the tensor-core forward gives the default's output [gpu]") {
  KILN_REQUIRE_GPU();
  struct Restore {
    int saved = kernels::attention_forward_shape();
    ~Restore() { kernels::set_attention_forward_shape(saved); }
  } restore;
  const int shapes = kernels::attention_forward_shape_count();
  CHECK(shapes >= 2);
  // The wgmma shapes (sm_90a) run on compute capability 9.0 only and refuse other GPUs.
  const cuda::DeviceProperties properties = cuda::device_properties(0);
  const bool sm90 = properties.major == 9 && properties.minor == 0;
  for (int64_t D : {64, 128}) {
    for (DType dtype : {DType::f16, DType::bf16}) {
      for (const KernelCase& c : kKernelCases) {
        const Tensor q = random_tensor({c.B, c.H, c.L, D}, 50, dtype).cuda();
        const Tensor k = random_tensor({c.B, c.H, c.S, D}, 51, dtype).cuda();
        const Tensor v = random_tensor({c.B, c.H, c.S, D}, 52, dtype).cuda();
        kernels::set_attention_forward_shape(0);
        const Tensor expected = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal).cpu().to(DType::f32);
        // The CPU in float32 on the same inputs: the default shape is right to begin with.
        const Tensor cpu = scaled_dot_product_attention(q.cpu().to(DType::f32), k.cpu().to(DType::f32),
                                                        v.cpu().to(DType::f32), Tensor(), 0.0, c.causal);
        const Tolerance tol = parity_tolerance(dtype);
        KILN_CHECK_CLOSE(expected, cpu, 2 * tol.rtol, dtype == DType::f16 ? 1e-3 : 5e-3);
        for (int index = 1; index < shapes; ++index) {
          if (!kernels::attention_forward_shape_applies(index, D)) continue;
          INFO(dtype_name(dtype) << " D " << D << " B " << c.B << " H " << c.H << " L " << c.L << " S " << c.S
                                 << (c.causal ? " causal" : "") << ", shape " << index << ": "
                                 << kernels::attention_forward_shape_name(index));
          kernels::set_attention_forward_shape(index);
          if (!sm90 && std::string(kernels::attention_forward_shape_name(index)).find("sm_90a") != std::string::npos) {
            CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal),
                                 doctest::Contains("compute capability 9.0"), Error);
            continue;
          }
          if (index >= 12) {  // kernels that wait on barriers: should one hang, the log's last line names it
            std::fprintf(stderr, "candidate shape %d, %s D %lld L %lld S %lld%s: launching\n", index,
                         std::string(dtype_name(dtype)).c_str(), static_cast<long long>(D), static_cast<long long>(c.L),
                         static_cast<long long>(c.S), c.causal ? " causal" : "");
            std::fflush(stderr);
          }
          const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal).cpu().to(DType::f32);
          KILN_CHECK_CLOSE(out, expected, 2 * tol.rtol, dtype == DType::f16 ? 1e-3 : 5e-3);
        }
      }
    }
  }
}

}  // namespace kiln::testing
