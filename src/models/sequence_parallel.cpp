#include "models/sequence_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

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
  std::int64_t batch, tokens, model_dim, heads;
};

Shape3 check(const char* op, const Tensor& qkv, int heads) {
  PROPLAB_CHECK(qkv.dtype() == DType::f32 && qkv.ndim() == 3 && qkv.dim(2) % 3 == 0, op,
                ": qkv must be [B, T, 3D] f32, got ", shape_string(qkv.shape()));
  Shape3 s{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, heads};
  PROPLAB_CHECK(heads > 0 && s.model_dim % heads == 0, op, ": ", heads, " heads do not divide the width ", s.model_dim);
  return s;
}

// The block of the ring that is visiting at step t: from rank (r − t) mod sp.
int source_at(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

// The travelling block [B, Tl, width]: per token its keys and values from qkv (the rest zero).
Tensor key_value_block(const Shape3& s, const Tensor& qkv, std::int64_t width) {
  Tensor block = Tensor::zeros({s.batch, s.tokens, width});
  const std::int64_t D = s.model_dim;
  const float* x = qkv.f32();
  float* out = block.f32();
  for (std::int64_t row = 0; row < s.batch * s.tokens; ++row)
    std::memcpy(out + row * width, x + row * 3 * D + D, static_cast<std::size_t>(2 * D) * sizeof(float));
  return block;
}

// A contiguous host tensor with x's values (x itself when it is one).
Tensor on_host(const Tensor& x) {
  if (x.device() == Device::cpu) return x.is_contiguous() ? x : x.clone();
  return x.to(Device::cpu);
}

// Where an op writes: `target` itself on the host, else a host tensor copied into it by deliver().
Tensor host_target(const Tensor& target) {
  return target.device() == Device::cpu && target.is_contiguous() ? target : Tensor::empty(target.shape());
}
void deliver(const Tensor& computed, Tensor& target) {
  if (computed.f32() != target.f32()) target.copy_from(computed.reshape(target.shape()));
}

// Passes the travelling block to rank + 1 and takes rank − 1's.
void pass_on(dist::Communicator& ring, Tensor& block, Tensor& incoming, int tag) {
  const int ranks = ring.size(), rank = ring.rank();
  ring.send_receive(block.f32(), (rank + 1) % ranks, incoming.f32(), (rank + ranks - 1) % ranks, block.numel(), tag);
  std::swap(block, incoming);
}

}  // namespace

void ring_attention_forward(dist::Communicator& ring, const Tensor& qkv, int heads, float logit_scale, Tensor& out,
                            Tensor& lse, probe::LogitSums* logit_sums) {
  const Shape3 s = check("ring_attention_forward", qkv, heads);
  const std::int64_t B = s.batch, T = s.tokens, D = s.model_dim, H = s.heads, Dh = D / H;
  PROPLAB_CHECK(out.numel() == B * T * D && lse.numel() == B * H * T,
                "ring_attention_forward: out must hold [B, Tl, D] and lse [B, H, Tl]");
  const int ranks = ring.size(), rank = ring.rank();
  const Tensor queries = on_host(qkv);
  Tensor host_out = host_target(out), host_lse = host_target(lse);
  Tensor block = key_value_block(s, queries, 2 * D), incoming = Tensor::empty(block.shape());
  // The online softmax's running maximum and sum per query, and its unnormalised output.
  Tensor m = Tensor::empty({B, H, T}), l = Tensor::zeros({B, H, T});
  std::fill(m.f32(), m.f32() + m.numel(), -std::numeric_limits<float>::infinity());
  Tensor o = Tensor::zeros({B, T, D});
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    // (a later rank's keys all come after this rank's queries: skipped, still passed on)
    if (source <= rank)
      ops::attention_block_forward(queries, block, heads, logit_scale, source == rank, m, l, o, logit_sums);
    if (step + 1 < ranks) pass_on(ring, block, incoming, 3);
  }
  float* y = host_out.f32();
  float* saved = host_lse.f32();
  const float* m_data = m.f32();
  const float* l_data = l.f32();
  const float* o_data = o.f32();
#pragma omp parallel for schedule(static)
  for (std::int64_t pair = 0; pair < B * H; ++pair) {
    const std::int64_t b = pair / H, h = pair % H;
    for (std::int64_t i = 0; i < T; ++i) {
      const std::int64_t at = pair * T + i;
      saved[at] = m_data[at] + std::log(l_data[at]);
      const float inverse = 1.0f / l_data[at];
      for (std::int64_t d = 0; d < Dh; ++d) {
        const std::int64_t e = (b * T + i) * D + h * Dh + d;
        y[e] = o_data[e] * inverse;
      }
    }
  }
  deliver(host_out, out);
  deliver(host_lse, lse);
}

void ring_attention_backward(dist::Communicator& ring, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             const Tensor& d_out, int heads, float logit_scale, Tensor& d_qkv) {
  const Shape3 s = check("ring_attention_backward", qkv, heads);
  const std::int64_t B = s.batch, T = s.tokens, D = s.model_dim, H = s.heads, Dh = D / H;
  PROPLAB_CHECK(out.numel() == B * T * D && d_out.numel() == B * T * D && lse.numel() == B * H * T &&
                    d_qkv.numel() == B * T * 3 * D,
                "ring_attention_backward: shapes of out, d_out, lse or d_qkv do not match qkv ",
                shape_string(qkv.shape()));
  const int ranks = ring.size(), rank = ring.rank();
  const Tensor queries = on_host(qkv), gradient = on_host(d_out), saved = on_host(lse), output = on_host(out);
  Tensor host_d_qkv = host_target(d_qkv);
  // The travelling block: per token its keys, values, and their gradients so far, [B, Tl, 4D].
  Tensor block = key_value_block(s, queries, 4 * D), incoming = Tensor::empty(block.shape());
  // Per query: Σ_d d_out·out (the softmax backward's row term), summed in double.
  Tensor row_dot = Tensor::empty({B, H, T});
  const float* y = output.f32();
  const float* g = gradient.f32();
#pragma omp parallel for schedule(static)
  for (std::int64_t pair = 0; pair < B * H; ++pair) {
    const std::int64_t b = pair / H, h = pair % H;
    for (std::int64_t i = 0; i < T; ++i) {
      double dot = 0.0;
      for (std::int64_t d = 0; d < Dh; ++d) {
        const std::int64_t e = (b * T + i) * D + h * Dh + d;
        dot += static_cast<double>(g[e]) * y[e];
      }
      row_dot.f32()[pair * T + i] = static_cast<float>(dot);
    }
  }
  Tensor d_q = Tensor::zeros({B, T, D});
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    if (source <= rank)
      ops::attention_block_backward(queries, gradient, saved, row_dot, heads, logit_scale, source == rank, block, d_q);
    if (ranks > 1) pass_on(ring, block, incoming, 4);  // every block goes all the way round, home with its gradient
  }
  float* dx = host_d_qkv.f32();
  const float* dq = d_q.f32();
  const float* home = block.f32();
  for (std::int64_t row = 0; row < B * T; ++row) {
    std::memcpy(dx + row * 3 * D, dq + row * D, static_cast<std::size_t>(D) * sizeof(float));
    std::memcpy(dx + row * 3 * D + D, home + row * 4 * D + 2 * D, static_cast<std::size_t>(2 * D) * sizeof(float));
  }
  deliver(host_d_qkv, d_qkv);
}

}  // namespace proplab
