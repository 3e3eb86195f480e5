// scaled_dot_product_attention (core/nn_ops.h): torch's semantics on
// (..., L, E) tensors, computed by the fused kernels of kernels/attention.h
// (flash-style on CUDA, tiled on the CPU; the T x T matrix is never stored)
// with one autograd node that saves q, k, v, the output and the row
// log-sum-exp. Rank-4 inputs are read through their strides (the heads of a
// fused qkv projection need no copy), the output is laid out as the query is
// (so merging heads back to (B, T, E) is a view) and each input gradient as
// its input. Problems the fused kernels do not take (a value dim other than
// the query's, a head dim or dtype the CUDA kernels lack, a mask that needs a
// gradient) go through the same math written with matmul and softmax.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/launch.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/attention.h"

namespace kiln {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                  bool is_causal) {
  check_defined(q, kOp, "query");
  check_defined(k, kOp, "key");
  check_defined(v, kOp, "value");
  check_same_device(q, k, kOp);
  check_same_device(q, v, kOp);
  check_same_dtype(q, k, kOp);
  check_same_dtype(q, v, kOp);
  KILN_CHECK(is_floating(q.dtype()), kOp, ": expected floating query, key and value, got ", dtype_name(q.dtype()));
  KILN_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), kOp,
             ": expected query, key and value of the same rank >= 2, (..., L, E), (..., S, E) and (..., S, Ev); got ",
             shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  for (int64_t d = 0; d + 2 < q.dim(); ++d) {
    KILN_CHECK(k.size(d) == q.size(d) && v.size(d) == q.size(d), kOp,
               ": query, key and value must have the same batch dims, got ", shape_str(q.shape()), ", ",
               shape_str(k.shape()), " and ", shape_str(v.shape()));
  }
  KILN_CHECK(k.size(-1) == q.size(-1), kOp, ": key's last dim ", k.size(-1), " differs from query's ", q.size(-1),
             " (shapes ", shape_str(q.shape()), " and ", shape_str(k.shape()), ")");
  KILN_CHECK(v.size(-2) == k.size(-2), kOp, ": value has ", v.size(-2), " positions and key ", k.size(-2),
             " (shapes ", shape_str(k.shape()), " and ", shape_str(v.shape()), ")");
  KILN_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, kOp, ": dropout_p must be in [0, 1), got ", dropout_p);
  if (mask.defined()) {
    KILN_CHECK(!is_causal, kOp, ": an explicit attn_mask cannot be combined with is_causal = true (as in torch)");
    KILN_CHECK(mask.dtype() == DType::b8 || is_floating(mask.dtype()), kOp,
               ": attn_mask must be bool or floating, got ", dtype_name(mask.dtype()));
    KILN_CHECK(mask.device() == q.device(), kOp, ": attn_mask is on ", mask.device(), ", query on ", q.device());
    Shape scores = q.shape();
    scores.back() = k.size(-2);
    bool broadcasts = mask.dim() <= static_cast<int64_t>(scores.size());
    for (int64_t d = 1; broadcasts && d <= mask.dim(); ++d) {
      const int64_t size = mask.size(-d);
      broadcasts = size == 1 || size == scores[scores.size() - static_cast<size_t>(d)];
    }
    KILN_CHECK(broadcasts, kOp, ": attn_mask of shape ", shape_str(mask.shape()),
               " does not broadcast to the scores' shape ", shape_str(scores), " (..., L, S)");
  }
}

// The mask as additive values in `dtype` (0 where a boolean mask is true,
// -inf where it is false), not expanded.
Tensor additive_mask(const Tensor& mask, DType dtype) {
  if (!mask.defined()) return Tensor();
  NoGradGuard no_grad;
  if (mask.dtype() != DType::b8) return mask.to(dtype);
  const TensorOptions like{.dtype = dtype, .device = mask.device()};
  return where(mask, zeros({}, like), full({}, -std::numeric_limits<double>::infinity(), like));
}

// The dtype the kernels read masks in: float64 for a float64 problem, else float32.
DType mask_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

// The same math with matmul and softmax: problems the fused kernels do not
// take, and the mask's gradient. A row with no allowed key gives zeros (torch
// >= 2.5), with zero gradients: its scores are replaced before the softmax.
Tensor composite_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                           bool is_causal, double scale) {
  const int64_t L = q.size(-2), S = k.size(-2);
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), scale);
  Tensor additive;
  if (is_causal) {
    // Made on the device: no host copy per call (nor one a CUDA graph's capture would refuse).
    additive = triu(full({L, S}, -std::numeric_limits<double>::infinity(), {.dtype = DType::f32, .device = q.device()}),
                    1);
  } else if (mask.defined()) {
    additive = mask.dtype() == DType::b8 ? additive_mask(mask, scores.dtype()) : mask;
  }
  if (additive.defined()) {
    scores = add(scores, cast(additive, scores.dtype()));
    // Rows with no allowed key: softmax over zeros, then zeroed.
    const TensorOptions like{.dtype = scores.dtype(), .device = scores.device()};
    Tensor allowed = gt(amax(scores, {-1}, /*keepdim=*/true), -std::numeric_limits<double>::infinity());
    scores = where(allowed, scores, zeros({}, like));
    Tensor probs = mul(softmax(scores, -1), cast(allowed, scores.dtype()));
    return matmul(dropout(probs, dropout_p), v);
  }
  return matmul(dropout(softmax(scores, -1), dropout_p), v);
}

// x (..., T, D) as the kernels' (B, H, T, D): a view when its leading dims
// fold into B and H and its last dim is dense (the heads of a fused qkv
// projection are read in place), else a dense copy.
Tensor as_heads(const Tensor& x, int64_t B, int64_t H) {
  Tensor heads = x.reshape({B, H, x.size(-2), x.size(-1)});
  if (heads.stride(3) != 1 && heads.size(3) > 1) heads = heads.contiguous();
  return heads;
}

kernels::AttentionLayout layout_of(const Tensor& heads) {
  return {heads.stride(0), heads.stride(1), heads.stride(2), /*strided=*/true};
}

// A new dense (B, H, T, D) tensor whose dims lie in memory in the order of
// `like`'s strides (torch's empty_like): out for q read from a (B, T, H, D)
// projection is written (B, T, H, D), so merging its heads back to (B, T, E)
// is a view, and dq lands where the projection's gradient needs it.
Tensor empty_heads_like(const Tensor& like, DType dtype) {
  std::vector<int64_t> order = {0, 1, 2};  // outermost first
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  order.push_back(3);
  Shape shape;
  for (int64_t d : order) shape.push_back(like.size(d));
  std::vector<int64_t> back(4);
  for (int64_t i = 0; i < 4; ++i) back[order[i]] = i;
  return empty(shape, {.dtype = dtype, .device = like.device()}).permute(back);
}

// (B, H) of the fused kernels for inputs of rank `rank` with leading dims `lead`.
std::pair<int64_t, int64_t> batch_heads(const Shape& lead) {
  if (lead.empty()) return {1, 1};
  int64_t batch = 1;
  for (size_t d = 0; d + 1 < lead.size(); ++d) batch *= lead[d];
  return {batch, lead.back()};
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&query, &key, &value})) {
    return scaled_dot_product_attention(to(query), to(key), to(value), attn_mask, dropout_p, is_causal, scale);
  }
  check_inputs(query, key, value, attn_mask, dropout_p, is_causal);
  const DType dtype = query.dtype();
  if (query.is_cpu() && (dtype == DType::f16 || dtype == DType::bf16)) {
    // The CPU computes 16-bit types in float32; under autocast the float32
    // call would be cast back to bfloat16, and so on without end.
    AutocastGuard float32_kernel(DeviceType::cpu, DType::bf16, /*enabled=*/false);
    return scaled_dot_product_attention(query.to(DType::f32), key.to(DType::f32), value.to(DType::f32), attn_mask,
                                        dropout_p, is_causal, scale)
        .to(dtype);
  }
  const int64_t E = query.size(-1), L = query.size(-2), S = key.size(-2);
  const double softmax_scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  const bool fused = value.size(-1) == E && !(attn_mask.defined() && attn_mask.requires_grad()) &&
                     (query.is_cpu() || kernels::attention_cuda_supports(dtype, E));
  if (!fused) return composite_attention(query, key, value, attn_mask, dropout_p, is_causal, softmax_scale);

  const Shape lead(query.shape().begin(), query.shape().end() - 2);
  const auto [B, H] = batch_heads(lead);
  kernels::AttentionArgs args;
  args.dtype = dtype;
  args.batch = B;
  args.heads = H;
  args.q_len = L;
  args.kv_len = S;
  args.head_dim = E;
  args.causal = is_causal;
  args.scale = softmax_scale;
  args.dropout_p = static_cast<float>(dropout_p);

  // Inputs of rank 4 are read through their strides and out takes q's
  // layout; other ranks fold their leading dims into dense (B, H, ...) tensors.
  const bool strided = query.dim() == 4;
  Tensor q, k, v, mask, out, out_heads, lse;
  {
    NoGradGuard no_grad;
    q = strided ? as_heads(query, B, H) : query.contiguous().reshape({B, H, L, E});
    k = strided ? as_heads(key, B, H) : key.contiguous().reshape({B, H, S, E});
    v = strided ? as_heads(value, B, H) : value.contiguous().reshape({B, H, S, E});
    args.q_layout = layout_of(q);
    args.k_layout = layout_of(k);
    args.v_layout = layout_of(v);
    if (attn_mask.defined()) {
      Shape scores = query.shape();
      scores.back() = S;
      mask = additive_mask(attn_mask, mask_dtype(dtype)).expand(scores);
      // Strides over (B, H, L, S): two leading dims or fewer map directly; more
      // are folded into B, which needs them dense.
      if (lead.size() > 2) mask = mask.contiguous();
      mask = mask.reshape({B, H, L, S});
      if (dtype == DType::f64) {
        args.mask.data_f64 = mask.data<double>();
      } else {
        args.mask.data = mask.data<float>();
      }
      args.mask.stride_b = mask.stride(0);
      args.mask.stride_h = mask.stride(1);
      args.mask.stride_q = mask.stride(2);
      args.mask.stride_k = mask.stride(3);
    }
    args.q = q.data_ptr();
    args.k = k.data_ptr();
    args.v = v.data_ptr();
    out_heads = strided ? empty_heads_like(q, dtype) : empty({B, H, L, E}, {.dtype = dtype, .device = query.device()});
    args.out_layout = layout_of(out_heads);
    lse = empty({B, H, L}, {.dtype = dtype == DType::f64 ? DType::f64 : DType::f32, .device = query.device()});
    if (dropout_p > 0.0 && out_heads.numel() > 0) {
      const GeneratorState state = default_generator(query.device()).advance(kernels::attention_dropout_counters(args));
      args.seed = state.seed;
      args.offset = state.offset;
      args.replay = state.replay;
    }
    if (out_heads.numel() > 0) {
      if (query.is_cpu()) {
        kernels::attention_forward_cpu(args, out_heads.data_ptr(), lse.data_ptr());
      } else {
        kernels::attention_forward_cuda(args, out_heads.data_ptr(), lse.data_ptr(), launch_on(query, kOp).stream);
      }
    }
    out = out_heads.reshape(query.shape());  // a view: dense, or rank 4
  }
  if (autograd::any_requires_grad({&query, &key, &value})) {
    const bool need_dq = query.requires_grad(), need_dk = key.requires_grad(), need_dv = value.requires_grad();
    autograd::record(
        kOp, {query, key, value}, {out},
        [args, mask, need_dq, need_dk, need_dv, sq = autograd::SavedTensor(q, kOp), sk = autograd::SavedTensor(k, kOp),
         sv = autograd::SavedTensor(v, kOp), so = autograd::SavedTensor(out_heads, kOp),  // not out: a cycle
         lse, query_shape = query.shape(), key_shape = key.shape(),
         value_shape = value.shape()](const autograd::TensorList& grads) -> autograd::TensorList {
          const Tensor q = sq.unpack(), k = sk.unpack(), v = sv.unpack(), out = so.unpack();
          const int64_t B = q.size(0), H = q.size(1);
          const Tensor dout = as_heads(grads[0], B, H);
          const DType dtype = q.dtype();
          // Each gradient laid out as its input's heads (rank 4), then in the input's shape.
          const auto gradient = [&](bool needed, const Tensor& like) {
            return needed ? empty_heads_like(like, dtype) : Tensor();
          };
          Tensor dq = gradient(need_dq, q), dk = gradient(need_dk, k), dv = gradient(need_dv, v);
          const auto shaped = [](const Tensor& heads, const Shape& shape) {
            return heads.defined() ? heads.reshape(shape) : Tensor();
          };
          if (q.numel() == 0 || k.numel() == 0) {
            for (Tensor* t : {&dq, &dk, &dv}) {
              if (t->defined()) t->zero_();
            }
            return {shaped(dq, query_shape), shaped(dk, key_shape), shaped(dv, value_shape)};
          }
          kernels::AttentionGradArgs grad_args;
          grad_args.forward = args;
          grad_args.forward.q = q.data_ptr();
          grad_args.forward.k = k.data_ptr();
          grad_args.forward.v = v.data_ptr();
          grad_args.forward.q_layout = layout_of(q);
          grad_args.forward.k_layout = layout_of(k);
          grad_args.forward.v_layout = layout_of(v);
          grad_args.forward.out_layout = layout_of(out);
          grad_args.dout_layout = layout_of(dout);
          if (dq.defined()) grad_args.dq_layout = layout_of(dq);
          if (dk.defined()) grad_args.dk_layout = layout_of(dk);
          if (dv.defined()) grad_args.dv_layout = layout_of(dv);
          if (mask.defined() && mask.dtype() == DType::f64) {
            grad_args.forward.mask.data_f64 = mask.data<double>();
          } else if (mask.defined()) {
            grad_args.forward.mask.data = mask.data<float>();
          }
          grad_args.out = out.data_ptr();
          grad_args.lse = lse.data_ptr();
          grad_args.dout = dout.data_ptr();
          grad_args.dq = need_dq ? dq.data_ptr() : nullptr;
          grad_args.dk = need_dk ? dk.data_ptr() : nullptr;
          grad_args.dv = need_dv ? dv.data_ptr() : nullptr;
          if (q.is_cpu()) {
            kernels::attention_backward_cpu(grad_args);
          } else {
            const cuda::DeviceScope scope(q.device().index, kOp);
            const size_t bytes = kernels::attention_backward_workspace_bytes(grad_args);
            Tensor workspace = empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                                     {.dtype = DType::u8, .device = q.device()});
            kernels::attention_backward_cuda(grad_args, workspace.data_ptr(), scope.stream);
          }
          return {shaped(dq, query_shape), shaped(dk, key_shape), shaped(dv, value_shape)};
        });
  }
  return out;
}

}  // namespace kiln
