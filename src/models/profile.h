// models/profile: the profiling forward pass of scaling rules whose residual weights are measured on the
// initialised model (Admin), and make_model_rule(), the one place where models and theory paths build a rule.
//
// Invariants:
// - The pass is a pure function of (model config, rule, seed): the model is the one the rule initialises from
//   `seed` but with every residual weight λ = β = 1 (parameters are keyed by name, so its values equal the real
//   model's), and the batch is `sequences` × seq_len uniform random tokens, token k (flat index b·seq_len + t)
//   = CounterRng(seed, stream_id("admin_profile")).below(k, vocab) — never the training data, so a run, its
//   /theory predictions and `proplab theory` all get bitwise the same profile without reading data. With
//   model.dropout > 0 the pass runs in training mode (as the reference code profiles), its masks keyed by the
//   reserved micro-step kProfileMicroStep, which no training micro-batch has.
// - Variances are population variances over the whole probed tensor (probe/moments, deterministic for any thread
//   count), of the probes embed.out and blocks.l.{attn,ffn}.out (the branch output after dropout).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include "spec/model.h"
#include "scaling/config.h"
#include "scaling/rule.h"

namespace proplab {

constexpr std::uint64_t kProfileMicroStep = std::numeric_limits<std::uint64_t>::max();

// Runs the profiling pass of a transformer initialised by `rule` (λ = β = 1 everywhere) on `sequences` sequences.
RuleProfile profile_transformer(const TransformerConfig& config, const ScalingRule& rule, std::uint64_t seed,
                                int sequences);

// make_rule(), then the profiling pass when the rule asks for one (set_profile() with its result): the rule that
// make_model's model and every theory prediction for (config, scaling, seed) use.
std::unique_ptr<ScalingRule> make_model_rule(const ModelConfig& config, const ScalingConfig& scaling,
                                             std::uint64_t seed);

}  // namespace proplab
