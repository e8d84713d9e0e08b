// ops/vocab_parallel (CPU reference): embedding and cross-entropy pieces of a vocabulary shard.
//
// Determinism: every loop writes disjoint outputs (rows, or column blocks walked in position order) and the loss
// is a chunked_sum, so results do not depend on the thread count.
#include "ops/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/parallel.h"
#include "ops/dispatch.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/context.cuh"
#include "kernels/embedding.cuh"
#include "kernels/index_check.cuh"
#include "kernels/vocab_parallel.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 15;
constexpr std::int64_t kRowsPerChunk = 8;

// The tensors' common device; in a build without CUDA, a UserError for CUDA tensors.
Device check_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Device device = common_device(op, tensors);
#ifndef PROPLAB_WITH_CUDA
  if (device == Device::cuda) missing_device_impl(op, device);
#endif
  return device;
}

[[noreturn]] void throw_token_outside(const char* op, std::int32_t token, std::int64_t position, std::int64_t vocab) {
  throw UserError(std::string("op '") + op + "': token id " + std::to_string(token) + " at position " +
                  std::to_string(position) + " is outside the vocabulary [0, " + std::to_string(vocab) +
                  "); the data and the model's vocab_size disagree");
}

// rows and V_shard of logits [..., V_shard], with targets i32 [rows] checked against the full vocabulary.
std::int64_t logit_rows(const char* op, const Tensor& logits, const Tensor& targets) {
  PROPLAB_CHECK(logits.defined() && logits.ndim() >= 1 && logits.dim(-1) > 0, "op '", op, "': logits must be [..., V]");
  expect_shape(op, "logits", logits, logits.shape());
  const std::int64_t rows = logits.numel() / logits.dim(-1);
  expect_shape(op, "targets", targets, {rows}, DType::i32);
  return rows;
}

}  // namespace

void embedding_shard_forward(const Tensor& tokens, const Tensor& table_shard, std::int64_t first, std::int64_t vocab,
                             Tensor& y) {
  constexpr const char* op = "embedding_shard_forward";
  PROPLAB_CHECK(tokens.ndim() == 2 && table_shard.ndim() == 2, "op '", op, "': tokens [B, T] and table [V, D], got ",
                shape_string(tokens.shape()), " and ", shape_string(table_shard.shape()));
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  const std::int64_t rows = table_shard.dim(0), features = table_shard.dim(1);
  PROPLAB_CHECK(first >= 0 && first + rows <= vocab, "op '", op, "': shard [", first, ", ", first + rows,
                ") outside the vocabulary [0, ", vocab, ")");
  expect_shape(op, "tokens", tokens, tokens.shape(), DType::i32);
  expect_shape(op, "table_shard", table_shard, table_shard.shape());
  expect_shape(op, "y", y, {batch, seq, features});
  const std::int64_t positions = batch * seq;
  if (check_device(op, {&tokens, &table_shard, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    const kernels::IdOutside bad = kernels::first_id_outside(tokens.i32(), positions, 0, vocab);
    if (bad.index < positions) throw_token_outside(op, bad.value, bad.index, vocab);
    kernels::embedding_gather(tokens.i32(), positions, seq, table_shard.f32(), first, rows, nullptr, features, y.f32());
#endif
    return;
  }
  const std::int32_t* ids = tokens.i32();
  for (std::int64_t p = 0; p < positions; ++p)
    if (ids[p] < 0 || ids[p] >= vocab) throw_token_outside(op, ids[p], p, vocab);
  const float* table = table_shard.f32();
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
  for (std::int64_t p = 0; p < positions; ++p) {
    float* out_row = out + p * features;
    const std::int64_t local = static_cast<std::int64_t>(ids[p]) - first;
    if (local >= 0 && local < rows)
      std::memcpy(out_row, table + local * features, sizeof(float) * static_cast<std::size_t>(features));
    else
      std::fill(out_row, out_row + features, 0.0f);
  }
}

void embedding_shard_backward(const Tensor& tokens, const Tensor& d_y, std::int64_t first, Tensor& d_table_shard) {
  constexpr const char* op = "embedding_shard_backward";
  PROPLAB_CHECK(tokens.ndim() == 2 && d_table_shard.ndim() == 2, "op '", op, "': tokens [B, T] and table [V, D]");
  const std::int64_t batch = tokens.dim(0), seq = tokens.dim(1);
  const std::int64_t rows = d_table_shard.dim(0), features = d_table_shard.dim(1);
  expect_shape(op, "tokens", tokens, tokens.shape(), DType::i32);
  expect_shape(op, "d_y", d_y, {batch, seq, features});
  expect_shape(op, "d_table_shard", d_table_shard, d_table_shard.shape());
  const std::int64_t positions = batch * seq;
  if (check_device(op, {&tokens, &d_y, &d_table_shard}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::embedding_table_backward(tokens.i32(), positions, first, rows, d_y.f32(), features, d_table_shard.f32());
#endif
    return;
  }
  const std::int32_t* ids = tokens.i32();
  const float* grad = d_y.f32();
  float* d_table = d_table_shard.f32();
  // Column blocks of a fixed width: each element receives its contributions in position order.
  constexpr std::int64_t kColumns = 64;
  const std::int64_t blocks = (features + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * kColumns, width = std::min(kColumns, features - begin);
    for (std::int64_t p = 0; p < positions; ++p) {
      const std::int64_t local = static_cast<std::int64_t>(ids[p]) - first;
      if (local < 0 || local >= rows) continue;
      float* table_row = d_table + local * features + begin;
      const float* grad_row = grad + p * features + begin;
      for (std::int64_t j = 0; j < width; ++j) table_row[j] += grad_row[j];
    }
  }
}

void position_add_forward(const Tensor& pos_table, Tensor& y) {
  constexpr const char* op = "position_add_forward";
  PROPLAB_CHECK(y.ndim() == 3 && pos_table.ndim() == 2 && pos_table.dim(0) >= y.dim(1) && pos_table.dim(1) == y.dim(2),
                "op '", op, "': pos_table [T_max >= T, D] for y [B, T, D], got ", shape_string(pos_table.shape()),
                " and ", shape_string(y.shape()));
  expect_shape(op, "pos_table", pos_table, pos_table.shape());
  expect_shape(op, "y", y, y.shape());
  const std::int64_t seq = y.dim(1), features = y.dim(2), positions = y.dim(0) * seq;
  if (check_device(op, {&pos_table, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::position_add(pos_table.f32(), positions, seq, features, y.f32());
#endif
    return;
  }
  const float* pos = pos_table.f32();
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (positions * features > kParallelMin)
  for (std::int64_t p = 0; p < positions; ++p) {
    const float* pos_row = pos + (p % seq) * features;
    float* out_row = out + p * features;
    for (std::int64_t j = 0; j < features; ++j) out_row[j] += pos_row[j];
  }
}

void position_add_backward(const Tensor& d_y, Tensor& d_pos_table) {
  constexpr const char* op = "position_add_backward";
  PROPLAB_CHECK(d_y.ndim() == 3 && d_pos_table.ndim() == 2 && d_pos_table.dim(0) >= d_y.dim(1) &&
                    d_pos_table.dim(1) == d_y.dim(2),
                "op '", op, "': d_pos_table [T_max >= T, D] for d_y [B, T, D]");
  expect_shape(op, "d_y", d_y, d_y.shape());
  expect_shape(op, "d_pos_table", d_pos_table, d_pos_table.shape());
  const std::int64_t batch = d_y.dim(0), seq = d_y.dim(1), features = d_y.dim(2);
  if (check_device(op, {&d_y, &d_pos_table}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::position_backward(d_y.f32(), batch, seq, features, d_pos_table.f32());
#endif
    return;
  }
  const float* grad = d_y.f32();
  float* d_pos = d_pos_table.f32();
#pragma omp parallel for schedule(static) if (batch * seq * features > kParallelMin)
  for (std::int64_t t = 0; t < seq; ++t) {
    float* pos_row = d_pos + t * features;
    for (std::int64_t b = 0; b < batch; ++b) {
      const float* grad_row = grad + (b * seq + t) * features;
      for (std::int64_t j = 0; j < features; ++j) pos_row[j] += grad_row[j];
    }
  }
}

void cross_entropy_shard_max(const Tensor& logits_shard, std::vector<double>& row_max) {
  constexpr const char* op = "cross_entropy_shard_max";
  PROPLAB_CHECK(logits_shard.defined() && logits_shard.ndim() >= 1 && logits_shard.dim(-1) > 0, "op '", op,
                "': logits must be [..., V]");
  expect_shape(op, "logits", logits_shard, logits_shard.shape());
  const Device device = check_device(op, {&logits_shard});
  const std::int64_t classes = logits_shard.dim(-1), rows = logits_shard.numel() / classes;
  row_max.assign(static_cast<std::size_t>(rows), 0.0);
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::Scratch device_max(sizeof(double) * row_max.size());
    kernels::cross_entropy_shard_max(logits_shard.f32(), rows, classes, device_max.as<double>());
    kernels::copy_to_host(row_max.data(), device_max.as<double>(), sizeof(double) * row_max.size());
#endif
    return;
  }
  const float* data = logits_shard.f32();
#pragma omp parallel for schedule(static) if (rows * classes > kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = data + r * classes;
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < classes; ++j) m = std::max(m, row[j]);
    row_max[static_cast<std::size_t>(r)] = m;
  }
}

void cross_entropy_shard_sums(const Tensor& logits_shard, const std::vector<double>& row_max, const Tensor& targets,
                              std::int64_t first, std::vector<double>& sums) {
  constexpr const char* op = "cross_entropy_shard_sums";
  const std::int64_t rows = logit_rows(op, logits_shard, targets);
  PROPLAB_CHECK(static_cast<std::int64_t>(row_max.size()) == rows, "op '", op, "': ", row_max.size(),
                " row maxima for ", rows, " rows");
  const Device device = check_device(op, {&logits_shard, &targets});
  const std::int64_t classes = logits_shard.dim(-1);
  sums.assign(static_cast<std::size_t>(2 * rows), 0.0);
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    // [rows] maxima in, then [2·rows] sums out.
    kernels::Scratch scratch(sizeof(double) * static_cast<std::size_t>(3 * rows));
    double* device_max = scratch.as<double>();
    double* device_sums = device_max + rows;
    kernels::copy_to_device(device_max, row_max.data(), sizeof(double) * row_max.size());
    kernels::cross_entropy_shard_sums(logits_shard.f32(), device_max, targets.i32(), rows, classes, first, device_sums);
    kernels::copy_to_host(sums.data(), device_sums, sizeof(double) * sums.size());
#endif
    return;
  }
  const float* data = logits_shard.f32();
  const std::int32_t* target = targets.i32();
#pragma omp parallel for schedule(static) if (rows * classes > kParallelMin)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = data + r * classes;
    const float m = static_cast<float>(row_max[static_cast<std::size_t>(r)]);
    double s = 0.0;
    for (std::int64_t j = 0; j < classes; ++j) s += std::exp(row[j] - m);
    const std::int64_t local = static_cast<std::int64_t>(target[r]) - first;
    sums[static_cast<std::size_t>(2 * r)] = s;
    sums[static_cast<std::size_t>(2 * r + 1)] = local >= 0 && local < classes ? row[local] : 0.0;
  }
}

double cross_entropy_shard_finish(const Tensor& logits_shard, const std::vector<double>& row_max,
                                  const std::vector<double>& sums, const Tensor& targets, std::int64_t first,
                                  Tensor* d_logits_shard, float grad_scale) {
  constexpr const char* op = "cross_entropy_shard_finish";
  const std::int64_t rows = logit_rows(op, logits_shard, targets);
  PROPLAB_CHECK(static_cast<std::int64_t>(row_max.size()) == rows && static_cast<std::int64_t>(sums.size()) == 2 * rows,
                "op '", op, "': sums for ", rows, " rows expected");
  if (d_logits_shard != nullptr) expect_shape(op, "d_logits", *d_logits_shard, logits_shard.shape());
  const std::int64_t classes = logits_shard.dim(-1);
  if (check_device(op, {&logits_shard, &targets, d_logits_shard}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    const double grad_coef = static_cast<double>(grad_scale) / static_cast<double>(rows);
    if (d_logits_shard != nullptr) {
      // [rows] maxima, then [2·rows] sums, copied from the host.
      kernels::Scratch scratch(sizeof(double) * static_cast<std::size_t>(3 * rows));
      double* device_max = scratch.as<double>();
      double* device_sums = device_max + rows;
      kernels::copy_to_device(device_max, row_max.data(), sizeof(double) * row_max.size());
      kernels::copy_to_device(device_sums, sums.data(), sizeof(double) * sums.size());
      kernels::cross_entropy_shard_grad(logits_shard.f32(), device_max, device_sums, targets.i32(), rows, classes,
                                        first, grad_coef, d_logits_shard->f32());
    }
    // The loss needs only the host's row maxima and sums: summed here exactly as below (same chunks, same order).
    const double total = chunked_sum(
        rows,
        [&](std::int64_t begin, std::int64_t end) {
          double chunk_loss = 0.0;
          for (std::int64_t r = begin; r < end; ++r)
            chunk_loss += std::log(sums[static_cast<std::size_t>(2 * r)]) + row_max[static_cast<std::size_t>(r)] -
                          sums[static_cast<std::size_t>(2 * r + 1)];
          return chunk_loss;
        },
        kRowsPerChunk);
    return total / static_cast<double>(rows);
#endif
  }
  const float* data = logits_shard.f32();
  const std::int32_t* target = targets.i32();
  float* d_data = d_logits_shard != nullptr ? d_logits_shard->f32() : nullptr;
  const double grad_coef = static_cast<double>(grad_scale) / static_cast<double>(rows);
  const double total = chunked_sum(
      rows,
      [&](std::int64_t begin, std::int64_t end) {
        double chunk_loss = 0.0;
        for (std::int64_t r = begin; r < end; ++r) {
          const double m = row_max[static_cast<std::size_t>(r)];
          const double s = sums[static_cast<std::size_t>(2 * r)];
          chunk_loss += std::log(s) + m - sums[static_cast<std::size_t>(2 * r + 1)];
          if (d_data == nullptr) continue;
          const float* row = data + r * classes;
          float* d_row = d_data + r * classes;
          const float mf = static_cast<float>(m);
          const float coef = static_cast<float>(grad_coef / s);
          for (std::int64_t j = 0; j < classes; ++j) d_row[j] = coef * std::exp(row[j] - mf);
          const std::int64_t local = static_cast<std::int64_t>(target[r]) - first;
          if (local >= 0 && local < classes) d_row[local] -= static_cast<float>(grad_coef);
        }
        return chunk_loss;
      },
      kRowsPerChunk);
  return total / static_cast<double>(rows);
}

}  // namespace proplab::ops
