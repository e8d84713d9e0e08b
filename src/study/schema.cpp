#include "study/schema.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "data/config.h"
#include "probe/moments.h"
#include "scaling/rule.h"
#include "spec/model.h"
#include "train/recorder.h"

namespace proplab::study_detail {

std::string integer_range_text(std::int64_t lo, std::int64_t hi) {
  if (hi == kMaxInt64) return "an integer >= " + std::to_string(lo);
  return "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
}

namespace {

Field named(std::string key, std::string allowed) {
  Field field;
  field.key = std::move(key);
  field.allowed = std::move(allowed);
  return field;
}

template <class Ref>
using FieldType = std::remove_cvref_t<std::invoke_result_t<Ref, Study&>>;

template <class Ref>
Field integer_field(std::string key, Ref ref, std::int64_t lo, std::int64_t hi) {
  Field field = named(std::move(key), integer_range_text(lo, hi));
  field.read = [ref, lo, hi](const toml::node& node, Study& study) -> std::string {
    if (!node.is_integer()) return "expected an integer, got " + describe(node);
    const std::int64_t value = node.as_integer()->get();
    if (value < lo || value > hi) return std::to_string(value) + " is out of range";
    ref(study) = static_cast<FieldType<Ref>>(value);
    return {};
  };
  field.write = [ref](const Study& study) { return std::to_string(ref(study)); };
  return field;
}

// A number node in `range` into `value`; "" or the problem. Integers are accepted for numbers (lr = 1 means 1.0).
std::string read_number(const toml::node& node, const RealRange& range, double& value) {
  if (!node.is_number()) return "expected a number, got " + describe(node);
  value = node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
  if (!range.contains(value))
    return (node.is_integer() ? std::to_string(node.as_integer()->get()) : toml_float(value)) + " is out of range";
  return {};
}

// A float field stores the rounded value.
template <class Ref>
Field real_field(std::string key, Ref ref, RealRange range) {
  Field field = named(std::move(key), range.text());
  field.read = [ref, range](const toml::node& node, Study& study) -> std::string {
    double value = 0.0;
    std::string problem = read_number(node, range, value);
    if (problem.empty()) ref(study) = static_cast<FieldType<Ref>>(value);
    return problem;
  };
  field.write = [ref](const Study& study) {
    if constexpr (std::is_same_v<FieldType<Ref>, float>)
      return toml_float(float_as_decimal(ref(study)));
    else
      return toml_float(ref(study));
  };
  return field;
}

// An optional number: absent stays absent (and is left out of config_toml).
template <class Ref>
Field optional_real_field(std::string key, Ref ref, RealRange range) {
  Field field = named(std::move(key), range.text());
  field.read = [ref, range](const toml::node& node, Study& study) -> std::string {
    double value = 0.0;
    std::string problem = read_number(node, range, value);
    if (problem.empty()) ref(study) = value;
    return problem;
  };
  field.write = [ref](const Study& study) { return ref(study) ? toml_float(*ref(study)) : std::string("-"); };
  field.present = [ref](const Study& study) { return ref(study).has_value(); };
  return field;
}

template <class Ref>
Field bool_field(std::string key, Ref ref) {
  Field field = named(std::move(key), "true or false");
  field.read = [ref](const toml::node& node, Study& study) -> std::string {
    if (!node.is_boolean()) return "expected a boolean, got " + describe(node);
    ref(study) = node.as_boolean()->get();
    return {};
  };
  field.write = [ref](const Study& study) { return std::string(ref(study) ? "true" : "false"); };
  return field;
}

// A boolean that is true unless set: written to config_toml only when false, so that the studies and run files of
// before it existed keep their text.
template <class Ref>
Field optional_false_field(std::string key, Ref ref) {
  Field field = bool_field(std::move(key), ref);
  field.present = [ref](const Study& study) { return !ref(study); };
  return field;
}

template <class Ref>
Field choice_field(std::string key, Ref ref, std::vector<std::pair<std::string, FieldType<Ref>>> choices) {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  std::vector<std::string> quoted;
  for (const auto& name : names) quoted.push_back(toml_string(name));
  Field field = named(std::move(key), "one of " + join(quoted, ", "));
  field.read = [ref, choices, names](const toml::node& node, Study& study) -> std::string {
    if (!node.is_string()) return "expected a string, got " + describe(node);
    const std::string& value = node.as_string()->get();
    for (const auto& [name, choice] : choices) {
      if (name == value) {
        ref(study) = choice;
        return {};
      }
    }
    const auto suggestion = closest(value, names);
    return toml_string(value) + " is not a choice" +
           (suggestion ? " (did you mean " + toml_string(*suggestion) + "?)" : std::string());
  };
  field.write = [ref, choices](const Study& study) {
    for (const auto& [name, choice] : choices)
      if (choice == ref(study)) return toml_string(name);
    PROPLAB_CHECK(false, "a study field holds a value its schema cannot name");
    return std::string();
  };
  return field;
}

// model.type: which of the model configs the study fills (ModelConfig::set_kind), read before its keys.
Field model_kind_field() {
  std::vector<std::string> names, quoted;
  for (const ModelKind kind : kModelKinds) {
    names.push_back(model_kind_name(kind));
    quoted.push_back(toml_string(names.back()));
  }
  Field field = named("type", "one of " + join(quoted, ", "));
  field.read = [names](const toml::node& node, Study& study) -> std::string {
    if (!node.is_string()) return "expected a string, got " + describe(node);
    const std::string& value = node.as_string()->get();
    for (const ModelKind kind : kModelKinds) {
      if (value == model_kind_name(kind)) {
        study.model.set_kind(kind);
        return {};
      }
    }
    const auto suggestion = closest(value, names);
    return toml_string(value) + " is not a choice" +
           (suggestion ? " (did you mean " + toml_string(*suggestion) + "?)" : std::string());
  };
  field.write = [](const Study& study) { return toml_string(model_kind_name(study.model.kind())); };
  return field;
}

// A free string; `check` returns "" or the problem.
template <class Ref>
Field string_field(std::string key, Ref ref, std::string allowed,
                   std::function<std::string(const std::string&)> check) {
  Field field = named(std::move(key), std::move(allowed));
  field.read = [ref, check](const toml::node& node, Study& study) -> std::string {
    if (!node.is_string()) return "expected a string, got " + describe(node);
    const std::string& value = node.as_string()->get();
    if (std::string problem = check(value); !problem.empty()) return problem;
    ref(study) = value;
    return {};
  };
  field.write = [ref](const Study& study) { return toml_string(ref(study)); };
  return field;
}

// An array of distinct names from `names` (an empty array keeps its documented meaning, "all").
template <class Ref>
Field name_list_field(std::string key, Ref ref, std::vector<std::string> names) {
  Field field = named(std::move(key), "an array of distinct names from: " + join(names, ", "));
  field.read = [ref, names](const toml::node& node, Study& study) -> std::string {
    const toml::array* array = node.as_array();
    if (!array) return "expected an array of strings, got " + describe(node);
    std::vector<std::string> values;
    std::vector<std::string> problems;
    for (const toml::node& item : *array) {
      if (!item.is_string()) {
        problems.push_back("item " + std::to_string(values.size()) + " is " + describe(item));
        values.emplace_back();
        continue;
      }
      const std::string& value = item.as_string()->get();
      if (std::find(names.begin(), names.end(), value) == names.end()) {
        const auto suggestion = closest(value, names);
        problems.push_back(toml_string(value) + " is not a statistic" +
                           (suggestion ? " (did you mean " + toml_string(*suggestion) + "?)" : std::string()));
      } else if (std::find(values.begin(), values.end(), value) != values.end()) {
        problems.push_back(toml_string(value) + " is listed twice");
      }
      values.push_back(value);
    }
    if (!problems.empty()) return join(problems, ", ");
    ref(study) = values;
    return {};
  };
  field.write = [ref](const Study& study) { return toml_string_array(ref(study)); };
  return field;
}

Field when(Field field, std::string selector, std::string applies_text, std::function<bool(const Study&)> applies) {
  field.selector = std::move(selector);
  field.applies_text = std::move(applies_text);
  field.applies = std::move(applies);
  return field;
}

Field required(Field field) {
  field.required = true;
  return field;
}

std::string check_name(const std::string& name) {
  const bool safe = std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '=' || c == ',';
  });
  if (name.empty()) return "is empty";
  if (!safe) return toml_string(name) + " has characters that are not safe in file names";
  if (name == "." || name == "..") return toml_string(name) + " names a directory";
  if (name.size() > 128) return "is longer than 128 characters";
  return {};
}

std::string check_not_empty(const std::string& text) { return text.empty() ? "is empty" : ""; }

// The statistic names, from the one list of each (probe/moments.h, train/recorder.h).
const std::vector<std::string> kActivationStatistics(probe::stat_names().begin(), probe::stat_names().end());
const std::vector<std::string>& kParamStatistics = param_stat_names();

#define PROPLAB_MEMBER(member) \
  [](auto& study) -> auto& { return study.member; }

}  // namespace

std::vector<TableSpec> build_schema() {
  const auto transformer = [](Field field) {
    return when(std::move(field), "model.type", "model.type = \"transformer\"",
                [](const Study& s) { return s.model.kind() == ModelKind::transformer; });
  };
  const auto mlp = [](Field field) {
    return when(std::move(field), "model.type", "model.type = \"mlp\"",
                [](const Study& s) { return s.model.kind() == ModelKind::mlp; });
  };
  const auto resnet = [](Field field) {
    return when(std::move(field), "model.type", "model.type = \"resnet\"",
                [](const Study& s) { return s.model.kind() == ModelKind::resnet; });
  };
  const auto adamw = [](Field field) {
    return when(std::move(field), "train.optimizer", "train.optimizer = \"adamw\"",
                [](const Study& s) { return s.train.optimizer == OptimizerKind::adamw; });
  };
  const auto sgd = [](Field field) {
    return when(std::move(field), "train.optimizer", "train.optimizer = \"sgd\"",
                [](const Study& s) { return s.train.optimizer == OptimizerKind::sgd; });
  };
  const auto data_kind = [](Field field, std::vector<std::string> kinds) {
    std::vector<std::string> quoted;
    for (const auto& kind : kinds) quoted.push_back(toml_string(kind));
    return when(std::move(field), "data.kind", "data.kind = " + join(quoted, " or "),
                [kinds](const Study& s) { return std::find(kinds.begin(), kinds.end(), s.data.kind) != kinds.end(); });
  };
  const RealRange non_negative{0, kInf};
  const RealRange unit_open{0, 1, false, true};  // [0, 1)

  return {
      {"",
       {
           required(string_field("name", PROPLAB_MEMBER(name),
                                 "a name of letters, digits, '.', '_', '-', '=' and ',' (at most 128 characters)",
                                 check_name)),
           integer_field("seed", PROPLAB_MEMBER(seed), 0, kMaxInt64),
       }},
      {"model",
       {
           model_kind_field(),
           transformer(integer_field("layers", PROPLAB_MEMBER(model.transformer().layers), 1, 100000)),
           transformer(integer_field("width", PROPLAB_MEMBER(model.transformer().width), 1, kMaxDim)),
           transformer(integer_field("heads", PROPLAB_MEMBER(model.transformer().heads), 1, kMaxDim)),
           transformer(integer_field("ffn_mult", PROPLAB_MEMBER(model.transformer().ffn_mult), 1, 64)),
           transformer(choice_field("norm", PROPLAB_MEMBER(model.transformer().norm),
                                    {{"pre", NormPlacement::pre},
                                     {"post", NormPlacement::post},
                                     {"both", NormPlacement::both},
                                     {"none", NormPlacement::none}})),
           transformer(choice_field("norm_kind", PROPLAB_MEMBER(model.transformer().norm_kind),
                                    {{"layernorm", NormKind::layernorm}, {"rmsnorm", NormKind::rmsnorm}})),
           transformer(bool_field("norm_affine", PROPLAB_MEMBER(model.transformer().norm_affine))),
           transformer(real_field("norm_eps", PROPLAB_MEMBER(model.transformer().norm_eps), RealRange{0, 1, true})),
           transformer(bool_field("bias", PROPLAB_MEMBER(model.transformer().bias))),
           transformer(choice_field(
               "activation", PROPLAB_MEMBER(model.transformer().activation),
               {{"gelu", Activation::gelu_tanh}, {"gelu_erf", Activation::gelu_erf}, {"relu", Activation::relu}})),
           transformer(real_field("dropout", PROPLAB_MEMBER(model.transformer().dropout), unit_open)),
           transformer(integer_field("vocab", PROPLAB_MEMBER(model.transformer().vocab), 2, kMaxDim)),
           transformer(integer_field("seq_len", PROPLAB_MEMBER(model.transformer().seq_len), 1, kMaxDim)),
           transformer(bool_field("tie_embeddings", PROPLAB_MEMBER(model.transformer().tie_embeddings))),
           mlp(integer_field("layers", PROPLAB_MEMBER(model.mlp().layers), 1, 100000)),
           mlp(integer_field("width", PROPLAB_MEMBER(model.mlp().width), 1, kMaxDim)),
           mlp(integer_field("input_dim", PROPLAB_MEMBER(model.mlp().input_dim), 1, kMaxDim)),
           mlp(integer_field("outputs", PROPLAB_MEMBER(model.mlp().outputs), 1, kMaxDim)),
           mlp(choice_field("activation", PROPLAB_MEMBER(model.mlp().activation),
                            {{"relu", Activation::relu},
                             {"tanh", Activation::tanh},
                             {"gelu", Activation::gelu_tanh},
                             {"linear", Activation::identity}})),
           mlp(real_field("sigma_w2", PROPLAB_MEMBER(model.mlp().sigma_w2), RealRange{0, 1000})),
           mlp(real_field("sigma_b2", PROPLAB_MEMBER(model.mlp().sigma_b2), RealRange{0, 1000})),
           mlp(bool_field("residual", PROPLAB_MEMBER(model.mlp().residual))),
           mlp(choice_field("head", PROPLAB_MEMBER(model.mlp().head),
                            {{"regression", MlpHead::regression}, {"classification", MlpHead::classification}})),
           resnet(integer_field("depth", PROPLAB_MEMBER(model.resnet().depth), 8, 100000)),
           resnet(integer_field("width", PROPLAB_MEMBER(model.resnet().width), 1, 64)),
           resnet(choice_field("block", PROPLAB_MEMBER(model.resnet().block),
                               {{"basic", ResnetBlock::basic}, {"bottleneck", ResnetBlock::bottleneck}})),
           resnet(choice_field("norm", PROPLAB_MEMBER(model.resnet().norm),
                               {{"batchnorm", ResnetNorm::batchnorm}, {"none", ResnetNorm::none}})),
           resnet(bool_field("preact", PROPLAB_MEMBER(model.resnet().preact))),
           resnet(choice_field("activation", PROPLAB_MEMBER(model.resnet().activation),
                               {{"relu", Activation::relu},
                                {"gelu", Activation::gelu_tanh},
                                {"gelu_erf", Activation::gelu_erf},
                                {"tanh", Activation::tanh}})),
           resnet(integer_field("in_channels", PROPLAB_MEMBER(model.resnet().in_channels), 1, 64)),
           resnet(integer_field("image_size", PROPLAB_MEMBER(model.resnet().image_size), 4, 1024)),
           resnet(integer_field("classes", PROPLAB_MEMBER(model.resnet().classes), 2, kMaxDim)),
           resnet(real_field("norm_eps", PROPLAB_MEMBER(model.resnet().norm_eps), RealRange{0, 1, true})),
           resnet(real_field("bn_momentum", PROPLAB_MEMBER(model.resnet().bn_momentum), RealRange{0, 1})),
       }},
      {"train",
       {
           choice_field("optimizer", PROPLAB_MEMBER(train.optimizer),
                        {{"adamw", OptimizerKind::adamw}, {"sgd", OptimizerKind::sgd}}),
           integer_field("steps", PROPLAB_MEMBER(train.steps), 1, kMaxSteps),
           integer_field("batch", PROPLAB_MEMBER(train.batch), 1, kMaxDim),
           integer_field("grad_accum", PROPLAB_MEMBER(train.grad_accum), 1, kMaxDim),
           real_field("lr", PROPLAB_MEMBER(train.lr), RealRange{0, 100, true}),
           adamw(real_field("beta1", PROPLAB_MEMBER(train.beta1), unit_open)),
           adamw(real_field("beta2", PROPLAB_MEMBER(train.beta2), unit_open)),
           adamw(real_field("eps", PROPLAB_MEMBER(train.eps), RealRange{0, 1, true})),
           sgd(real_field("momentum", PROPLAB_MEMBER(train.momentum), unit_open)),
           sgd(bool_field("nesterov", PROPLAB_MEMBER(train.nesterov))),
           choice_field("schedule", PROPLAB_MEMBER(train.schedule),
                        {{"constant", ScheduleKind::constant}, {"cosine", ScheduleKind::cosine}}),
           integer_field("warmup", PROPLAB_MEMBER(train.warmup), 0, kMaxSteps),
           real_field("min_lr_ratio", PROPLAB_MEMBER(train.min_lr_ratio), RealRange{0, 1}),
           real_field("weight_decay", PROPLAB_MEMBER(train.weight_decay), RealRange{0, 10}),
           real_field("grad_clip", PROPLAB_MEMBER(train.grad_clip), non_negative),
           integer_field("eval_every", PROPLAB_MEMBER(train.eval_every), 0, kMaxSteps),
           integer_field("eval_batches", PROPLAB_MEMBER(train.eval_batches), 1, 100000),
           integer_field("checkpoint_every", PROPLAB_MEMBER(train.checkpoint_every), 0, kMaxSteps),
           optional_false_field("final_checkpoint", PROPLAB_MEMBER(train.final_checkpoint)),
       }},
      {"data",
       {
           choice_field("kind", PROPLAB_MEMBER(data.kind),
                        {{"uniform", "uniform"},
                         {"markov", "markov"},
                         {"text", "text"},
                         {"tokens", "tokens"},
                         {"gaussian", "gaussian"},
                         {"images", "images"},
                         {"idx", "idx"},
                         {"cifar10", "cifar10"}}),
           data_kind(string_field("path", PROPLAB_MEMBER(data.path),
                                  "a readable file, or for idx and cifar10 the directory of the files (relative paths "
                                  "start at the study file's directory)",
                                  check_not_empty),
                     {"text", "tokens", "idx", "cifar10"}),
           data_kind(bool_field("augment", PROPLAB_MEMBER(data.augment)), {"idx", "cifar10"}),
           data_kind(integer_field("crop_padding", PROPLAB_MEMBER(data.crop_padding), 0, 64), {"idx", "cifar10"}),
           data_kind(bool_field("flip", PROPLAB_MEMBER(data.flip)), {"idx", "cifar10"}),
           real_field("val_fraction", PROPLAB_MEMBER(data.val_fraction), RealRange{0, 1, true, true}),
           data_kind(integer_field("markov_successors", PROPLAB_MEMBER(data.markov_successors), 1, kMaxDim),
                     {"markov"}),
           data_kind(
               real_field("markov_temperature", PROPLAB_MEMBER(data.markov_temperature), RealRange{0, 1000, true}),
               {"markov"}),
           data_kind(real_field("gaussian_noise", PROPLAB_MEMBER(data.gaussian_noise), RealRange{0, 1000}),
                     {"gaussian"}),
       }},
      {"record",
       {
           integer_field("every", PROPLAB_MEMBER(record.every), 1, kMaxSteps),
           bool_field("log_spaced", PROPLAB_MEMBER(record.log_spaced)),
           name_list_field("forward", PROPLAB_MEMBER(record.forward), kActivationStatistics),
           name_list_field("backward", PROPLAB_MEMBER(record.backward), kActivationStatistics),
           name_list_field("params", PROPLAB_MEMBER(record.params), kParamStatistics),
           choice_field("on_nonfinite", PROPLAB_MEMBER(record.on_nonfinite),
                        {{"stop", "stop"}, {"continue", "continue"}}),
       }},
      {"parallel",
       {
           integer_field("dp", PROPLAB_MEMBER(parallel.dp), 1, 4096),
           integer_field("tp", PROPLAB_MEMBER(parallel.tp), 1, 4096),
           integer_field("pp", PROPLAB_MEMBER(parallel.pp), 1, 4096),
           integer_field("sp", PROPLAB_MEMBER(parallel.sp), 1, 4096),
           integer_field("microbatches", PROPLAB_MEMBER(parallel.microbatches), 1, 1000000),
           real_field("timeout_s", PROPLAB_MEMBER(parallel.timeout_s), RealRange{0, 86400, true}),
           choice_field("dp_mode", PROPLAB_MEMBER(parallel.dp_mode),
                        {{"allreduce", "allreduce"}, {"local_sgd", "local_sgd"}, {"gossip", "gossip"}}),
           integer_field("sync_every", PROPLAB_MEMBER(parallel.sync_every), 1, 1000000),
           real_field("bucket_mb", PROPLAB_MEMBER(parallel.bucket_mb), RealRange{0, 65536}),
           integer_field("zero", PROPLAB_MEMBER(parallel.zero), 0, 1),
           choice_field(
               "compress", PROPLAB_MEMBER(parallel.compress),
               {{"none", "none"}, {"bf16", "bf16"}, {"int8", "int8"}, {"topk", "topk"}, {"powersgd", "powersgd"}}),
           real_field("compress_ratio", PROPLAB_MEMBER(parallel.compress_ratio), RealRange{0, 1, true}),
           integer_field("compress_rank", PROPLAB_MEMBER(parallel.compress_rank), 1, 65536),
           choice_field("pp_compress", PROPLAB_MEMBER(parallel.pp_compress),
                        {{"none", "none"}, {"bf16", "bf16"}, {"int8", "int8"}}),
           choice_field("comm", PROPLAB_MEMBER(parallel.comm),
                        {{"auto", "auto"}, {"nccl", "nccl"}, {"staged", "staged"}}),
       }},
      {"device",
       {
           choice_field("type", PROPLAB_MEMBER(device.type), {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}}),
           integer_field("threads", PROPLAB_MEMBER(device.threads), 0, 4096),
           choice_field("precision", PROPLAB_MEMBER(device.precision), {{"fp32", "fp32"}, {"bf16", "bf16"}}),
       }},
      {"theory",
       {
           transformer(optional_real_field("input_corr", PROPLAB_MEMBER(theory.input_corr), RealRange{-1, 1})),
       }},
  };
}

#undef PROPLAB_MEMBER

}  // namespace proplab::study_detail
