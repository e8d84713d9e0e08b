#include "study/validator.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "data/config.h"
#include "scaling/rule.h"
#include "spec/model.h"
#include "study/emit.h"
#include "study/schema.h"
#include "study/text.h"

namespace proplab::study_detail {

namespace {

namespace fs = std::filesystem;

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
      check_rule(study.scaling, study.model);
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

std::string Validator::config_toml(const Study& study) const { return resolved_toml(schema_, study, sweep_); }

}  // namespace

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

}  // namespace proplab::study_detail
