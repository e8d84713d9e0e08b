#include "models/sequence_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace proplab {

void check_sequence_parallel(const ModelConfig& config, int sp) {
  if (sp == 1) return;
  const std::string at = "parallel.sp = " + std::to_string(sp);
  if (config.kind() != ModelKind::transformer)
    throw UserError(at + ": sequence parallelism splits a transformer's sequences; model.type = \"" +
                    std::string(model_kind_name(config.kind())) + "\" has none; allowed: sp = 1");
  const std::int64_t tokens = config.transformer().seq_len;
  if (tokens % sp != 0)
    throw UserError(at + " must divide model.seq_len = " + std::to_string(tokens) +
                    "; allowed: an sp that divides model.seq_len");
}

namespace {

struct Shape3 {
  std::int64_t batch, tokens, model_dim, heads, head_dim;
};

Shape3 check(const char* op, const Tensor& qkv, int heads) {
  PROPLAB_CHECK(qkv.device() == Device::cpu, op, ": CPU tensors only in this version");
  PROPLAB_CHECK(qkv.dtype() == DType::f32 && qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, op,
                ": qkv must be [B, T, 3D] f32, got ", shape_string(qkv.shape()));
  Shape3 s{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, heads, 0};
  PROPLAB_CHECK(heads > 0 && s.model_dim % heads == 0, op, ": ", heads, " heads do not divide the width ", s.model_dim);
  s.head_dim = s.model_dim / heads;
  return s;
}

// The block of the ring that is visiting at step t: from rank (r − t) mod sp.
int source_at(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

// One query's logits against a key block: scale · q·k for keys [0, keys), rounded to float as the one-process op's.
void logits_of(const float* q, const float* block, std::int64_t block_stride, std::int64_t keys, std::int64_t head_dim,
               float scale, float* out) {
  for (std::int64_t j = 0; j < keys; ++j) {
    const float* k = block + j * block_stride;
    double dot = 0.0;
    for (std::int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
    out[j] = static_cast<float>(scale * dot);
  }
}

// Runs visit(pair, b, h, i, keys, logits) for every query i of every (sequence, head) pair against the visiting
// block from rank `source`: keys [0, keys) of it are visible (all of an earlier rank's, the causal ones of the own),
// their logits computed into `logits`. One task per pair, each with a fixed loop order; a later rank's block is not
// visited.
template <typename Visit>
void for_each_query(const Shape3& s, int source, int rank, const float* qkv, const float* block,
                    std::int64_t block_stride, float scale, Visit&& visit) {
  if (source > rank) return;  // (a later rank's keys all come after this rank's queries)
  const std::int64_t pairs = s.batch * s.heads, T = s.tokens, D = s.model_dim, Dh = s.head_dim;
#pragma omp parallel for schedule(static)
  for (std::int64_t pair = 0; pair < pairs; ++pair) {
    const std::int64_t b = pair / s.heads, h = pair % s.heads;
    std::vector<float> logits(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) {
      const std::int64_t keys = source < rank ? T : i + 1;
      logits_of(qkv + (b * T + i) * 3 * D + h * Dh, block + b * T * block_stride + h * Dh, block_stride, keys, Dh,
                scale, logits.data());
      visit(pair, b, h, i, keys, logits.data());
    }
  }
}

}  // namespace

void ring_attention_forward(dist::Communicator& ring, const Tensor& qkv, int heads, float logit_scale, Tensor& out,
                            Tensor& lse, probe::LogitSums* logit_sums) {
  const Shape3 s = check("ring_attention_forward", qkv, heads);
  const std::int64_t B = s.batch, T = s.tokens, D = s.model_dim, H = s.heads, Dh = s.head_dim;
  PROPLAB_CHECK(out.numel() == B * T * D && lse.numel() == B * H * T && out.device() == Device::cpu &&
                    lse.device() == Device::cpu,
                "ring_attention_forward: out must hold [B, Tl, D] and lse [B, H, Tl]");
  const int ranks = ring.size(), rank = ring.rank();
  const float* x = qkv.f32();
  // The travelling block: per token its keys then its values, [B, Tl, 2D].
  std::vector<float> block(static_cast<std::size_t>(B * T * 2 * D)), incoming(block.size());
  for (std::int64_t row = 0; row < B * T; ++row)
    std::memcpy(&block[row * 2 * D], x + row * 3 * D + D, static_cast<std::size_t>(2 * D) * sizeof(float));
  std::vector<double> m(static_cast<std::size_t>(B * H * T), -std::numeric_limits<double>::infinity());
  std::vector<double> l(m.size(), 0.0), o(static_cast<std::size_t>(B * T * D), 0.0);
  std::vector<probe::LogitSums> pair_sums(logit_sums ? static_cast<std::size_t>(B * H) : 0);
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    for_each_query(
        s, source, rank, x, block.data(), 2 * D, logit_scale,
        [&](std::int64_t pair, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t keys, const float* logits) {
          if (logit_sums) probe::add_logit_row(logits, keys, pair_sums[static_cast<std::size_t>(pair)]);
          const std::size_t at = static_cast<std::size_t>((b * H + h) * T + i);
          double block_max = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = 0; j < keys; ++j) block_max = std::max(block_max, static_cast<double>(logits[j]));
          const double m_new = std::max(m[at], block_max);
          const double factor = std::exp(m[at] - m_new);  // (0 on the first block: m = −∞)
          double* o_i = o.data() + (b * T + i) * D + h * Dh;
          for (std::int64_t d = 0; d < Dh; ++d) o_i[d] *= factor;
          double sum = 0.0;
          for (std::int64_t j = 0; j < keys; ++j) {
            const double weight = std::exp(static_cast<double>(logits[j]) - m_new);
            sum += weight;
            const float* v = block.data() + (b * T + j) * 2 * D + D + h * Dh;
            for (std::int64_t d = 0; d < Dh; ++d) o_i[d] += weight * v[d];
          }
          l[at] = l[at] * factor + sum;
          m[at] = m_new;
        });
    if (step + 1 < ranks) {
      ring.send_receive(block.data(), (rank + 1) % ranks, incoming.data(), (rank + ranks - 1) % ranks,
                        static_cast<std::int64_t>(block.size()), 3);
      std::swap(block, incoming);
    }
  }
  float* y = out.f32();
  float* saved = lse.f32();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        const std::size_t at = static_cast<std::size_t>((b * H + h) * T + i);
        saved[at] = static_cast<float>(m[at] + std::log(l[at]));
        for (std::int64_t d = 0; d < Dh; ++d) {
          const std::int64_t e = (b * T + i) * D + h * Dh + d;
          y[e] = static_cast<float>(o[static_cast<std::size_t>(e)] / l[at]);
        }
      }
  if (logit_sums) {
    for (const probe::LogitSums& part : pair_sums) logit_sums->add(part);  // in (sequence, head) order
  }
}

void ring_attention_backward(dist::Communicator& ring, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             const Tensor& d_out, int heads, float logit_scale, Tensor& d_qkv) {
  const Shape3 s = check("ring_attention_backward", qkv, heads);
  const std::int64_t B = s.batch, T = s.tokens, D = s.model_dim, H = s.heads, Dh = s.head_dim;
  PROPLAB_CHECK(out.numel() == B * T * D && d_out.numel() == B * T * D && lse.numel() == B * H * T &&
                    d_qkv.numel() == B * T * 3 * D,
                "ring_attention_backward: shapes of out, d_out, lse or d_qkv do not match qkv ",
                shape_string(qkv.shape()));
  const int ranks = ring.size(), rank = ring.rank();
  const float* x = qkv.f32();
  const float* y = out.f32();
  const float* g = d_out.f32();
  const float* saved = lse.f32();
  // The travelling block: per token its keys, values, and their gradients so far, [B, Tl, 4D].
  std::vector<float> block(static_cast<std::size_t>(B * T * 4 * D), 0.0f), incoming(block.size());
  for (std::int64_t row = 0; row < B * T; ++row)
    std::memcpy(&block[row * 4 * D], x + row * 3 * D + D, static_cast<std::size_t>(2 * D) * sizeof(float));
  // Per query: Σ_d dout·out (the softmax backward's row term).
  std::vector<double> row_dot(static_cast<std::size_t>(B * H * T), 0.0), dq(static_cast<std::size_t>(B * T * D), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        double dot = 0.0;
        for (std::int64_t d = 0; d < Dh; ++d) {
          const std::int64_t e = (b * T + i) * D + h * Dh + d;
          dot += static_cast<double>(g[e]) * y[e];
        }
        row_dot[static_cast<std::size_t>((b * H + h) * T + i)] = dot;
      }
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    for_each_query(
        s, source, rank, x, block.data(), 4 * D, logit_scale,
        [&](std::int64_t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t keys, const float* logits) {
          const float* q = x + (b * T + i) * 3 * D + h * Dh;
          const float* g_i = g + (b * T + i) * D + h * Dh;
          const std::size_t at = static_cast<std::size_t>((b * H + h) * T + i);
          double* dq_i = dq.data() + (b * T + i) * D + h * Dh;
          for (std::int64_t j = 0; j < keys; ++j) {
            float* k = block.data() + (b * T + j) * 4 * D + h * Dh;
            float* v = k + D;
            float* dk = k + 2 * D;
            float* dv = k + 3 * D;
            const double p = std::exp(static_cast<double>(logits[j]) - saved[at]);
            double dp = 0.0;
            for (std::int64_t d = 0; d < Dh; ++d) {
              dp += static_cast<double>(g_i[d]) * v[d];
              dv[d] += static_cast<float>(p * g_i[d]);
            }
            const double ds = p * (dp - row_dot[at]) * logit_scale;
            for (std::int64_t d = 0; d < Dh; ++d) {
              dq_i[d] += ds * k[d];
              dk[d] += static_cast<float>(ds * q[d]);
            }
          }
        });
    if (ranks > 1) {  // every block goes all the way round, home with its gradient
      ring.send_receive(block.data(), (rank + 1) % ranks, incoming.data(), (rank + ranks - 1) % ranks,
                        static_cast<std::int64_t>(block.size()), 4);
      std::swap(block, incoming);
    }
  }
  float* dx = d_qkv.f32();
  for (std::int64_t row = 0; row < B * T; ++row) {
    for (std::int64_t c = 0; c < D; ++c)
      dx[row * 3 * D + c] = static_cast<float>(dq[static_cast<std::size_t>(row * D + c)]);
    std::memcpy(dx + row * 3 * D + D, &block[row * 4 * D + 2 * D], static_cast<std::size_t>(2 * D) * sizeof(float));
  }
}

}  // namespace proplab
