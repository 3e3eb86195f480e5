// The differentiable ops. Each family lives in core/ops/<family>.cpp (front
// end, autograd node, backward) with kernels in kernels/cpu/<family>.cpp and
// kernels/cuda/<family>.cu, a row in tests/test_op_table.cpp, and a bench case.
//
// Every op checks its inputs and throws kiln::Error naming the op, the shapes,
// dtypes and devices involved and what it expected. Binary ops broadcast like
// NumPy; both operands must be on the same device and (except for the scalar
// overloads) have the same dtype.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// ---------------------------------------------------------------- elementwise
// a + alpha * b
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor pow(const Tensor& x, const Tensor& exponent);
Tensor relu(const Tensor& x);
// approximate: "none" (exact, erf) or "tanh"
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
// condition (bool) ? a : b, broadcasting all three.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// Comparisons return bool tensors and have no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
// True where the value is finite; isfinite(x).all() is all_finite.
Tensor isfinite(const Tensor& x);
// Converts dtype (differentiable between floating dtypes).
Tensor cast(const Tensor& x, DType dtype);

// ---------------------------------------------------------------- reductions
// dims empty means all dims.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// correction 1 is the unbiased estimate (torch.var default).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
struct ValuesIndices {
  Tensor values;
  Tensor indices;  // int64
};
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// p-norm over dims (p = 2 by default; inf for max-abs).
Tensor norm(const Tensor& x, double p = 2.0, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// One bool: every element is finite.
Tensor all(const Tensor& x);
// Running sum along dim (torch.cumsum); integer and bool inputs give int64.
// The gradient is the reversed running sum of the gradient.
Tensor cumsum(const Tensor& x, int64_t dim);
// The k largest (largest = false: smallest) values along dim, in order, with
// their int64 indices (torch.topk, sorted = true). Ties go to the lower index;
// NaN counts as the largest value. Gradients flow to the chosen elements.
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

// ---------------------------------------------------------------- linear algebra
// (.., n, k) @ (.., k, m) with batch broadcasting; 1-D operands as in torch.matmul.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);    // (n, k) @ (k, m)
Tensor bmm(const Tensor& a, const Tensor& b);   // (B, n, k) @ (B, k, m)
// x (.., in) @ weight (out, in)^T + bias (out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// Whether float32 matmuls may use TF32 tensor cores on the GPU (default false).
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---------------------------------------------------------------- softmax and losses
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
enum class Reduction { none, mean, sum };
// Fused log-softmax + NLL over logits (N, C) or (N, C, d...) and int64 targets
// (N) or (N, d...), as torch.nn.functional.cross_entropy.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight = Tensor(),
                     int64_t ignore_index = -100, double label_smoothing = 0.0,
                     Reduction reduction = Reduction::mean);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight = Tensor(),
                int64_t ignore_index = -100, Reduction reduction = Reduction::mean);

// ---------------------------------------------------------------- indexing
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// x where the bool mask (broadcast to x's shape) is false, `value` where it is
// true (torch.Tensor.masked_fill); the gradient flows where the mask is false.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// The lower (tril) or upper (triu) triangle of the last two dims, zeros
// elsewhere: tril keeps col - row <= diagonal, triu col - row >= diagonal.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// A copy of x with src added at index along dim (out-of-place scatter_add).
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Rows of weight (num, dim) for integer indices of any shape.
Tensor embedding(const Tensor& weight, const Tensor& indices);

// ---------------------------------------------------------------- joining and splitting
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---------------------------------------------------------------- random
// Zeroes each element with probability p and scales the rest by 1/(1-p); the
// mask is drawn in the kernel from the default generator (Philox).
Tensor dropout(const Tensor& x, double p, bool training = true);
// num_samples int64 indices per row of probs (1-D, or 2-D rows), drawn with
// weights proportional to the row (torch.multinomial): without replacement by
// an exponential race (Gumbel-top-k), with replacement one race per sample.
// Refuses rows with a negative, infinite or NaN weight or a zero sum, and more
// samples than nonzero weights without replacement; those checks read the
// device (one synchronization per call).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

// ---------------------------------------------------------------- operators
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);

}  // namespace kiln
