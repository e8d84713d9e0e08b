#include "train/theory_run.h"

#include <cmath>

#include "data/dataset.h"
#include "models/model.h"
#include "models/profile.h"
#include "nn/parameter.h"
#include "ops/ops.h"
#include "probe/moments.h"
#include "data/images.h"
#include "scaling/resnet_theory.h"
#include "scaling/theory_numbers.h"

namespace proplab {

namespace {

// The first training micro-batch: what the step-0 record measures.
struct FirstBatch {
  Tensor inputs, targets;
};

FirstBatch first_batch(const RunSpec& spec) {
  const TransformerConfig& m = spec.model.transformer();
  const std::int64_t micro = spec.train.batch / spec.train.grad_accum;
  auto data = make_token_dataset(spec.data, m.vocab, m.seq_len, spec.seed);
  FirstBatch batch{Tensor::empty({micro, m.seq_len}, DType::i32), Tensor::empty({micro, m.seq_len}, DType::i32)};
  data->batch(Split::train, 0, batch.inputs, batch.targets);
  return batch;
}

// The token correlation of the embedding output (before dropout) on the first training batch: the same tables
// the model initialises (counter-based RNG keyed by the parameter names) and the same `corr` as the recorder.
double measured_input_corr(const RunSpec& spec, const ScalingRule& rule, const Tensor& inputs) {
  const TransformerConfig& m = spec.model.transformer();
  const std::int64_t micro = inputs.shape()[0];
  Tensor token = Tensor::empty({m.vocab, m.width}), position = Tensor::empty({m.seq_len, m.width});
  init_tensor(token, rule.init(ParamInfo{ParamRole::token_embedding, m.vocab, m.width, -1, "embed.token.weight"}),
              spec.seed, "embed.token.weight");
  init_tensor(position,
              rule.init(ParamInfo{ParamRole::position_embedding, m.seq_len, m.width, -1, "embed.position.weight"}),
              spec.seed, "embed.position.weight");
  Tensor embedded = Tensor::empty({micro, m.seq_len, m.width});
  ops::embedding_forward(inputs, token, &position, embedded);
  probe::MomentSums sums;
  probe::accumulate(embedded, micro, sums, probe::StatSelection().add(probe::Stat::corr));
  return probe::finalize(sums).corr;
}

// A ResNet's predictions: the rule's position-resolved bookkeeping (scaling/resnet_theory.h) for the stem, every
// block's stream in, branch and stream out, forward and backward; token correlations and the logits have none.
theory::ProbePrediction predict_resnet(const RunSpec& spec, const ScalingRule& rule) {
  const ResnetConfig& config = spec.model.resnet();
  ResnetTheoryOptions options;
  options.batch = spec.train.batch / spec.train.grad_accum;
  options.grad_scale = 1.0 / spec.train.grad_accum;
  // The first training batch's labels: how many of its images share a class (their loss gradients covary).
  {
    auto images = make_image_dataset(spec.data, config.in_channels, config.image_size, config.classes, spec.seed);
    Tensor x = Tensor::empty({options.batch, config.in_channels, config.image_size, config.image_size});
    Tensor y = Tensor::empty({options.batch}, DType::i32);
    images->batch(Split::train, 0, x, y);
    options.batch_targets.assign(y.i32(), y.i32() + y.numel());
  }
  // Every image kind gives pixels of variance 1 per channel (synthetic N(0, 1); files normalised per channel).
  const ResnetBookkeeping bookkeeping = resnet_bookkeeping(config, rule, 1.0, options);
  const double nan = std::nan("");
  theory::ProbePrediction prediction;
  prediction.formulae = bookkeeping.formulae;
  auto add = [&](const std::string& name, const char* kind, int block, const StreamMoments* moments, double backward,
                 double log_sd = std::nan("")) {
    theory::ProbeTheory p;
    p.var_log_sd = log_sd;
    p.name = name;
    p.kind = kind;
    p.block = block;
    p.mean = moments ? moments->mean : nan;
    p.var = moments ? moments->var : nan;
    p.corr = nan;
    p.backward_var = backward;
    p.no_forward = moments ? "corr: images have no token correlation in the bookkeeping"
                           : "the classifier's logits are outside the variance bookkeeping";
    if (std::isnan(backward)) p.no_backward = "the classifier's logits are outside the variance bookkeeping";
    prediction.probes.push_back(std::move(p));
  };
  add("stem.out", "embed", -1, &bookkeeping.stem, bookkeeping.grad_stem, bookkeeping.stem_log_sd);
  for (std::size_t b = 0; b < bookkeeping.stream_in.size(); ++b) {
    const std::string prefix = "blocks." + std::to_string(b);
    const int block = static_cast<int>(b);
    add(prefix + ".in", "residual", block, &bookkeeping.stream_in[b], bookkeeping.grad_in[b],
        bookkeeping.stream_in_log_sd[b]);
    add(prefix + ".branch", "branch", block, &bookkeeping.branch[b], bookkeeping.grad_branch[b],
        bookkeeping.branch_log_sd[b]);
    add(prefix + ".out", "residual", block, &bookkeeping.stream_out[b], bookkeeping.grad_out[b],
        bookkeeping.stream_out_log_sd[b]);
  }
  add("head.logits", "logits", -1, nullptr, nan);
  return prediction;
}

}  // namespace

theory::ProbePrediction predict_for_run(const RunSpec& spec) {
  return predict_for_run(spec, *make_model_rule(spec.model, spec.scaling, spec.seed));
}

theory::ProbePrediction predict_for_run(const RunSpec& spec, const ScalingRule& rule) {
  if (spec.model.kind() == ModelKind::resnet) return predict_resnet(spec, rule);
  theory::TheoryInputs inputs;
  inputs.sequences = spec.train.batch / spec.train.grad_accum;
  inputs.grad_scale = 1.0 / spec.train.grad_accum;
  if (spec.model.kind() == ModelKind::transformer) {
    const TransformerConfig& m = spec.model.transformer();
    inputs.tokens = m.seq_len;
    const FirstBatch batch = first_batch(spec);
    inputs.input_corr =
        spec.theory.input_corr ? *spec.theory.input_corr : measured_input_corr(spec, rule, batch.inputs);
    const auto ids = [](const Tensor& t) { return std::vector<std::int32_t>(t.i32(), t.i32() + t.numel()); };
    inputs.batch_inputs = ids(batch.inputs);
    inputs.batch_targets = ids(batch.targets);
    return theory::predict_transformer(transformer_numbers(rule, m), inputs);
  }
  // Gaussian data: x ~ N(0, I); regression targets y = W x (+ noise) with W entries N(0, 1/input_dim).
  inputs.input_mean = 0.0;
  inputs.input_var = 1.0;
  inputs.input_norm_spread = 2.0 / static_cast<double>(spec.model.mlp().input_dim);
  inputs.target_second_moment = 1.0 + spec.data.gaussian_noise * spec.data.gaussian_noise;
  const MlpConfig& m = spec.model.mlp();
  if (m.head == MlpHead::classification) {
    // The first training batch's labels: how many of its samples share a class (the readout's seed of the
    // gradient's mean over units is shared between them; docs/theory.md, "The gradient's mean over units").
    auto vectors = make_vector_dataset(spec.data, m.input_dim, m.outputs, true, spec.seed);
    Tensor x = Tensor::empty({inputs.sequences, m.input_dim});
    Tensor y = Tensor::empty({inputs.sequences}, DType::i32);
    vectors->batch(Split::train, 0, x, y);
    inputs.batch_targets.assign(y.i32(), y.i32() + y.numel());
  }
  return theory::predict_mlp(mlp_numbers(rule, m), inputs);
}

void write_theory(RunWriter& writer, const theory::ProbePrediction& prediction) {
  std::vector<double> var, mean, corr, backward_var, backward_corr, var_log_sd;
  for (const theory::ProbeTheory& p : prediction.probes) {
    var.push_back(p.var);
    var_log_sd.push_back(p.var_log_sd);
    mean.push_back(p.mean);
    corr.push_back(p.corr);
    backward_var.push_back(p.backward_var);
    backward_corr.push_back(p.backward_corr);
  }
  writer.write_doubles("/theory/forward/var", var);
  writer.write_doubles("/theory/forward/mean", mean);
  writer.write_doubles("/theory/forward/corr", corr);
  writer.write_doubles("/theory/forward/var_log_sd", var_log_sd);
  writer.write_doubles("/theory/backward/var", backward_var);
  writer.write_doubles("/theory/backward/corr", backward_corr);
  writer.write_attribute("/theory", "formulae", prediction.formulae);
  writer.write_attribute("/theory", "no_prediction", prediction.no_prediction_text());
}

}  // namespace proplab
