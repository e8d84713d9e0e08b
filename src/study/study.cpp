// study: the validator behind load_study / parse_study (see study.h and docs/studies.md).
//
// One schema drives everything: each table is a list of Fields, and a Field knows its key, what is allowed (as
// text for messages), how to check a TOML node and store it into the Study, how to write the stored value back as
// TOML, and when it applies (keys of another model type, data kind or optimizer are errors that name the setting
// they belong to). The same schema writes config_toml, so the resolved text always parses back to the same
// Study. [scaling] is checked against the rule registry (scaling/rule.h) instead of a fixed list.
//
// Problems are collected, never thrown one by one: each becomes one line
//   <file>:<line>: <key.path>: <problem>; allowed: <what>      (or `--set <text>` for values set by an override)
// and load_study throws a single UserError with every line, sorted by line, override problems last.
#include "study/study.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "data/config.h"
#include "probe/moments.h"
#include "scaling/rule.h"
#include "spec/model.h"
#include "train/recorder.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMaxSteps = 1'000'000'000'000;  // steps and every step interval
constexpr std::int64_t kMaxDim = 1 << 20;              // widths, vocabularies, sequence lengths, batches
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- text helpers ------------------------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string::size_type begin = 0;
  while (true) {
    const auto end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

// Shortest text that reads back as exactly `value`.
std::string shortest(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// A TOML float literal (always with a '.' or an exponent, so it reads back as a float).
std::string toml_float(double value) {
  std::string text = shortest(value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// The double whose shortest text equals the float's shortest text: 1e-5f is written as 1e-05, not 9.99...e-06.
double float_as_decimal(float value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
}

// A TOML basic string.
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_string_array(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items) quoted.push_back(toml_string(item));
  return "[" + join(quoted, ", ") + "]";
}

// What a node is, for "expected X, got Y" messages.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "string " + toml_string(node.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + toml_float(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const bool same =
          std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate closest to `word` when it is close enough to be a likely typo (or one is a prefix of the other).
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& candidate : candidates) {
    std::size_t distance = edit_distance(word, candidate);
    const std::size_t shorter = std::min(word.size(), candidate.size());
    const bool prefix = shorter >= 3 && (word.rfind(candidate, 0) == 0 || candidate.rfind(word, 0) == 0);
    if (distance > std::max<std::size_t>(2, word.size() / 3) && !prefix) continue;
    if (prefix) distance = std::min(distance, std::size_t{1});
    if (distance < best_distance) best_distance = distance, best = candidate;
  }
  return best;
}

std::string integer_range_text(std::int64_t lo, std::int64_t hi) {
  if (hi == kMaxInt64) return "an integer >= " + std::to_string(lo);
  return "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
}

struct RealRange {
  double lo;
  double hi;
  bool lo_open = false;
  bool hi_open = false;
  bool contains(double v) const {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string text() const {
    if (hi == kInf) return std::string("a finite number ") + (lo_open ? "> " : ">= ") + shortest(lo);
    return std::string("a number in ") + (lo_open ? "(" : "[") + shortest(lo) + ", " + shortest(hi) +
           (hi_open ? ")" : "]");
  }
};

// ---- the schema --------------------------------------------------------------------------------------------------

struct Field {
  std::string key;
  std::string allowed;
  bool required = false;
  // Checks the node and stores its value; returns "" or the problem.
  std::function<std::string(const toml::node&, Study&)> read;
  // The stored value as TOML text.
  std::function<std::string(const Study&)> write;
  // When the key may appear (empty: always); `selector` is the key path the condition looks at.
  std::function<bool(const Study&)> applies;
  std::string selector;
  std::string applies_text;
  // Whether config_toml writes the key (empty: always); false for an optional key that was not given.
  std::function<bool(const Study&)> present;
};

struct TableSpec {
  std::string name;  // "" for the top level
  std::vector<Field> fields;
};

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

// Integers are accepted for numbers (lr = 1 means 1.0); a float field stores the rounded value.
template <class Ref>
Field real_field(std::string key, Ref ref, RealRange range) {
  Field field = named(std::move(key), range.text());
  field.read = [ref, range](const toml::node& node, Study& study) -> std::string {
    if (!node.is_number()) return "expected a number, got " + describe(node);
    const double value =
        node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
    if (!range.contains(value))
      return (node.is_integer() ? std::to_string(node.as_integer()->get()) : toml_float(value)) + " is out of range";
    ref(study) = static_cast<FieldType<Ref>>(value);
    return {};
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
    if (!node.is_number()) return "expected a number, got " + describe(node);
    const double value =
        node.is_integer() ? static_cast<double>(node.as_integer()->get()) : node.as_floating_point()->get();
    if (!range.contains(value))
      return (node.is_integer() ? std::to_string(node.as_integer()->get()) : toml_float(value)) + " is out of range";
    ref(study) = value;
    return {};
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
  for (const ModelKind kind : {ModelKind::transformer, ModelKind::mlp, ModelKind::resnet}) {
    names.push_back(model_kind_name(kind));
    quoted.push_back(toml_string(names.back()));
  }
  Field field = named("type", "one of " + join(quoted, ", "));
  field.read = [names](const toml::node& node, Study& study) -> std::string {
    if (!node.is_string()) return "expected a string, got " + describe(node);
    const std::string& value = node.as_string()->get();
    for (const ModelKind kind : {ModelKind::transformer, ModelKind::mlp, ModelKind::resnet}) {
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

// Every table but [scaling] (checked against the rule registry) and [sweep] (free-form), in reading order:
// selectors (model.type, data.kind, train.optimizer) come before the keys that depend on them.
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
           transformer(choice_field(
               "norm", PROPLAB_MEMBER(model.transformer().norm),
               {{"pre", NormPlacement::pre}, {"post", NormPlacement::post}, {"none", NormPlacement::none}})),
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
           integer_field("microbatches", PROPLAB_MEMBER(parallel.microbatches), 1, 1000000),
           real_field("timeout_s", PROPLAB_MEMBER(parallel.timeout_s), RealRange{0, 86400, true}),
           choice_field("dp_mode", PROPLAB_MEMBER(parallel.dp_mode),
                        {{"allreduce", "allreduce"}, {"local_sgd", "local_sgd"}, {"gossip", "gossip"}}),
           integer_field("sync_every", PROPLAB_MEMBER(parallel.sync_every), 1, 1000000),
           real_field("bucket_mb", PROPLAB_MEMBER(parallel.bucket_mb), RealRange{0, 65536}),
           integer_field("zero", PROPLAB_MEMBER(parallel.zero), 0, 1),
       }},
      {"device",
       {
           choice_field("type", PROPLAB_MEMBER(device.type), {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}}),
           integer_field("threads", PROPLAB_MEMBER(device.threads), 0, 4096),
       }},
      {"theory",
       {
           transformer(optional_real_field("input_corr", PROPLAB_MEMBER(theory.input_corr), RealRange{-1, 1})),
       }},
  };
}

#undef PROPLAB_MEMBER

// The top-level keys, in the order config_toml writes them.
const std::vector<std::string> kTopLevelKeys = {"name",   "seed",     "model",  "scaling", "train", "data",
                                                "record", "parallel", "device", "theory",  "sweep"};

// ---- the validator -----------------------------------------------------------------------------------------------

class Validator {
 public:
  Validator(std::string source_name, std::string base_dir)
      : source_name_(std::move(source_name)), base_dir_(std::move(base_dir)) {}

  // Edits the tree with one "key.path=value" override (a problem is recorded when it is malformed).
  void apply_override(toml::table& root, const std::string& text);
  // Checks the whole tree and fills `study`; returns false when a problem was found.
  bool validate(const toml::table& root, Study& study);
  std::string config_toml(const Study& study) const;
  // Every problem, one per line.
  std::string report() const;

 private:
  struct Where {
    std::string text;
    bool from_override = false;
    std::uint32_t line = 0;
  };
  struct Problem {
    Where where;
    std::string text;
  };

  void read_table(const TableSpec& spec, const toml::node* node, Study& study);
  void read_scaling(const toml::node* node, Study& study);
  void check_combinations(Study& study);
  void check_data_file(Study& study);

  // Records `<where>: <path>: <problem>; allowed: <allowed>`. The location is the override that set `path` or one
  // of `also`, else the line of `node`, else of the first of `path`, `also` (then their tables) in the file.
  void add(const std::string& path, const toml::node* node, const std::string& problem, const std::string& allowed,
           const std::vector<std::string>& also = {});
  // Records `<where>: <body>`.
  void add_at(Where where, const std::string& body) {
    std::string text = where.text + ": " + body;
    problems_.push_back({std::move(where), std::move(text)});
  }
  Where locate(const std::string& path, const toml::node* node, const std::vector<std::string>& also) const;
  const toml::node* lookup(const std::string& path) const;
  // None of `paths` (nor the table holding it) was rejected.
  bool ok(std::initializer_list<const char*> paths) const {
    return std::none_of(paths.begin(), paths.end(), [&](const std::string& path) {
      return failed_.count(path) > 0 || failed_.count(path.substr(0, path.find('.'))) > 0;
    });
  }

  std::string source_name_;
  std::string base_dir_;
  const toml::table* root_ = nullptr;
  std::vector<TableSpec> schema_ = build_schema();
  std::map<std::string, std::string> overrides_;  // key path -> the --set text that set it
  std::vector<Problem> problems_;
  std::set<std::string> failed_;  // key paths whose value was rejected (combination checks skip them)
  const toml::table* sweep_ = nullptr;
};

void Validator::apply_override(toml::table& root, const std::string& text) {
  const Where where{"--set " + text, true};
  const std::string allowed =
      "key.path=value with a TOML value (8, 1e-3, true, \"text\", [\"a\", \"b\"]) or a bare "
      "word taken as a string, e.g. model.layers=8 or scaling.rule=xavier";
  const auto equals = text.find('=');
  if (equals == std::string::npos) return add_at(where, "malformed override: no '='; allowed: " + allowed);
  const std::string key = trim(text.substr(0, equals));
  const std::string value_text = trim(text.substr(equals + 1));
  const std::vector<std::string> segments = split(key, '.');
  for (const auto& segment : segments) {
    const bool bare = !segment.empty() && std::all_of(segment.begin(), segment.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!bare)
      return add_at(where, "malformed override: " + toml_string(key) + " is not a key path; allowed: " + allowed);
  }
  if (value_text.empty()) return add_at(where, key + ": malformed override: no value after '='; allowed: " + allowed);

  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("value = " + value_text), std::string_view("--set"));
  } catch (const toml::parse_error& error) {
    // A bare word (no spaces, quotes, brackets or TOML punctuation) that is not a TOML value is a string.
    const bool bare_word = value_text.find_first_of(" \t\"'[]{},=#") == std::string::npos;
    if (!bare_word)
      return add_at(where, key + ": malformed value: " + std::string(error.description()) + "; allowed: " + allowed);
    parsed.insert_or_assign("value", value_text);
  }
  if (parsed.size() != 1) return add_at(where, key + ": malformed value: more than one value; allowed: " + allowed);

  toml::table* table = &root;
  std::string prefix;
  for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
    prefix += (i ? "." : "") + segments[i];
    toml::node* child = table->get(segments[i]);
    if (!child) child = &table->insert_or_assign(segments[i], toml::table{}).first->second;
    if (!child->is_table())
      return add_at(where, prefix + ": is " + describe(*child) + ", not a table; allowed: a key path into tables");
    table = child->as_table();
  }
  table->insert_or_assign(segments.back(), std::move(*parsed.get("value")));
  // A later override of a table replaces what earlier overrides set inside it.
  for (auto it = overrides_.begin(); it != overrides_.end();)
    it = it->first.rfind(key + ".", 0) == 0 ? overrides_.erase(it) : std::next(it);
  overrides_[key] = text;
}

const toml::node* Validator::lookup(const std::string& path) const {
  if (path.empty()) return root_;
  const toml::node* node = root_;
  for (const auto& segment : split(path, '.')) {
    const toml::table* table = node ? node->as_table() : nullptr;
    node = table ? table->get(segment) : nullptr;
    if (!node) return nullptr;
  }
  return node;
}

Validator::Where Validator::locate(const std::string& path, const toml::node* node,
                                   const std::vector<std::string>& also) const {
  std::vector<std::string> paths{path.substr(0, path.find('['))};
  paths.insert(paths.end(), also.begin(), also.end());
  for (const auto& candidate : paths) {
    // The longest override path that is `candidate` or one of its tables.
    const std::string* best = nullptr;
    std::size_t best_length = 0;
    for (const auto& [key, text] : overrides_) {
      const bool covers = candidate == key || candidate.rfind(key + ".", 0) == 0;
      if (covers && key.size() >= best_length) best = &text, best_length = key.size();
    }
    if (best) return {"--set " + *best, true};
  }
  const auto file_line = [&](const toml::node* n) -> std::optional<Where> {
    if (!n || n->source().begin.line == 0) return std::nullopt;
    return Where{source_name_ + ":" + std::to_string(n->source().begin.line), false, n->source().begin.line};
  };
  if (auto where = file_line(node)) return *where;
  for (const auto& candidate : paths)
    if (auto where = file_line(lookup(candidate))) return *where;
  // A table that exists only because an override created it (`--set foo.bar=1` makes [foo]).
  for (const auto& candidate : paths)
    for (const auto& [key, text] : overrides_)
      if (key.rfind(candidate + ".", 0) == 0) return {"--set " + text, true};
  for (const auto& candidate : paths) {
    for (std::string table = candidate; !table.empty();) {
      const auto dot = table.rfind('.');
      table = dot == std::string::npos ? std::string() : table.substr(0, dot);
      if (auto where = file_line(lookup(table))) return *where;
    }
  }
  return {source_name_ + ":1", false, 1};
}

void Validator::add(const std::string& path, const toml::node* node, const std::string& problem,
                    const std::string& allowed, const std::vector<std::string>& also) {
  add_at(locate(path, node, also), path + ": " + problem + "; allowed: " + allowed);
}

std::string Validator::report() const {
  std::vector<Problem> sorted = problems_;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Problem& a, const Problem& b) {
    if (a.where.from_override != b.where.from_override) return !a.where.from_override;
    return a.where.line < b.where.line;
  });
  std::string out;
  for (const auto& problem : sorted) out += (out.empty() ? "" : "\n") + problem.text;
  return out;
}

void Validator::read_table(const TableSpec& spec, const toml::node* node, Study& study) {
  const std::string prefix = spec.name.empty() ? "" : spec.name + ".";
  const toml::table* table = node ? node->as_table() : nullptr;
  if (node && !table) {
    add(spec.name, node, "expected a table, got " + describe(*node), "a table [" + spec.name + "]");
    failed_.insert(spec.name);
    return;
  }
  const auto applies = [&](const Field& field) { return !field.applies || field.applies(study); };
  const auto applicable_keys = [&] {
    std::vector<std::string> keys;
    for (const auto& field : spec.fields)
      if (applies(field) && std::find(keys.begin(), keys.end(), field.key) == keys.end()) keys.push_back(field.key);
    if (spec.name.empty())
      for (std::size_t i = 2; i < kTopLevelKeys.size(); ++i) keys.push_back("[" + kTopLevelKeys[i] + "]");
    return keys;
  };
  const auto current_value = [&](const std::string& selector) {
    for (const auto& field : spec.fields)
      if (prefix + field.key == selector) return field.write(study);
    return std::string();
  };

  std::set<std::string> seen;
  for (const Field& field : spec.fields) {
    if (!seen.insert(field.key).second) continue;
    const std::string path = prefix + field.key;
    const toml::node* value = table ? table->get(field.key) : nullptr;
    if (!value) {
      if (field.required) add(path, nullptr, "missing", field.allowed, {spec.name});
      if (field.required) failed_.insert(path);
      continue;
    }
    const Field* active = nullptr;
    std::vector<std::string> contexts;
    for (const Field& candidate : spec.fields) {
      if (candidate.key != field.key) continue;
      if (applies(candidate)) {
        active = &candidate;
        break;
      }
      contexts.push_back(candidate.applies_text);
    }
    if (!active) {
      // When the selector itself was rejected, the user's intent is unknown: its own error says enough.
      if (!failed_.count(field.selector))
        add(path, value,
            "only valid when " + join(contexts, " or ") + ", but " + field.selector + " is " +
                current_value(field.selector),
            "for " + field.selector + " = " + current_value(field.selector) + ": " + join(applicable_keys(), ", "));
      failed_.insert(path);
      continue;
    }
    if (std::string problem = active->read(*value, study); !problem.empty()) {
      add(path, value, problem, active->allowed);
      failed_.insert(path);
    }
  }
  if (!table) return;
  for (auto&& [key, value] : *table) {
    const std::string name(key.str());
    if (seen.count(name)) continue;
    if (spec.name.empty() && std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), name) != kTopLevelKeys.end())
      continue;
    std::vector<std::string> candidates = applicable_keys();
    for (auto& candidate : candidates)
      if (candidate.front() == '[') candidate = candidate.substr(1, candidate.size() - 2);
    const auto suggestion = closest(name, candidates);
    add(prefix + name, &value, "unknown key" + (suggestion ? " (did you mean `" + *suggestion + "`?)" : std::string()),
        join(applicable_keys(), ", "));
  }
}

void Validator::read_scaling(const toml::node* node, Study& study) {
  std::vector<std::string> rule_names;
  std::vector<std::string> quoted_names;
  for (const RuleInfo* info : all_rules()) rule_names.push_back(info->name);
  for (const auto& name : rule_names) quoted_names.push_back(toml_string(name));
  const std::string allowed_rules = "one of " + join(quoted_names, ", ");
  const toml::table* table = node ? node->as_table() : nullptr;
  if (node && !table) {
    add("scaling", node, "expected a table, got " + describe(*node), "a table [scaling]");
    failed_.insert("scaling");
    return;
  }
  if (const toml::node* rule = table ? table->get("rule") : nullptr) {
    if (!rule->is_string()) {
      add("scaling.rule", rule, "expected a string, got " + describe(*rule), allowed_rules);
      failed_.insert("scaling.rule");
      return;
    }
    study.scaling.rule = rule->as_string()->get();
  }
  const RuleInfo* info = find_rule(study.scaling.rule);
  if (!info) {
    const auto suggestion = closest(study.scaling.rule, rule_names);
    add("scaling.rule", lookup("scaling.rule"),
        "unknown rule " + toml_string(study.scaling.rule) +
            (suggestion ? " (did you mean " + toml_string(*suggestion) + "?)" : std::string()),
        allowed_rules);
    failed_.insert("scaling.rule");
    return;
  }
  std::vector<std::string> param_keys;
  for (const RuleParamDoc& doc : info->params) param_keys.push_back(doc.key);
  if (table) {
    for (auto&& [key, value] : *table) {
      const std::string name(key.str());
      const std::string path = "scaling." + name;
      if (name == "rule") continue;
      const auto doc =
          std::find_if(info->params.begin(), info->params.end(), [&](const RuleParamDoc& d) { return d.key == name; });
      if (doc == info->params.end()) {
        const auto suggestion = closest(name, param_keys);
        add(path, &value,
            "not a parameter of rule " + toml_string(info->name) +
                (suggestion ? " (did you mean `" + *suggestion + "`?)" : std::string()),
            param_keys.empty() ? "rule only (" + info->name + " has no parameters)"
                               : "rule, " + join(param_keys, ", "));
        failed_.insert(path);
        continue;
      }
      const RealRange range{doc->min_value, doc->max_value};
      std::optional<double> number;
      if (value.is_integer()) number = static_cast<double>(value.as_integer()->get());
      if (value.is_floating_point()) number = value.as_floating_point()->get();
      if (value.is_boolean()) number = value.as_boolean()->get() ? 1.0 : 0.0;
      if (!number) {
        add(path, &value, "expected a number or boolean, got " + describe(value), range.text());
        failed_.insert(path);
      } else if (!range.contains(*number)) {
        const std::string given =
            value.is_floating_point() ? toml_float(*number) : std::to_string(static_cast<std::int64_t>(*number));
        add(path, &value, given + " is out of range", range.text());
        failed_.insert(path);
      } else {
        study.scaling.params[name] = *number;
      }
    }
  }
  for (const RuleParamDoc& doc : info->params) study.scaling.params.emplace(doc.key, doc.default_value);
}

void Validator::check_data_file(Study& study) {
  const std::string kind = study.data.kind;
  if (study.data.path.empty()) {
    add("data.path", nullptr, "missing: data.kind = " + toml_string(kind) + " reads a file",
        "a readable file (relative paths start at the study file's directory)", {"data.kind", "data"});
    return;
  }
  fs::path path(study.data.path);
  if (path.is_relative()) path = fs::path(base_dir_) / path;
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  if (!error) path = absolute;
  path = path.lexically_normal();
  study.data.path = path.string();
  const std::string quoted = toml_string(path.string());
  const std::string allowed = kind == "text" ? "a readable, non-empty file (one token per byte)"
                                             : "a readable file of little-endian uint16 token ids (even size)";
  const toml::node* node = lookup("data.path");
  if (!fs::is_regular_file(path, error)) {
    add("data.path", node, quoted + (fs::exists(path, error) ? " is not a regular file" : " does not exist"), allowed);
    return;
  }
  if (!std::ifstream(path, std::ios::binary)) {
    add("data.path", node, quoted + " cannot be read", allowed);
    return;
  }
  const std::uintmax_t size = fs::file_size(path, error);
  if (error || size == 0) return add("data.path", node, quoted + " is empty", allowed);
  if (kind == "tokens" && size % 2 != 0)
    return add("data.path", node, quoted + " has " + std::to_string(size) + " bytes, not a multiple of 2", allowed);
  // The data module's split (data/dataset.h): train = floor((1 - val_fraction) * n), validation = the rest, each
  // needing seq_len + 1 tokens. For tokens, size / 2 bounds the count from above (an llm.c header holds fewer).
  if (study.model.kind() != ModelKind::transformer || !ok({"model.type", "model.seq_len", "data.val_fraction"})) return;
  const auto count = static_cast<std::int64_t>(kind == "text" ? size : size / 2);
  const auto train =
      static_cast<std::int64_t>(std::floor((1.0 - study.data.val_fraction) * static_cast<double>(count)));
  const std::int64_t window = study.model.transformer().seq_len + 1;
  if (train < window || count - train < window)
    add("data.path", node,
        quoted + " is too short: its " + std::to_string(count) + " tokens split into train " + std::to_string(train) +
            " and validation " + std::to_string(count - train) +
            " (data.val_fraction = " + shortest(study.data.val_fraction) + ")",
        "a file whose splits each hold at least model.seq_len + 1 = " + std::to_string(window) + " tokens",
        {"model.seq_len"});
}

void Validator::check_combinations(Study& study) {
  const auto& d = study.data;
  const bool is_transformer = study.model.kind() == ModelKind::transformer;
  if (is_transformer && ok({"model.width", "model.heads"}) &&
      study.model.transformer().width % study.model.transformer().heads != 0) {
    const auto& t = study.model.transformer();
    add("model.heads", lookup("model.heads"),
        "model.width = " + std::to_string(t.width) + " is not divisible by " + std::to_string(t.heads) + " heads",
        "a divisor of model.width", {"model.width"});
  }
  if (study.model.kind() == ModelKind::mlp && ok({"model.outputs", "model.head"}) &&
      study.model.mlp().head == MlpHead::classification && study.model.mlp().outputs < 2)
    add("model.outputs", lookup("model.outputs"), "a classification head needs at least 2 classes",
        "an integer >= 2 when model.head = \"classification\"", {"model.head"});
  if (ok({"train.batch", "train.grad_accum"}) && study.train.batch % study.train.grad_accum != 0)
    add("train.grad_accum", lookup("train.grad_accum"),
        "train.batch = " + std::to_string(study.train.batch) + " is not divisible by " +
            std::to_string(study.train.grad_accum) + " micro-batches",
        "a divisor of train.batch", {"train.batch"});
  if (ok({"train.steps", "train.warmup"}) && study.train.warmup > study.train.steps)
    add("train.warmup", lookup("train.warmup"),
        std::to_string(study.train.warmup) + " exceeds train.steps = " + std::to_string(study.train.steps),
        "an integer in 0..train.steps", {"train.steps"});

  if (!ok({"data.kind"})) return;
  if ((d.kind == "text" || d.kind == "tokens") && ok({"data.path"})) check_data_file(study);
  if (!ok({"model.type"})) return;
  // ResNets read images (data/images.h), every other model reads no image data.
  const bool is_resnet = study.model.kind() == ModelKind::resnet;
  const bool image_kind = d.kind == "images" || d.kind == "idx" || d.kind == "cifar10";
  if (is_resnet && ok({"model.depth", "model.block"})) {
    const int per_block = study.model.resnet().block == ResnetBlock::basic ? 6 : 9;
    const int depth = study.model.resnet().depth;
    if (depth < per_block + 2 || (depth - 2) % per_block != 0)
      add("model.depth", lookup("model.depth"),
          std::to_string(depth) + " is not " + std::to_string(per_block) + "n + 2 for " +
              (per_block == 6 ? "basic" : "bottleneck") + " blocks",
          std::to_string(per_block) + "n + 2 with n >= 1: " + std::to_string(per_block + 2) + ", " +
              std::to_string(2 * per_block + 2) + ", " + std::to_string(3 * per_block + 2) + ", ...",
          {"model.block"});
  }
  if (is_resnet || image_kind) {
    if (is_resnet != image_kind) {
      add("data.kind", lookup("data.kind"),
          toml_string(d.kind) +
              (image_kind ? " makes images, which only a resnet reads" : " does not make images, which a resnet reads"),
          is_resnet ? "\"images\", \"idx\" or \"cifar10\" for model.type = \"resnet\""
                    : "a data kind of model.type = " + toml_string(model_kind_name(study.model.kind())),
          {"model.type"});
      return;
    }
    if (d.kind != "images" && ok({"data.path"})) {
      fs::path path(d.path);
      if (path.is_relative()) path = fs::path(base_dir_) / path;
      path = path.lexically_normal();
      study.data.path = path.string();
      std::error_code error;
      if (d.path.empty() || !fs::is_directory(path, error))
        add("data.path", lookup("data.path"),
            d.path.empty() ? "missing: data.kind = " + toml_string(d.kind) + " reads files"
                           : toml_string(path.string()) + " is not a directory",
            d.kind == "idx" ? "the directory of train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz]"
                            : "the directory of data_batch_1..5.bin and test_batch.bin",
            {"data.kind", "data"});
    }
    return;
  }
  const bool token_kind = d.kind != "gaussian";
  if (is_transformer != token_kind) {
    add("data.kind", lookup("data.kind"),
        toml_string(d.kind) + (token_kind ? " makes token sequences, which an mlp cannot read"
                                          : " makes vectors, which a transformer cannot read"),
        is_transformer ? "\"uniform\", \"markov\", \"text\" or \"tokens\" for model.type = \"transformer\""
                       : "\"gaussian\" for model.type = \"mlp\"",
        {"model.type"});
    return;
  }
  if (d.kind == "text" && ok({"model.vocab"}) && study.model.transformer().vocab < 256)
    add("model.vocab", lookup("model.vocab"),
        std::to_string(study.model.transformer().vocab) +
            " is too small for data.kind = \"text\" (byte-level tokens 0..255)",
        "an integer >= 256 with text data", {"data.kind"});
  if (d.kind == "markov" && ok({"model.vocab", "data.markov_successors"}) &&
      d.markov_successors > study.model.transformer().vocab)
    add("data.markov_successors", lookup("data.markov_successors"),
        std::to_string(d.markov_successors) +
            " exceeds model.vocab = " + std::to_string(study.model.transformer().vocab),
        "an integer in 1..model.vocab", {"model.vocab"});
}

bool Validator::validate(const toml::table& root, Study& study) {
  root_ = &root;
  for (const TableSpec& spec : schema_) {
    // The data kind's default follows the model: token data for transformers, vectors for MLPs.
    if (spec.name == "data")
      study.data.kind = study.model.kind() == ModelKind::mlp      ? "gaussian"
                        : study.model.kind() == ModelKind::resnet ? "images"
                                                                  : "markov";
    read_table(spec, spec.name.empty() ? &root : root.get(spec.name), study);
    if (spec.name == "model") read_scaling(root.get("scaling"), study);
  }
  if (const toml::node* sweep = root.get("sweep")) {
    sweep_ = sweep->as_table();
    if (!sweep_) add("sweep", sweep, "expected a table, got " + describe(*sweep), "a table [sweep]");
    study.has_sweep = sweep_ != nullptr;
  }
  check_combinations(study);
  if (problems_.empty()) {
    // The rule may reject a model it cannot scale (e.g. a norm placement it fixes).
    try {
      make_rule(study.scaling, study.model);
    } catch (const UserError& error) {
      const std::string message = error.what();
      const std::string body =
          "scaling.rule: rule " + toml_string(study.scaling.rule) + " rejects this study: " + message;
      add_at(locate("scaling.rule", lookup("scaling.rule"), {"scaling"}),
             message.find("allowed:") == std::string::npos ? body + "; allowed: a model the rule supports" : body);
    }
  }
  return problems_.empty();
}

std::string Validator::config_toml(const Study& study) const {
  std::ostringstream out;
  out << "# proplab study, resolved: every default filled in\n";
  const auto write_fields = [&](const TableSpec& spec) {
    std::string lines;
    std::set<std::string> written;
    for (const Field& field : spec.fields) {
      if ((field.applies && !field.applies(study)) || (field.present && !field.present(study)) ||
          !written.insert(field.key).second)
        continue;
      lines += field.key + " = " + field.write(study) + "\n";
    }
    return lines;
  };
  for (const TableSpec& spec : schema_) {
    const std::string lines = write_fields(spec);
    // A table of optional keys none of which is set ([theory]) is left out.
    if (!spec.name.empty() && !lines.empty()) out << "\n[" << spec.name << "]\n";
    out << lines;
    if (spec.name != "model") continue;
    out << "\n[scaling]\nrule = " << toml_string(study.scaling.rule) << "\n";
    if (const RuleInfo* info = find_rule(study.scaling.rule))
      for (const RuleParamDoc& doc : info->params)
        out << doc.key << " = " << toml_float(study.scaling.params.at(doc.key)) << "\n";
  }
  if (sweep_) {
    toml::table wrapper;
    wrapper.insert("sweep", *sweep_);
    out << "\n" << wrapper << "\n";
  }
  return out.str();
}

Study run_validation(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                     const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(toml_text), std::string_view(source_name));
  } catch (const toml::parse_error& error) {
    throw UserError(source_name + ":" + std::to_string(error.source().begin.line) + ":" +
                    std::to_string(error.source().begin.column) +
                    ": TOML syntax error: " + std::string(error.description()));
  }
  Validator validator(source_name, base_dir);
  for (const auto& text : overrides) validator.apply_override(root, text);
  Study study;
  study.source_path = source_name;
  if (!validator.validate(root, study)) throw UserError(validator.report());
  study.config_toml = validator.config_toml(study);
  return study;
}

}  // namespace

Study load_study(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code error;
  std::ifstream in(path, std::ios::binary);
  if (!in || fs::is_directory(path, error)) throw UserError(path + ": cannot read the study file");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string base_dir = fs::path(path).parent_path().string();
  return run_validation(text.str(), path, base_dir.empty() ? "." : base_dir, overrides);
}

Study parse_study(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                  const std::vector<std::string>& overrides) {
  return run_validation(toml_text, source_name, base_dir.empty() ? "." : base_dir, overrides);
}

std::string toml_basic_string(const std::string& text) { return toml_string(text); }

}  // namespace proplab
