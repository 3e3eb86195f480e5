// Op-table rows for the view ops of core/tensor.cpp (view, reshape, permute,
// transpose, t, narrow, slice, select, expand, squeeze, unsqueeze, flatten,
// clone, contiguous, to(dtype)), so that the table's float64 gradcheck covers
// their backward functions, also on non-contiguous inputs. Each fn is written
// to accept every sample shape of its row.
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {
using Inputs = std::vector<Tensor>;

OpInfo row(std::string name, std::function<Tensor(const Inputs&)> fn, std::vector<OpSample> samples) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = std::move(fn);
  info.samples = std::move(samples);
  return info;
}

// Splits the leading dim into (2, n/2): a view of any strides.
Tensor split_leading(const Tensor& x) {
  Shape shape = x.shape();
  shape[0] = -1;
  shape.insert(shape.begin(), 2);
  return x.view(shape);
}

// Broadcasts every size-1 dim to 4 and prepends a dim of 2.
Tensor expand_ones(const Tensor& x) {
  Shape target = {2};
  for (int64_t size : x.shape()) target.push_back(size == 1 ? 4 : size);
  return x.expand(target);
}
}  // namespace

std::vector<OpInfo> view_op_infos() {
  std::vector<OpInfo> rows;
  rows.push_back(row("view", [](const Inputs& in) { return split_leading(in[0]); },
                     {{{{6, 3, 4}}, "3-d"}, {{{4, 5}}, "2-d"}, {{{8}}, "1-d"}, {{{0, 4}}, "empty"}}));
  rows.push_back(row("view -1 merge", [](const Inputs& in) { return in[0].contiguous().view({-1}); },
                     {{{{3, 4}}, "2-d"}}));
  rows.push_back(row("reshape", [](const Inputs& in) { return in[0].reshape({-1, 2}); },
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}}));
  rows.push_back(row("reshape non-contiguous",
                     [](const Inputs& in) { return in[0].transpose(0, 1).reshape({-1}); },  // copies
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}}));
  rows.push_back(row("permute", [](const Inputs& in) { return in[0].permute({2, 0, 1}); },
                     {{{{2, 3, 4}}, "3-d"}, {{{1, 5, 2}}, "size-1 dim"}}));
  rows.push_back(row("transpose", [](const Inputs& in) { return in[0].transpose(0, -1); },
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}, {{{0, 3}}, "empty"}}));
  rows.push_back(row("t", [](const Inputs& in) { return in[0].t(); }, {{{{3, 4}}, "2-d"}, {{{5}}, "1-d"}}));
  rows.push_back(row("narrow", [](const Inputs& in) { return in[0].narrow(1, 1, 2); },
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}}));
  rows.push_back(row("slice step 2",
                     [](const Inputs& in) { return in[0].slice(-1, 1, in[0].size(-1), 2); },
                     {{{{3, 5}}, "odd"}, {{{2, 3, 6}}, "even"}}));
  rows.push_back(row("slice negative bounds", [](const Inputs& in) { return in[0].slice(0, -3, -1); },
                     {{{{5, 2}}, "2-d"}}));
  rows.push_back(row("select", [](const Inputs& in) { return in[0].select(1, -1); },
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}}));
  rows.push_back(row("expand", [](const Inputs& in) { return expand_ones(in[0]); },
                     {{{{3, 1}}, "column"}, {{{1, 5}}, "row"}, {{{3}}, "1-d"}}));
  rows.push_back(row("squeeze", [](const Inputs& in) { return in[0].squeeze(); },
                     {{{{3, 1, 4}}, "middle"}, {{{1, 5, 1}}, "ends"}}));
  rows.push_back(row("squeeze dim", [](const Inputs& in) { return in[0].squeeze(1); },
                     {{{{3, 1, 4}}, "size 1"}, {{{3, 2}}, "size 2: unchanged"}}));
  rows.push_back(row("unsqueeze", [](const Inputs& in) { return in[0].unsqueeze(1); },
                     {{{{3, 4}}, "2-d"}, {{{5}}, "1-d"}}));
  rows.push_back(row("flatten", [](const Inputs& in) { return in[0].flatten(); },
                     {{{{2, 3, 4}}, "3-d"}, {{{4, 5}}, "2-d"}}));
  rows.push_back(row("flatten from 1", [](const Inputs& in) { return in[0].flatten(1); },
                     {{{{2, 3, 4}}, "3-d"}}));
  rows.push_back(row("clone", [](const Inputs& in) { return in[0].clone(); },
                     {{{{3, 4}}, "2-d"}, {{{7}}, "1-d"}}));
  rows.push_back(row("contiguous", [](const Inputs& in) { return in[0].transpose(0, 1).contiguous(); },
                     {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}}));

  // f64 -> f32 -> f64 loses precision, which a central difference with eps 1e-6
  // cannot tell from a wrong gradient: forward and parity only.
  OpInfo cast_row = row("to f32 and back", [](const Inputs& in) { return in[0].to(DType::f32).to(in[0].dtype()); },
                        {{{{3, 4}}, "2-d"}, {{{2, 3, 4}}, "3-d"}});
  cast_row.differentiable = false;
  rows.push_back(std::move(cast_row));
  return rows;
}

}  // namespace kiln::testing
