// Op-table rows of the joining and splitting family (core/ops/shape.cpp).
// split and chunk return several views; their rows return the cat of the
// pieces, each multiplied by a distinct constant, so the gradcheck sees every
// piece (a wrong or swapped piece gradient changes the result).
#include "core/ops.h"
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

// cat of piece k times (k + 1) along dim.
Tensor weighted_cat(const std::vector<Tensor>& pieces, int64_t dim) {
  std::vector<Tensor> scaled;
  for (size_t k = 0; k < pieces.size(); ++k) scaled.push_back(mul(pieces[k], static_cast<double>(k + 1)));
  return cat(scaled, dim);
}

}  // namespace

std::vector<OpInfo> shape_op_infos() {
  std::vector<OpInfo> rows;
  rows.push_back(row("cat dim 0", [](const Inputs& in) { return cat(in, 0); },
                     {{{{2, 3}, {4, 3}}, "2 tensors"},
                      {{{1, 5}, {3, 5}, {2, 5}}, "3 tensors, odd sizes"},
                      {{{2, 3}, {0, 3}}, "one empty"},
                      {{{2, 3}, {0}}, "legacy (0,) skipped"}}));
  rows.push_back(row("cat dim 1", [](const Inputs& in) { return cat(in, 1); },
                     {{{{2, 3}, {2, 1}}, "2 tensors"}, {{{3, 2, 4}, {3, 5, 4}, {3, 1, 4}}, "3 tensors, 3-d"}}));
  rows.push_back(row("cat dim -1", [](const Inputs& in) { return cat(in, -1); },
                     {{{{2, 3, 2}, {2, 3, 5}}, "2 tensors"}, {{{4, 3}, {4, 1}, {4, 7}}, "3 tensors"}}));
  rows.push_back(row("stack dim 0", [](const Inputs& in) { return stack(in, 0); },
                     {{{{2, 3}, {2, 3}}, "2 tensors"}, {{{5}, {5}, {5}}, "3 tensors, 1-d"}, {{{}, {}}, "0-d"}}));
  rows.push_back(row("stack dim -1", [](const Inputs& in) { return stack(in, -1); },
                     {{{{2, 3}, {2, 3}, {2, 3}}, "3 tensors"}, {{{3, 1, 2}, {3, 1, 2}}, "3-d"}}));
  rows.push_back(row("split size", [](const Inputs& in) { return weighted_cat(split(in[0], 3, 0), 0); },
                     {{{{7, 4}}, "uneven last piece"}, {{{6, 2}}, "even"}, {{{2, 5}}, "one piece"}}));
  rows.push_back(row("split sizes",
                     [](const Inputs& in) { return weighted_cat(split(in[0], std::vector<int64_t>{2, 5, 1}, -1), -1); },
                     {{{{3, 8}}, "2-d"}, {{{2, 3, 8}}, "3-d"}}));
  rows.push_back(row("chunk", [](const Inputs& in) { return weighted_cat(chunk(in[0], 3, 1), 1); },
                     {{{{5, 7}}, "uneven last piece"}, {{{2, 6}}, "even"}, {{{3, 2}}, "fewer pieces than chunks"}}));
  rows.push_back(row("tril", [](const Inputs& in) { return tril(in[0]); },
                     {{{{4, 5}}, "(4,5)"}, {{{2, 5, 3}}, "batch (2,5,3)"}, {{{0, 3}}, "empty"}}));
  rows.push_back(row("tril diagonal -1", [](const Inputs& in) { return tril(in[0], -1); }, {{{{5, 4}}, "(5,4)"}}));
  rows.push_back(row("triu", [](const Inputs& in) { return triu(in[0]); }, {{{{4, 5}}, "(4,5)"}, {{{2, 5, 3}}, "batch"}}));
  rows.push_back(row("triu diagonal 2", [](const Inputs& in) { return triu(in[0], 2); }, {{{{3, 6}}, "(3,6)"}}));
  return rows;
}

}  // namespace kiln::testing
