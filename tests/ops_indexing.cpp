// Op-table rows of the indexing family (core/ops/indexing.cpp). Every sample
// has repeated indices (so the backward must accumulate), odd sizes, and an
// empty index. Index inputs are int64, drawn deterministically from the seed
// within the indexed dim's size; only the floating inputs are gradchecked.
#include <random>

#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;

// int64 indices in [0, bound) of `shape`. With `repeat` and at least two
// elements, the last element repeats the first (a guaranteed duplicate).
Tensor random_index(const Shape& shape, int64_t bound, uint64_t seed, bool repeat) {
  std::mt19937_64 engine(seed * 7919 + 17);
  std::vector<int64_t> values(static_cast<size_t>(shape_numel(shape)));
  for (int64_t& v : values) v = static_cast<int64_t>(engine() % static_cast<uint64_t>(bound));
  if (repeat && values.size() >= 2) values.back() = values.front();
  return tensor<int64_t>(values, shape);
}

// Floating inputs for the shapes of `sample` at `float_slots`, an index at
// `index_slot` bounded by the size of input `bounded_by` along `dim`.
Inputs make_indexed_inputs(const OpSample& sample, DType dtype, uint64_t seed, std::vector<size_t> float_slots,
                           size_t index_slot, size_t bounded_by, int64_t dim) {
  OpSample floats;
  for (size_t slot : float_slots) floats.shapes.push_back(sample.shapes[slot]);
  Inputs made = default_inputs(floats, dtype, seed);
  Inputs inputs(sample.shapes.size());
  for (size_t k = 0; k < float_slots.size(); ++k) inputs[float_slots[k]] = made[k];
  const Shape& bounded = sample.shapes[bounded_by];
  const int64_t d = dim < 0 ? dim + static_cast<int64_t>(bounded.size()) : dim;
  inputs[index_slot] = random_index(sample.shapes[index_slot], bounded[d], seed, /*repeat=*/true);
  return inputs;
}

OpInfo index_select_row(int64_t dim, std::vector<OpSample> samples) {
  OpInfo row;
  row.name = "index_select dim " + std::to_string(dim);
  row.fn = [dim](const Inputs& in) { return index_select(in[0], dim, in[1]); };
  row.samples = std::move(samples);
  row.make_inputs = [dim](const OpSample& sample, DType dtype, uint64_t seed) {
    return make_indexed_inputs(sample, dtype, seed, {0}, 1, 0, dim);
  };
  row.grad_inputs = {0};
  return row;
}

OpInfo gather_row(int64_t dim, std::vector<OpSample> samples) {
  OpInfo row;
  row.name = "gather dim " + std::to_string(dim);
  row.fn = [dim](const Inputs& in) { return gather(in[0], dim, in[1]); };
  row.samples = std::move(samples);
  row.make_inputs = [dim](const OpSample& sample, DType dtype, uint64_t seed) {
    return make_indexed_inputs(sample, dtype, seed, {0}, 1, 0, dim);
  };
  row.grad_inputs = {0};
  return row;
}

OpInfo scatter_add_row(int64_t dim, std::vector<OpSample> samples) {
  OpInfo row;
  row.name = "scatter_add dim " + std::to_string(dim);
  row.fn = [dim](const Inputs& in) { return scatter_add(in[0], dim, in[1], in[2]); };
  row.samples = std::move(samples);
  row.make_inputs = [dim](const OpSample& sample, DType dtype, uint64_t seed) {
    return make_indexed_inputs(sample, dtype, seed, {0, 2}, 1, 0, dim);
  };
  row.grad_inputs = {0, 2};
  return row;
}

}  // namespace

std::vector<OpInfo> indexing_op_infos() {
  std::vector<OpInfo> rows;
  // Shapes: {input, index}; more indices than rows guarantees repeats.
  rows.push_back(index_select_row(0, {{{{5, 3}, {7}}, "repeated indices"},
                                      {{{7, 3, 5}, {4}}, "3-d odd sizes"},
                                      {{{5, 3}, {0}}, "empty index"}}));
  rows.push_back(index_select_row(1, {{{{4, 6}, {9}}, "repeated indices"},
                                      {{{3, 5, 2}, {3}}, "3-d odd sizes"},
                                      {{{4, 6}, {0}}, "empty index"}}));
  // Shapes: {input, index}; the index is longer than the input along dim.
  rows.push_back(gather_row(0, {{{{4, 5}, {6, 3}}, "repeated indices"},
                                {{{3, 5, 7}, {5, 2, 7}}, "3-d odd sizes"},
                                {{{4, 5}, {0, 3}}, "empty index"}}));
  rows.push_back(gather_row(1, {{{{4, 5}, {3, 7}}, "repeated indices"},
                                {{{3, 5, 7}, {3, 8, 7}}, "3-d odd sizes"},
                                {{{4, 5}, {4, 0}}, "empty index"}}));
  rows.push_back(gather_row(-1, {{{{3, 4, 5}, {2, 4, 6}}, "repeated indices"}, {{{7, 3}, {7, 9}}, "2-d odd sizes"}}));
  // Shapes: {input, index, src}; src may be larger than the index.
  rows.push_back(scatter_add_row(0, {{{{4, 5}, {6, 3}, {6, 4}}, "repeated indices, larger src"},
                                     {{{3, 5, 7}, {5, 2, 7}, {5, 2, 7}}, "3-d odd sizes"},
                                     {{{4, 5}, {0, 3}, {2, 3}}, "empty index"}}));
  rows.push_back(scatter_add_row(1, {{{{4, 5}, {3, 7}, {3, 7}}, "repeated indices"},
                                     {{{3, 5, 7}, {3, 8, 7}, {3, 9, 7}}, "3-d odd sizes, larger src"}}));
  rows.push_back(scatter_add_row(-1, {{{{3, 4, 5}, {2, 4, 6}, {2, 4, 6}}, "repeated indices"},
                                      {{{7, 3}, {7, 9}, {7, 9}}, "2-d odd sizes"}}));

  OpInfo embedding_row;
  embedding_row.name = "embedding";
  embedding_row.fn = [](const Inputs& in) { return embedding(in[0], in[1]); };
  // Shapes: {weight (num, dim), indices}.
  embedding_row.samples = {{{{10, 4}, {3, 5}}, "2-d indices"},
                           {{{7, 3}, {11}}, "1-d indices, odd sizes"},
                           {{{5, 3}, {0}}, "empty indices"}};
  embedding_row.make_inputs = [](const OpSample& sample, DType dtype, uint64_t seed) {
    return make_indexed_inputs(sample, dtype, seed, {0}, 1, 0, 0);
  };
  embedding_row.grad_inputs = {0};
  rows.push_back(std::move(embedding_row));
  return rows;
}

}  // namespace kiln::testing
