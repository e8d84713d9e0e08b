// ops/embedding: token embedding lookup plus an optional learned position embedding.
//
// Backward is deterministic without scatter races: the token-table gradient is split by feature columns (each
// task owns a column block of the whole table and walks every position in order), the position-table gradient
// by positions (each sums its batch entries in order). So the result does not depend on the thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/parallel.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/embedding.cuh"
#include "kernels/index_check.cuh"
#endif

namespace proplab::ops {

namespace {

// Backward column blocks are multiples of one cache line of floats.
constexpr std::int64_t kColumnQuantum = 16;
constexpr std::int64_t kParallelMin = 1 << 15;

[[noreturn]] void throw_token_outside(const char* op, std::int32_t token, std::int64_t position, std::int64_t vocab) {
  throw UserError(std::string("op '") + op + "': token id " + std::to_string(token) + " at position " +
                  std::to_string(position) + " is outside the vocabulary [0, " + std::to_string(vocab) +
                  "); the data and the model's vocab_size disagree");
}

// UserError naming the first token id outside [0, vocab): a data set built for another vocabulary.
void check_token_range(const char* op, const std::int32_t* tokens, std::int64_t count, std::int64_t vocab) {
  std::int64_t first_bad = count;
#pragma omp parallel for simd reduction(min : first_bad) if (count > kParallelMin)
  for (std::int64_t i = 0; i < count; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab) first_bad = std::min(first_bad, i);
  if (first_bad < count) throw_token_outside(op, tokens[first_bad], first_bad, vocab);
}

#ifdef PROPLAB_WITH_CUDA
// check_token_range for token ids on the device.
void check_token_range_cuda(const char* op, const std::int32_t* tokens, std::int64_t count, std::int64_t vocab) {
  const kernels::IdOutside bad = kernels::first_id_outside(tokens, count, 0, vocab);
  if (bad.index < count) throw_token_outside(op, bad.value, bad.index, vocab);
}
#endif

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor* pos_table, Tensor& y) {
  constexpr const char* op = "embedding_forward";
  PROPLAB_CHECK(tokens.ndim() == 2, "op '", op, "': tokens must be [B, T], got ", shape_string(tokens.shape()));
  PROPLAB_CHECK(token_table.ndim() == 2, "op '", op, "': token_table must be [V, D], got ",
                shape_string(token_table.shape()));
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  const std::int64_t vocab = token_table.dim(0), features = token_table.dim(1);
  expect_shape(op, "tokens", tokens, tokens.shape(), DType::i32);
  expect_shape(op, "token_table", token_table, token_table.shape());
  if (pos_table) {
    PROPLAB_CHECK(pos_table->ndim() == 2 && pos_table->dim(0) >= seq && pos_table->dim(1) == features, "op '", op,
                  "': pos_table must be [T_max >= ", seq, ", ", features, "], got ", shape_string(pos_table->shape()));
    expect_shape(op, "pos_table", *pos_table, pos_table->shape());
  }
  expect_shape(op, "y", y, {batch, seq, features});
  const Device device = common_device(op, {&tokens, &token_table, pos_table, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    check_token_range_cuda(op, tokens.i32(), batch * seq, vocab);
    kernels::embedding_gather(tokens.i32(), batch * seq, seq, token_table.f32(), 0, vocab,
                              pos_table ? pos_table->f32() : nullptr, features, y.f32());
    return;
#else
    missing_device_impl(op, device);
#endif
  }

  const std::int32_t* ids = tokens.i32();
  const std::int64_t positions = batch * seq;
  check_token_range(op, ids, positions, vocab);
  const float* table = token_table.f32();
  const float* pos = pos_table ? pos_table->f32() : nullptr;
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
  for (std::int64_t p = 0; p < positions; ++p) {
    const float* token_row = table + static_cast<std::int64_t>(ids[p]) * features;
    float* out_row = out + p * features;
    if (pos) {
      const float* pos_row = pos + (p % seq) * features;
#pragma omp simd
      for (std::int64_t j = 0; j < features; ++j) out_row[j] = token_row[j] + pos_row[j];
    } else {
      std::memcpy(out_row, token_row, sizeof(float) * static_cast<std::size_t>(features));
    }
  }
}

void embedding_backward(const Tensor& tokens, const Tensor& d_y, Tensor& d_token_table, Tensor* d_pos_table) {
  constexpr const char* op = "embedding_backward";
  PROPLAB_CHECK(tokens.ndim() == 2, "op '", op, "': tokens must be [B, T], got ", shape_string(tokens.shape()));
  PROPLAB_CHECK(d_token_table.ndim() == 2, "op '", op, "': d_token_table must be [V, D], got ",
                shape_string(d_token_table.shape()));
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  const std::int64_t vocab = d_token_table.dim(0), features = d_token_table.dim(1);
  expect_shape(op, "tokens", tokens, tokens.shape(), DType::i32);
  expect_shape(op, "d_y", d_y, {batch, seq, features});
  expect_shape(op, "d_token_table", d_token_table, d_token_table.shape());
  if (d_pos_table) {
    PROPLAB_CHECK(d_pos_table->ndim() == 2 && d_pos_table->dim(0) >= seq && d_pos_table->dim(1) == features, "op '", op,
                  "': d_pos_table must be [T_max >= ", seq, ", ", features, "], got ",
                  shape_string(d_pos_table->shape()));
    expect_shape(op, "d_pos_table", *d_pos_table, d_pos_table->shape());
  }
  const Device device = common_device(op, {&tokens, &d_y, &d_token_table, d_pos_table});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    check_token_range_cuda(op, tokens.i32(), batch * seq, vocab);
    kernels::embedding_table_backward(tokens.i32(), batch * seq, 0, vocab, d_y.f32(), features, d_token_table.f32());
    if (d_pos_table) kernels::position_backward(d_y.f32(), batch, seq, features, d_pos_table->f32());
    return;
#else
    missing_device_impl(op, device);
#endif
  }

  const std::int32_t* ids = tokens.i32();
  const std::int64_t positions = batch * seq;
  check_token_range(op, ids, positions, vocab);
  const float* grad = d_y.f32();
  float* d_table = d_token_table.f32();
  // One column block per thread (each element's sum runs in position order, so the block width, which depends on
  // the thread count, does not change the result).
  const std::int64_t per_thread = (features + threads() - 1) / threads();
  const std::int64_t column_block =
      std::max<std::int64_t>(kColumnQuantum, (per_thread + kColumnQuantum - 1) / kColumnQuantum * kColumnQuantum);
  const std::int64_t blocks = (features + column_block - 1) / column_block;
  // Each task owns columns [begin, begin + width) of every table row, so no two tasks write the same element,
  // and each element receives its contributions in position order.
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * column_block;
    const std::int64_t width = std::min(column_block, features - begin);
    for (std::int64_t p = 0; p < positions; ++p) {
      float* table_row = d_table + static_cast<std::int64_t>(ids[p]) * features + begin;
      const float* grad_row = grad + p * features + begin;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) table_row[j] += grad_row[j];
    }
  }
  if (d_pos_table) {
    float* d_pos = d_pos_table->f32();
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
    for (std::int64_t t = 0; t < seq; ++t) {
      float* pos_row = d_pos + t * features;
      for (std::int64_t b = 0; b < batch; ++b) {
        const float* grad_row = grad + (b * seq + t) * features;
#pragma omp simd
        for (std::int64_t j = 0; j < features; ++j) pos_row[j] += grad_row[j];
      }
    }
  }
}

}  // namespace proplab::ops
