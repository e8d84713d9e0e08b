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

// Copies features [from, from + count) of `tokens` tokens of every sequence of src [B, Ts, Fs], starting at token
// src_token, into features [to, to + count) of dst [B, Td, Fd] starting at token dst_token (both contiguous).
void copy_tokens(const Tensor& src, std::int64_t src_token, std::int64_t from, Tensor& dst, std::int64_t dst_token,
                 std::int64_t to, std::int64_t tokens, std::int64_t count) {
  const std::int64_t B = src.dim(0), Ts = src.dim(1), Fs = src.dim(2), Td = dst.dim(1), Fd = dst.dim(2);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < tokens; ++t)
      std::memcpy(dst.f32() + (b * Td + dst_token + t) * Fd + to, src.f32() + (b * Ts + src_token + t) * Fs + from,
                  static_cast<std::size_t>(count) * sizeof(float));
}

// Local chunk j (of `chunk` tokens) of x [B, Tl, F]: a contiguous copy [B, chunk, F].
Tensor chunk_copy(const Tensor& x, std::int64_t j, std::int64_t chunk) {
  Tensor out = Tensor::empty({x.dim(0), chunk, x.dim(2)});
  copy_tokens(x, j * chunk, 0, out, 0, 0, chunk, x.dim(2));
  return out;
}

// Chunk j of the travelling block, as a [B, chunk, width] view.
Tensor block_chunk(const Tensor& block, std::int64_t j) {
  return block.slice(0, j, 1).reshape({block.dim(1), block.dim(2), block.dim(3)});
}

// The travelling block [k, B, chunk, width], chunk-major so that each chunk is a contiguous [B, chunk, width]: per
// token the keys and values of the local qkv [B, k·chunk, 3D] (the rest zero).
Tensor key_value_block(const Tensor& qkv, std::int64_t chunks, std::int64_t chunk, std::int64_t width) {
  const std::int64_t D = qkv.dim(2) / 3;
  Tensor block = Tensor::zeros({chunks, qkv.dim(0), chunk, width});
  for (std::int64_t j = 0; j < chunks; ++j) {
    Tensor part = block_chunk(block, j);
    copy_tokens(qkv, j * chunk, D, part, 0, 0, chunk, 2 * D);
  }
  return block;
}

// Calls visit(i, j, causal) for every pair of a local query chunk i and a chunk j of the block from rank `source`
// whose keys some of chunk i's queries see (j earlier in the sequence: all of them; the same chunk: causally).
template <typename Visit>
void for_each_visible(const SequenceSplit& mine, const SequenceSplit& theirs, Visit&& visit) {
  for (std::size_t i = 0; i < mine.chunks.size(); ++i)
    for (std::size_t j = 0; j < theirs.chunks.size(); ++j)
      if (theirs.chunks[j] <= mine.chunks[i])
        visit(static_cast<std::int64_t>(i), static_cast<std::int64_t>(j), theirs.chunks[j] == mine.chunks[i]);
}

// Passes the travelling block to rank + 1 and takes rank − 1's.
void pass_on(dist::Communicator& ring, Tensor& block, Tensor& incoming, int tag) {
  const int ranks = ring.size(), rank = ring.rank();
  ring.send_receive(block.f32(), (rank + 1) % ranks, incoming.f32(), (rank + ranks - 1) % ranks, block.numel(), tag);
  std::swap(block, incoming);
}

}  // namespace

SequenceSplit sequence_split(std::int64_t tokens, int rank, int ranks) {
  PROPLAB_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && tokens % ranks == 0, "sequence_split: ", tokens,
                " tokens over ", ranks, " ranks (rank ", rank, ")");
  SequenceSplit split;
  if (ranks > 1 && tokens % (2 * ranks) == 0) {
    split.chunk = tokens / (2 * ranks);
    split.chunks = {rank, 2 * ranks - 1 - rank};
  } else {
    split.chunk = tokens / ranks;
    split.chunks = {rank};
  }
  return split;
}

void ring_attention_forward(dist::Communicator& ring, const Tensor& qkv, int heads, float logit_scale, Tensor& out,
                            Tensor& lse, probe::LogitSums* logit_sums) {
  const Shape3 s = check("ring_attention_forward", qkv, heads);
  const std::int64_t B = s.batch, T = s.tokens, D = s.model_dim, H = s.heads, Dh = D / H;
  PROPLAB_CHECK(out.numel() == B * T * D && lse.numel() == B * H * T,
                "ring_attention_forward: out must hold [B, Tl, D] and lse [B, H, Tl]");
  const int ranks = ring.size(), rank = ring.rank();
  const SequenceSplit mine = sequence_split(T * ranks, rank, ranks);
  const std::int64_t chunks = static_cast<std::int64_t>(mine.chunks.size()), c = mine.chunk;
  const Tensor queries = on_host(qkv);
  Tensor host_out = host_target(out), host_lse = host_target(lse);
  Tensor block = key_value_block(queries, chunks, c, 2 * D), incoming = Tensor::empty(block.shape());
  // Per query chunk: its queries, and the online softmax's running maximum and sum and unnormalised output.
  std::vector<Tensor> q, m, l, o;
  for (std::int64_t i = 0; i < chunks; ++i) {
    q.push_back(chunk_copy(queries, i, c));
    m.push_back(Tensor::empty({B, H, c}));
    std::fill(m.back().f32(), m.back().f32() + m.back().numel(), -std::numeric_limits<float>::infinity());
    l.push_back(Tensor::zeros({B, H, c}));
    o.push_back(Tensor::zeros({B, c, D}));
  }
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    for_each_visible(mine, sequence_split(T * ranks, source, ranks), [&](std::int64_t i, std::int64_t j, bool causal) {
      const std::size_t at = static_cast<std::size_t>(i);
      ops::attention_block_forward(q[at], block_chunk(block, j), heads, logit_scale, causal, m[at], l[at], o[at],
                                   logit_sums);
    });
    if (step + 1 < ranks) pass_on(ring, block, incoming, 3);
  }
  float* y = host_out.f32();
  float* saved = host_lse.f32();
  for (std::int64_t i = 0; i < chunks; ++i) {
    const float* m_data = m[static_cast<std::size_t>(i)].f32();
    const float* l_data = l[static_cast<std::size_t>(i)].f32();
    const float* o_data = o[static_cast<std::size_t>(i)].f32();
#pragma omp parallel for schedule(static)
    for (std::int64_t pair = 0; pair < B * H; ++pair) {
      const std::int64_t b = pair / H, h = pair % H;
      for (std::int64_t t = 0; t < c; ++t) {
        const std::int64_t at = pair * c + t, token = i * c + t;
        saved[pair * T + token] = m_data[at] + std::log(l_data[at]);
        const float inverse = 1.0f / l_data[at];
        for (std::int64_t d = 0; d < Dh; ++d)
          y[(b * T + token) * D + h * Dh + d] = o_data[(b * c + t) * D + h * Dh + d] * inverse;
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
  const SequenceSplit mine = sequence_split(T * ranks, rank, ranks);
  const std::int64_t chunks = static_cast<std::int64_t>(mine.chunks.size()), c = mine.chunk;
  const Tensor queries = on_host(qkv), gradient = on_host(d_out), saved = on_host(lse), output = on_host(out);
  Tensor host_d_qkv = host_target(d_qkv);
  // The travelling block: per token its keys, values, and their gradients so far, [k, B, c, 4D].
  Tensor block = key_value_block(queries, chunks, c, 4 * D), incoming = Tensor::empty(block.shape());
  // Per query chunk: its queries, output gradient, log-sum-exp, row term Σ_d d_out·out (summed in double) and d_q.
  std::vector<Tensor> q, g, chunk_lse, row_dot, d_q;
  for (std::int64_t i = 0; i < chunks; ++i) {
    q.push_back(chunk_copy(queries, i, c));
    g.push_back(chunk_copy(gradient, i, c));
    chunk_lse.push_back(Tensor::empty({B, H, c}));
    row_dot.push_back(Tensor::empty({B, H, c}));
    d_q.push_back(Tensor::zeros({B, c, D}));
    const float* y = output.f32();
    const float* grad = gradient.f32();
    float* lse_i = chunk_lse.back().f32();
    float* dot_i = row_dot.back().f32();
#pragma omp parallel for schedule(static)
    for (std::int64_t pair = 0; pair < B * H; ++pair) {
      const std::int64_t b = pair / H, h = pair % H;
      for (std::int64_t t = 0; t < c; ++t) {
        const std::int64_t token = i * c + t;
        lse_i[pair * c + t] = saved.f32()[pair * T + token];
        double dot = 0.0;
        for (std::int64_t d = 0; d < Dh; ++d) {
          const std::int64_t e = (b * T + token) * D + h * Dh + d;
          dot += static_cast<double>(grad[e]) * y[e];
        }
        dot_i[pair * c + t] = static_cast<float>(dot);
      }
    }
  }
  for (int step = 0; step < ranks; ++step) {
    const int source = source_at(rank, step, ranks);
    for_each_visible(mine, sequence_split(T * ranks, source, ranks), [&](std::int64_t i, std::int64_t j, bool causal) {
      const std::size_t at = static_cast<std::size_t>(i);
      Tensor visiting = block_chunk(block, j);
      ops::attention_block_backward(q[at], g[at], chunk_lse[at], row_dot[at], heads, logit_scale, causal, visiting,
                                    d_q[at]);
    });
    if (ranks > 1) pass_on(ring, block, incoming, 4);  // every block goes all the way round, home with its gradient
  }
  // Each chunk's d_q, and its home block's key and value gradients (features [2D, 4D)).
  for (std::int64_t i = 0; i < chunks; ++i) {
    copy_tokens(d_q[static_cast<std::size_t>(i)], 0, 0, host_d_qkv, i * c, 0, c, D);
    copy_tokens(block_chunk(block, i), 0, 2 * D, host_d_qkv, i * c, D, c, 2 * D);
  }
  deliver(host_d_qkv, d_qkv);
}

}  // namespace proplab
