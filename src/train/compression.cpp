#include "train/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace proplab {

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// bfloat16: the upper 16 bits, rounded to nearest with ties to even; a NaN stays a NaN (quiet).
std::uint32_t to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if (std::isnan(x)) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

float from_bf16(std::uint32_t half) { return float_of(half << 16); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// topk's k for a tensor of n elements (0 for an empty one).
std::int64_t topk_count(double ratio, std::int64_t n) {
  if (n == 0) return 0;
  const auto k = static_cast<std::int64_t>(std::ceil(ratio * static_cast<double>(n)));
  return std::clamp<std::int64_t>(k, 1, n);
}

// powersgd's matrix view [rows, cols] of a tensor of two or more dimensions ({0, 0}: a vector, sent whole).
std::pair<std::int64_t, std::int64_t> matrix_of(const Shape& shape) {
  if (shape.size() < 2) return {0, 0};
  const std::int64_t rows = shape[0];
  return {rows, rows == 0 ? 0 : shape_numel(shape) / rows};
}

double sum_sq(const float* x, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t e = 0; e < n; ++e) total += static_cast<double>(x[e]) * x[e];
  return total;
}

double distance_sq(const float* x, const float* y, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t e = 0; e < n; ++e) {
    const double d = static_cast<double>(x[e]) - y[e];
    total += d * d;
  }
  return total;
}

// Columns of p [rows, r] made orthonormal in order (Gram–Schmidt, twice for stability); a column that vanishes
// stays 0.
void orthonormalise(float* p, std::int64_t rows, int r) {
  for (int j = 0; j < r; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        double dot = 0.0;
        for (std::int64_t a = 0; a < rows; ++a) dot += static_cast<double>(p[a * r + j]) * p[a * r + k];
        for (std::int64_t a = 0; a < rows; ++a) p[a * r + j] -= static_cast<float>(dot * p[a * r + k]);
      }
    }
    double norm_sq = 0.0;
    for (std::int64_t a = 0; a < rows; ++a) norm_sq += static_cast<double>(p[a * r + j]) * p[a * r + j];
    if (norm_sq == 0.0) continue;
    const double inverse = 1.0 / std::sqrt(norm_sq);
    for (std::int64_t a = 0; a < rows; ++a) p[a * r + j] = static_cast<float>(p[a * r + j] * inverse);
  }
}

// out [rows, r] = x [rows, cols] · q [cols, r]
void times(const float* x, const float* q, std::int64_t rows, std::int64_t cols, int r, float* out) {
  std::vector<double> acc(static_cast<std::size_t>(r));
  for (std::int64_t a = 0; a < rows; ++a) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::int64_t b = 0; b < cols; ++b) {
      const double v = x[a * cols + b];
      for (int j = 0; j < r; ++j) acc[j] += v * q[b * r + j];
    }
    for (int j = 0; j < r; ++j) out[a * r + j] = static_cast<float>(acc[j]);
  }
}

// out [cols, r] = xᵀ · p, x [rows, cols], p [rows, r]
void transpose_times(const float* x, const float* p, std::int64_t rows, std::int64_t cols, int r, float* out) {
  std::vector<double> acc(static_cast<std::size_t>(cols * r), 0.0);
  for (std::int64_t a = 0; a < rows; ++a)
    for (std::int64_t b = 0; b < cols; ++b) {
      const double v = x[a * cols + b];
      for (int j = 0; j < r; ++j) acc[b * r + j] += v * p[a * r + j];
    }
  for (std::int64_t e = 0; e < cols * r; ++e) out[e] = static_cast<float>(acc[e]);
}

// out [rows, cols] = p [rows, r] · qᵀ, q [cols, r]
void outer(const float* p, const float* q, std::int64_t rows, std::int64_t cols, int r, float* out) {
  for (std::int64_t a = 0; a < rows; ++a)
    for (std::int64_t b = 0; b < cols; ++b) {
      double acc = 0.0;
      for (int j = 0; j < r; ++j) acc += static_cast<double>(p[a * r + j]) * q[b * r + j];
      out[a * cols + b] = static_cast<float>(acc);
    }
}

}  // namespace

Compression compression_of(const ParallelConfig& config) {
  const std::string& name = config.compress;
  if (name == "none") return Compression::none;
  if (name == "bf16") return Compression::bf16;
  if (name == "int8") return Compression::int8;
  if (name == "topk") return Compression::topk;
  if (name == "powersgd") return Compression::powersgd;
  throw UserError("parallel.compress = \"" + name +
                  "\": unknown scheme; allowed: \"none\", \"bf16\", \"int8\", \"topk\" or \"powersgd\"");
}

const char* compression_name(Compression scheme) {
  switch (scheme) {
    case Compression::none:
      return "none";
    case Compression::bf16:
      return "bf16";
    case Compression::int8:
      return "int8";
    case Compression::topk:
      return "topk";
    case Compression::powersgd:
      return "powersgd";
  }
  return "?";
}

Compression boundary_compression_of(const ParallelConfig& config) {
  const std::string& name = config.pp_compress;
  if (name == "none") return Compression::none;
  if (name == "bf16") return Compression::bf16;
  if (name == "int8") return Compression::int8;
  throw UserError("parallel.pp_compress = \"" + name + "\": unknown scheme; allowed: \"none\", \"bf16\" or \"int8\"");
}

std::int64_t payload_words(Compression scheme, std::int64_t n) {
  if (scheme == Compression::bf16) return ceil_div(n, 2);
  PROPLAB_CHECK(scheme == Compression::int8, "payload_words: ", compression_name(scheme), " has no fixed payload");
  return ceil_div(n, kInt8Block) + ceil_div(n, 4);
}

void encode_payload(Compression scheme, const float* x, std::int64_t n, std::uint32_t* words) {
  if (scheme == Compression::bf16) {
    for (std::int64_t e = 0; e < n; e += 2) words[e / 2] = to_bf16(x[e]) | ((e + 1 < n ? to_bf16(x[e + 1]) : 0u) << 16);
    return;
  }
  PROPLAB_CHECK(scheme == Compression::int8, "encode_payload: ", compression_name(scheme), " has no fixed payload");
  const std::int64_t blocks = ceil_div(n, kInt8Block);
  auto* bytes = reinterpret_cast<unsigned char*>(words + blocks);
  std::memset(bytes, 0, static_cast<std::size_t>(4 * ceil_div(n, 4)));
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * kInt8Block, end = std::min(n, begin + kInt8Block);
    float largest = 0.0f;
    bool finite = true;
    for (std::int64_t e = begin; e < end; ++e) {
      finite = finite && std::isfinite(x[e]);
      largest = std::max(largest, std::fabs(x[e]));
    }
    // (a non-finite block decodes to NaN, so a step is found diverged as it would be uncompressed)
    const float scale = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
    words[b] = bits_of(scale);
    for (std::int64_t e = begin; e < end; ++e) {
      long q = 0;
      if (finite && scale > 0.0f) q = std::clamp(std::lrint(x[e] / scale), -127L, 127L);
      bytes[e] = static_cast<unsigned char>(static_cast<signed char>(q));
    }
  }
}

void decode_payload(Compression scheme, const std::uint32_t* words, std::int64_t n, float* out) {
  if (scheme == Compression::bf16) {
    for (std::int64_t e = 0; e < n; ++e) out[e] = from_bf16((words[e / 2] >> (16 * (e % 2))) & 0xffffu);
    return;
  }
  PROPLAB_CHECK(scheme == Compression::int8, "decode_payload: ", compression_name(scheme), " has no fixed payload");
  const std::int64_t blocks = ceil_div(n, kInt8Block);
  const auto* bytes = reinterpret_cast<const unsigned char*>(words + blocks);
  for (std::int64_t e = 0; e < n; ++e)
    out[e] = static_cast<float>(static_cast<signed char>(bytes[e])) * float_of(words[e / kInt8Block]);
}

std::int64_t compressed_bytes(const ParallelConfig& config, const Shape& shape) {
  const std::int64_t n = shape_numel(shape);
  switch (compression_of(config)) {
    case Compression::none:
      return 4 * n;
    case Compression::bf16:
    case Compression::int8:
      return 4 * payload_words(compression_of(config), n);
    case Compression::topk:
      return 8 * topk_count(config.compress_ratio, n);
    case Compression::powersgd: {
      const auto [rows, cols] = matrix_of(shape);
      return rows == 0 ? 4 * n : 4 * static_cast<std::int64_t>(config.compress_rank) * (rows + cols);
    }
  }
  return 0;
}

GradientCompressor::GradientCompressor(const ParallelConfig& config, dist::Communicator& group, ParameterStore& params,
                                       std::vector<bool> exchanged, std::uint64_t seed)
    : scheme_(compression_of(config)),
      config_(config),
      group_(group),
      params_(params),
      exchanged_(std::move(exchanged)) {
  const auto& all = params_.all();
  if (exchanged_.empty()) exchanged_.assign(all.size(), true);
  PROPLAB_CHECK(exchanged_.size() == all.size(), "GradientCompressor: ", exchanged_.size(), " flags for ", all.size(),
                " parameters");
  if (scheme_ == Compression::topk && !(config.compress_ratio > 0.0 && config.compress_ratio <= 1.0))
    throw UserError("parallel.compress_ratio = " + std::to_string(config.compress_ratio) +
                    ": topk sends this fraction of each gradient; allowed: 0 < compress_ratio <= 1");
  residual_.resize(all.size());
  q_.resize(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!exchanged_[i]) continue;
    const Parameter& p = *all[i];
    if (error_feedback()) residual_[i].assign(static_cast<std::size_t>(p.grad.numel()), 0.0f);
    if (scheme_ != Compression::powersgd) continue;
    const auto [rows, cols] = matrix_of(p.value.shape());
    if (rows == 0) continue;
    const int r = config.compress_rank;
    if (r > std::min(rows, cols))
      throw UserError(
          "parallel.compress_rank = " + std::to_string(r) + ": powersgd's rank exceeds the smaller side of " + p.name +
          " (" + std::to_string(rows) + " x " + std::to_string(cols) +
          " as a matrix); allowed: compress_rank <= " + std::to_string(std::min(rows, cols)) + " for this model");
    // Q's first draw: a fixed Gaussian per parameter, the same on every replica.
    const CounterRng rng(seed, stream_id("powersgd." + p.name));
    q_[i].resize(static_cast<std::size_t>(cols * r));
    for (std::size_t e = 0; e < q_[i].size(); ++e) q_[i][e] = rng.normal(e);
  }
  input_sq_.assign(all.size(), 0.0);
  error_sq_ = input_sq_;
  residual_sq_ = input_sq_;
}

std::map<std::string, Tensor> gather_compression_state(dist::Communicator& world,
                                                       const GradientCompressor* compressor) {
  std::map<std::string, Tensor> out;
  if (compressor == nullptr) return out;
  const std::vector<float> mine = compressor->state();
  const int ranks = world.size(), rank = world.rank();
  std::vector<double> sizes(static_cast<std::size_t>(ranks), 0.0);
  sizes[static_cast<std::size_t>(rank)] = static_cast<double>(mine.size());
  world.all_reduce(sizes.data(), ranks);
  if (rank != 0) {
    if (!mine.empty()) world.send(mine.data(), static_cast<std::int64_t>(mine.size()), 0, 0);
    return out;
  }
  for (int r = 0; r < ranks; ++r) {
    const auto n = static_cast<std::int64_t>(sizes[static_cast<std::size_t>(r)]);
    if (n == 0) continue;
    Tensor state = Tensor::empty({n});
    if (r == 0)
      std::copy(mine.begin(), mine.end(), state.f32());
    else
      world.receive(state.f32(), n, r, 0);
    out.emplace("compression/state/" + std::to_string(r), std::move(state));
  }
  return out;
}

std::vector<float> GradientCompressor::state() const {
  std::vector<float> out;
  for (const auto* part : {&residual_, &q_})
    for (const std::vector<float>& values : *part) out.insert(out.end(), values.begin(), values.end());
  return out;
}

void GradientCompressor::set_state(const std::vector<float>& state) {
  std::size_t at = 0;
  for (auto* part : {&residual_, &q_})
    for (std::vector<float>& values : *part) {
      PROPLAB_CHECK(at + values.size() <= state.size(), "compression state of ", state.size(), " values is too short");
      std::copy(state.begin() + static_cast<std::ptrdiff_t>(at),
                state.begin() + static_cast<std::ptrdiff_t>(at + values.size()), values.begin());
      at += values.size();
    }
  PROPLAB_CHECK(at == state.size(), "compression state of ", state.size(), " values, ", at, " expected");
}

std::int64_t GradientCompressor::words_of(std::size_t i) const {
  return compressed_bytes(config_, params_.all()[i]->grad.shape()) / 4;
}

void GradientCompressor::encode(const float* x, std::int64_t n, std::uint32_t* words,
                                std::vector<float>* decoded) const {
  if (decoded) decoded->assign(static_cast<std::size_t>(n), 0.0f);
  switch (scheme_) {
    case Compression::bf16:
    case Compression::int8:
      encode_payload(scheme_, x, n, words);
      if (decoded) decode_payload(scheme_, words, n, decoded->data());
      return;
    case Compression::topk: {
      const std::int64_t k = topk_count(config_.compress_ratio, n);
      if (k == 0) return;
      std::vector<float> key(static_cast<std::size_t>(n));
      for (std::int64_t e = 0; e < n; ++e)
        key[e] = std::isnan(x[e]) ? std::numeric_limits<float>::infinity() : std::fabs(x[e]);
      std::vector<std::int64_t> order(static_cast<std::size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      // A strict total order (larger first, then the lower index), so the choice is unique.
      auto before = [&](std::int64_t a, std::int64_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); };
      std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
      std::sort(order.begin(), order.begin() + k);
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t e = order[j];
        words[j] = static_cast<std::uint32_t>(e);
        words[k + j] = bits_of(x[e]);
        if (decoded) (*decoded)[e] = x[e];
      }
      return;
    }
    case Compression::none:
    case Compression::powersgd:
      break;
  }
  PROPLAB_CHECK(false, "GradientCompressor::encode: scheme ", compression_name(scheme_), " is not gathered");
}

void GradientCompressor::add_decoded(const std::uint32_t* words, std::int64_t n, float* sum) const {
  switch (scheme_) {
    case Compression::bf16:
    case Compression::int8: {
      std::vector<float> decoded(static_cast<std::size_t>(n));
      decode_payload(scheme_, words, n, decoded.data());
      for (std::int64_t e = 0; e < n; ++e) sum[e] += decoded[e];
      return;
    }
    case Compression::topk: {
      const std::int64_t k = topk_count(config_.compress_ratio, n);
      for (std::int64_t j = 0; j < k; ++j) sum[words[j]] += float_of(words[k + j]);
      return;
    }
    case Compression::none:
    case Compression::powersgd:
      break;
  }
  PROPLAB_CHECK(false, "GradientCompressor::add_decoded: scheme ", compression_name(scheme_), " is not gathered");
}

void GradientCompressor::exchange(bool measure) {
  std::fill(input_sq_.begin(), input_sq_.end(), 0.0);
  std::fill(error_sq_.begin(), error_sq_.end(), 0.0);
  std::fill(residual_sq_.begin(), residual_sq_.end(), 0.0);
  auto& all = params_.all();
  // CUDA ranks: the exchanged gradients are staged through host copies, compressed and summed there, and copied back.
  const bool staged = params_.device() != Device::cpu;
  if (staged) {
    host_.resize(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (!exchanged_[i]) continue;
      if (!host_[i].defined()) host_[i] = Tensor::empty(all[i]->grad.shape());
      host_[i].copy_from(all[i]->grad);
    }
  }
  if (scheme_ == Compression::powersgd)
    exchange_powersgd(measure);
  else
    exchange_gathered(measure);
  if (staged)
    for (std::size_t i = 0; i < all.size(); ++i)
      if (exchanged_[i]) all[i]->grad.copy_from(host_[i]);
}

Tensor& GradientCompressor::gradient(std::size_t i) {
  return params_.device() != Device::cpu ? host_[i] : params_.all()[i]->grad;
}

void GradientCompressor::exchange_gathered(bool measure) {
  auto& all = params_.all();
  const int ranks = group_.size();
  std::vector<std::int64_t> offset(all.size() + 1, 0);  // in words, per parameter
  for (std::size_t i = 0; i < all.size(); ++i) offset[i + 1] = offset[i] + (exchanged_[i] ? words_of(i) : 0);
  const std::int64_t words = offset.back();
  std::vector<std::uint32_t> send(static_cast<std::size_t>(words)), receive(static_cast<std::size_t>(words * ranks));
  std::vector<float> decoded;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!exchanged_[i]) continue;
    Tensor& grad = gradient(i);
    const std::int64_t n = grad.numel();
    const float* x = grad.f32();
    if (error_feedback()) {  // x = g + e, kept in the residual's buffer until what is sent is taken out
      float* e = residual_[i].data();
      for (std::int64_t j = 0; j < n; ++j) e[j] += x[j];
      x = e;
    }
    // (what the payload stands for is needed for the residual and the statistics only)
    encode(x, n, send.data() + offset[i], measure || error_feedback() ? &decoded : nullptr);
    if (measure) {
      input_sq_[i] = sum_sq(x, n);
      error_sq_[i] = distance_sq(x, decoded.data(), n);
    }
    if (error_feedback()) {
      float* e = residual_[i].data();
      for (std::int64_t j = 0; j < n; ++j) e[j] -= decoded[j];
      if (measure) residual_sq_[i] = sum_sq(e, n);
    }
  }
  // (an all-gather moves the words' bits unchanged: MPI_FLOAT between hosts of one architecture, a copy in one
  // process)
  group_.all_gather(reinterpret_cast<const float*>(send.data()), reinterpret_cast<float*>(receive.data()), words);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!exchanged_[i]) continue;
    Tensor& grad = gradient(i);
    float* sum = grad.f32();
    std::fill(sum, sum + grad.numel(), 0.0f);
    for (int r = 0; r < ranks; ++r) add_decoded(receive.data() + r * words + offset[i], grad.numel(), sum);
  }
}

void GradientCompressor::exchange_powersgd(bool measure) {
  auto& all = params_.all();
  const int r = config_.compress_rank;
  // First all-reduce: P = x·Q per matrix, then the vectors whole; second: Q = xᵀ·P̂ per matrix.
  std::vector<std::int64_t> first(all.size() + 1, 0), second(all.size() + 1, 0);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto [rows, cols] = matrix_of(all[i]->value.shape());
    const bool matrix = exchanged_[i] && rows > 0;
    first[i + 1] = first[i] + (!exchanged_[i] ? 0 : matrix ? rows * r : all[i]->value.numel());
    second[i + 1] = second[i] + (matrix ? cols * r : 0);
  }
  std::vector<float> p(static_cast<std::size_t>(first.back())), q(static_cast<std::size_t>(second.back()));
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!exchanged_[i]) continue;
    Tensor& grad = gradient(i);
    const std::int64_t n = grad.numel();
    const auto [rows, cols] = matrix_of(grad.shape());
    if (rows == 0) {
      std::copy(grad.f32(), grad.f32() + n, p.begin() + first[i]);
      if (measure) input_sq_[i] = sum_sq(grad.f32(), n);
      continue;
    }
    float* x = residual_[i].data();  // x = g + e
    for (std::int64_t j = 0; j < n; ++j) x[j] += grad.f32()[j];
    times(x, q_[i].data(), rows, cols, r, p.data() + first[i]);
  }
  group_.all_reduce(p.data(), first.back());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto [rows, cols] = matrix_of(all[i]->value.shape());
    if (!exchanged_[i] || rows == 0) continue;
    orthonormalise(p.data() + first[i], rows, r);
    transpose_times(residual_[i].data(), p.data() + first[i], rows, cols, r, q.data() + second[i]);
  }
  const std::vector<float> own_q = q;  // this replica's xᵀ·P̂, for its residual
  group_.all_reduce(q.data(), second.back());
  std::vector<float> decoded;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!exchanged_[i]) continue;
    Tensor& grad = gradient(i);
    const std::int64_t n = grad.numel();
    const auto [rows, cols] = matrix_of(grad.shape());
    if (rows == 0) {
      std::copy(p.begin() + first[i], p.begin() + first[i + 1], grad.f32());
      continue;
    }
    const float* p_hat = p.data() + first[i];
    std::copy(q.begin() + second[i], q.begin() + second[i + 1], q_[i].begin());  // the next step's start
    outer(p_hat, q_[i].data(), rows, cols, r, grad.f32());
    decoded.resize(static_cast<std::size_t>(n));
    outer(p_hat, own_q.data() + second[i], rows, cols, r, decoded.data());
    float* x = residual_[i].data();
    if (measure) {
      input_sq_[i] = sum_sq(x, n);
      error_sq_[i] = distance_sq(x, decoded.data(), n);
    }
    for (std::int64_t j = 0; j < n; ++j) x[j] -= decoded[j];
    if (measure) residual_sq_[i] = sum_sq(x, n);
  }
}

void GradientCompressor::measure(std::vector<double>& error, std::vector<double>& residual) {
  const std::size_t count = input_sq_.size();
  std::vector<double> sums;
  sums.reserve(3 * count);
  sums.insert(sums.end(), input_sq_.begin(), input_sq_.end());
  sums.insert(sums.end(), error_sq_.begin(), error_sq_.end());
  sums.insert(sums.end(), residual_sq_.begin(), residual_sq_.end());
  group_.all_reduce(sums.data(), static_cast<std::int64_t>(sums.size()));
  error.assign(count + 1, 0.0);
  residual.assign(count + 1, 0.0);
  double input_total = 0.0, error_total = 0.0, residual_total = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const double input = sums[i], err = sums[count + i], res = sums[2 * count + i];
    error[i] = input == 0.0 ? 0.0 : std::sqrt(err / input);  // (a NaN stays NaN)
    residual[i] = std::sqrt(res);
    input_total += input;
    error_total += err;
    residual_total += res;
  }
  error[count] = input_total == 0.0 ? 0.0 : std::sqrt(error_total / input_total);
  residual[count] = std::sqrt(residual_total);
}

}  // namespace proplab
