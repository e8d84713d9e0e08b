// Tests for study/study.h: parsing, defaults, every class of error (with file, line, key path and allowed text),
// overrides, the resolved-TOML round trip.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "scaling/rule.h"
#include "study/study.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;

// A rule registered by this test binary only: it fixes Pre-LN and rejects other norm placements when built.
class PreOnlyRule final : public ScalingRule {
 public:
  std::string name() const override { return "test_pre_only"; }
  InitSpec init(const ParamInfo&) const override { return InitSpec::constant(0.0); }
  ResidualSpec residual(int, Branch) const override { return {}; }
};
const RuleInfo kPreOnlyRule{
    "test_pre_only",
    "test rule: Pre-LN transformers only",
    {},
    [](const ScalingConfig&, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      if (shape.kind() == ModelKind::transformer && shape.transformer().norm != NormPlacement::pre)
        throw UserError("this rule needs model.norm = \"pre\"");
      return std::make_unique<PreOnlyRule>();
    }};
PROPLAB_REGISTER_RULE(kPreOnlyRule);

// Every field of two studies (config_toml and source_path excepted) is equal.
void expect_same_study(const Study& a, const Study& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.seed, b.seed);
  ASSERT_EQ(a.model.kind(), b.model.kind());
  if (a.model.kind() == ModelKind::transformer) {
    const auto &ta = a.model.transformer(), &tb = b.model.transformer();
    EXPECT_EQ(ta.layers, tb.layers);
    EXPECT_EQ(ta.width, tb.width);
    EXPECT_EQ(ta.heads, tb.heads);
    EXPECT_EQ(ta.ffn_mult, tb.ffn_mult);
    EXPECT_EQ(ta.norm, tb.norm);
    EXPECT_EQ(ta.norm_kind, tb.norm_kind);
    EXPECT_EQ(ta.norm_affine, tb.norm_affine);
    EXPECT_EQ(ta.bias, tb.bias);
    EXPECT_EQ(ta.activation, tb.activation);
    EXPECT_EQ(ta.dropout, tb.dropout);
    EXPECT_EQ(ta.vocab, tb.vocab);
    EXPECT_EQ(ta.seq_len, tb.seq_len);
    EXPECT_EQ(ta.tie_embeddings, tb.tie_embeddings);
    EXPECT_EQ(ta.norm_eps, tb.norm_eps);
  }
  if (a.model.kind() == ModelKind::mlp) {
    const auto &ma = a.model.mlp(), &mb = b.model.mlp();
    EXPECT_EQ(ma.layers, mb.layers);
    EXPECT_EQ(ma.width, mb.width);
    EXPECT_EQ(ma.input_dim, mb.input_dim);
    EXPECT_EQ(ma.outputs, mb.outputs);
    EXPECT_EQ(ma.activation, mb.activation);
    EXPECT_EQ(ma.sigma_w2, mb.sigma_w2);
    EXPECT_EQ(ma.sigma_b2, mb.sigma_b2);
    EXPECT_EQ(ma.residual, mb.residual);
    EXPECT_EQ(ma.head, mb.head);
  }
  EXPECT_EQ(a.scaling.rule, b.scaling.rule);
  EXPECT_EQ(a.scaling.params, b.scaling.params);
  const auto &ra = a.train, &rb = b.train;
  EXPECT_EQ(ra.steps, rb.steps);
  EXPECT_EQ(ra.batch, rb.batch);
  EXPECT_EQ(ra.grad_accum, rb.grad_accum);
  EXPECT_EQ(ra.lr, rb.lr);
  EXPECT_EQ(ra.optimizer, rb.optimizer);
  EXPECT_EQ(ra.beta1, rb.beta1);
  EXPECT_EQ(ra.beta2, rb.beta2);
  EXPECT_EQ(ra.eps, rb.eps);
  EXPECT_EQ(ra.momentum, rb.momentum);
  EXPECT_EQ(ra.nesterov, rb.nesterov);
  EXPECT_EQ(ra.schedule, rb.schedule);
  EXPECT_EQ(ra.warmup, rb.warmup);
  EXPECT_EQ(ra.min_lr_ratio, rb.min_lr_ratio);
  EXPECT_EQ(ra.weight_decay, rb.weight_decay);
  EXPECT_EQ(ra.grad_clip, rb.grad_clip);
  EXPECT_EQ(ra.eval_every, rb.eval_every);
  EXPECT_EQ(ra.eval_batches, rb.eval_batches);
  EXPECT_EQ(ra.checkpoint_every, rb.checkpoint_every);
  EXPECT_EQ(ra.final_checkpoint, rb.final_checkpoint);
  EXPECT_EQ(a.data.kind, b.data.kind);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.val_fraction, b.data.val_fraction);
  EXPECT_EQ(a.data.markov_successors, b.data.markov_successors);
  EXPECT_EQ(a.data.markov_temperature, b.data.markov_temperature);
  EXPECT_EQ(a.data.gaussian_noise, b.data.gaussian_noise);
  EXPECT_EQ(a.record.every, b.record.every);
  EXPECT_EQ(a.record.log_spaced, b.record.log_spaced);
  EXPECT_EQ(a.record.forward, b.record.forward);
  EXPECT_EQ(a.record.backward, b.record.backward);
  EXPECT_EQ(a.record.params, b.record.params);
  EXPECT_EQ(a.record.on_nonfinite, b.record.on_nonfinite);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.microbatches, b.parallel.microbatches);
  EXPECT_EQ(a.device.type, b.device.type);
  EXPECT_EQ(a.device.threads, b.device.threads);
  EXPECT_EQ(a.device.precision, b.device.precision);
  EXPECT_EQ(a.theory.input_corr, b.theory.input_corr);
  EXPECT_EQ(a.has_sweep, b.has_sweep);
}

// The message of the UserError `action` throws (a test failure when it throws nothing).
std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return {};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::string::size_type begin = 0;
  while (begin <= text.size()) {
    const auto end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return lines;
}

// Every error line has the form <where>: <key.path>: <problem>; allowed: <what>.
void expect_well_formed(const std::string& message) {
  for (const auto& line : lines_of(message)) EXPECT_NE(line.find("; allowed: "), std::string::npos) << line;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class StudyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::temp_directory_path() / ("proplab_study_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) const {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }

  fs::path dir_;
};

// The repository root (ctest sets PROPLAB_SOURCE_DIR; a direct run falls back to this file's location).
fs::path source_dir() {
  if (const char* dir = std::getenv("PROPLAB_SOURCE_DIR")) return dir;
  return fs::path(__FILE__).parent_path().parent_path().parent_path();
}

Study parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_study(text, "test.toml", ".", overrides);
}

}  // namespace

TEST_F(StudyFiles, ValidTransformerStudyParsesToTheGivenValues) {
  write("corpus.txt", std::string(4000, 'a'));
  const std::string path = write("study.toml", R"(name = "deep-post_ln.v1"
seed = 7

[model]
type = "transformer"
layers = 48
width = 384
heads = 6
ffn_mult = 2
norm = "post"
norm_kind = "rmsnorm"
norm_affine = false
bias = false
activation = "gelu_erf"
dropout = 0.1
vocab = 256
seq_len = 64
tie_embeddings = false
norm_eps = 1e-6

[scaling]
rule = "custom"
lambda = 0.5
beta = 2
learnable_beta = true

[train]
steps = 1000
batch = 16
grad_accum = 4
lr = 3e-4
optimizer = "adamw"
beta1 = 0.8
beta2 = 0.99
eps = 1e-10
schedule = "cosine"
warmup = 100
min_lr_ratio = 0.0
weight_decay = 0.1
grad_clip = 0
eval_every = 50
eval_batches = 8
checkpoint_every = 500

[data]
kind = "text"
path = "corpus.txt"
val_fraction = 0.25

[record]
every = 5
log_spaced = true
forward = ["rms", "kurtosis"]
backward = []
params = ["update_ratio"]
on_nonfinite = "continue"

[parallel]
dp = 1

[device]
type = "cpu"
threads = 2
)");
  const Study study = load_study(path);
  EXPECT_EQ(study.name, "deep-post_ln.v1");
  EXPECT_EQ(study.seed, 7u);
  EXPECT_EQ(study.source_path, path);
  EXPECT_EQ(study.model.kind(), ModelKind::transformer);
  const auto& t = study.model.transformer();
  EXPECT_EQ(t.layers, 48);
  EXPECT_EQ(t.width, 384);
  EXPECT_EQ(t.heads, 6);
  EXPECT_EQ(t.ffn_mult, 2);
  EXPECT_EQ(t.norm, NormPlacement::post);
  EXPECT_EQ(t.norm_kind, NormKind::rmsnorm);
  EXPECT_FALSE(t.norm_affine);
  EXPECT_FALSE(t.bias);
  EXPECT_EQ(t.activation, Activation::gelu_erf);
  EXPECT_FLOAT_EQ(t.dropout, 0.1f);
  EXPECT_EQ(t.vocab, 256);
  EXPECT_EQ(t.seq_len, 64);
  EXPECT_FALSE(t.tie_embeddings);
  EXPECT_FLOAT_EQ(t.norm_eps, 1e-6f);
  EXPECT_EQ(study.scaling.rule, "custom");
  EXPECT_EQ(study.scaling.params.at("lambda"), 0.5);
  EXPECT_EQ(study.scaling.params.at("beta"), 2.0);            // integer accepted as a number
  EXPECT_EQ(study.scaling.params.at("learnable_beta"), 1.0);  // true = 1
  // Parameters left out take the rule's defaults.
  for (const RuleParamDoc& doc : find_rule("custom")->params) {
    if (doc.key != "lambda" && doc.key != "beta" && doc.key != "learnable_beta") {
      EXPECT_EQ(study.scaling.params.at(doc.key), doc.default_value) << doc.key;
    }
  }
  EXPECT_EQ(study.scaling.params.size(), find_rule("custom")->params.size());
  EXPECT_EQ(study.train.steps, 1000);
  EXPECT_EQ(study.train.batch, 16);
  EXPECT_EQ(study.train.grad_accum, 4);
  EXPECT_EQ(study.train.lr, 3e-4);
  EXPECT_EQ(study.train.optimizer, OptimizerKind::adamw);
  EXPECT_EQ(study.train.beta1, 0.8);
  EXPECT_EQ(study.train.beta2, 0.99);
  EXPECT_EQ(study.train.eps, 1e-10);
  EXPECT_EQ(study.train.schedule, ScheduleKind::cosine);
  EXPECT_EQ(study.train.warmup, 100);
  EXPECT_EQ(study.train.min_lr_ratio, 0.0);
  EXPECT_EQ(study.train.weight_decay, 0.1);
  EXPECT_EQ(study.train.grad_clip, 0.0);
  EXPECT_EQ(study.train.eval_every, 50);
  EXPECT_EQ(study.train.eval_batches, 8);
  EXPECT_EQ(study.train.checkpoint_every, 500);
  EXPECT_EQ(study.data.kind, "text");
  // Relative data paths are resolved against the study file's directory, and stored absolute.
  EXPECT_TRUE(fs::path(study.data.path).is_absolute());
  EXPECT_TRUE(fs::equivalent(study.data.path, dir_ / "corpus.txt"));
  EXPECT_EQ(study.data.val_fraction, 0.25);
  EXPECT_EQ(study.record.every, 5);
  EXPECT_TRUE(study.record.log_spaced);
  EXPECT_EQ(study.record.forward, (std::vector<std::string>{"rms", "kurtosis"}));
  EXPECT_TRUE(study.record.backward.empty());
  EXPECT_EQ(study.record.params, (std::vector<std::string>{"update_ratio"}));
  EXPECT_EQ(study.record.on_nonfinite, "continue");
  EXPECT_EQ(study.parallel.dp, 1);
  EXPECT_EQ(study.device.type, "cpu");
  EXPECT_EQ(study.device.threads, 2);
  EXPECT_FALSE(study.has_sweep);
}

TEST(Study, ValidMlpStudyParses) {
  const Study study = parse(R"(name = "mf"
[model]
type = "mlp"
layers = 200
width = 512
input_dim = 32
outputs = 3
activation = "tanh"
sigma_w2 = 1.76
sigma_b2 = 0.05
residual = true
head = "regression"
[train]
optimizer = "sgd"
momentum = 0.0
nesterov = true
lr = 1
[data]
gaussian_noise = 0.1
)");
  EXPECT_EQ(study.model.kind(), ModelKind::mlp);
  EXPECT_EQ(study.model.mlp().layers, 200);
  EXPECT_EQ(study.model.mlp().width, 512);
  EXPECT_EQ(study.model.mlp().input_dim, 32);
  EXPECT_EQ(study.model.mlp().outputs, 3);
  EXPECT_EQ(study.model.mlp().activation, Activation::tanh);
  EXPECT_EQ(study.model.mlp().sigma_w2, 1.76);
  EXPECT_EQ(study.model.mlp().sigma_b2, 0.05);
  EXPECT_TRUE(study.model.mlp().residual);
  EXPECT_EQ(study.model.mlp().head, MlpHead::regression);
  EXPECT_EQ(study.train.optimizer, OptimizerKind::sgd);
  EXPECT_EQ(study.train.momentum, 0.0);
  EXPECT_TRUE(study.train.nesterov);
  EXPECT_EQ(study.train.lr, 1.0);
  // An MLP's data defaults to the gaussian kind.
  EXPECT_EQ(study.data.kind, "gaussian");
  EXPECT_EQ(study.data.gaussian_noise, 0.1);
}

TEST(Study, MissingValuesTakeTheDocumentedDefaults) {
  const Study study = parse("name = \"defaults\"\n");
  Study expected;
  expected.name = "defaults";
  for (const RuleParamDoc& doc : find_rule("standard")->params) expected.scaling.params[doc.key] = doc.default_value;
  expect_same_study(study, expected);
  EXPECT_EQ(study.scaling.rule, "standard");
  EXPECT_EQ(study.data.kind, "markov");
  EXPECT_EQ(study.model.transformer().activation, Activation::gelu_tanh);
  EXPECT_TRUE(study.record.forward.empty());
  EXPECT_EQ(study.source_path, "test.toml");
  EXPECT_FALSE(study.config_toml.empty());
}

TEST_F(StudyFiles, UnknownKeySuggestsTheClosestKnownKey) {
  const std::string path = write("typo.toml", "name = \"x\"\n\n[model]\nlayer = 8\n");
  const std::string message = error_of([&] { load_study(path); });
  EXPECT_TRUE(contains(message, path + ":4: model.layer: unknown key (did you mean `layers`?); allowed: ")) << message;
  EXPECT_TRUE(contains(message, "layers, width, heads")) << message;
  // A misspelt table, at the top level.
  const std::string table = error_of([] { parse("name = \"x\"\n[trian]\nsteps = 3\n"); });
  EXPECT_TRUE(contains(table, "test.toml:2: trian: unknown key (did you mean `train`?)")) << table;
}

TEST(Study, KeysOfTheOtherModelTypeAreErrorsNamingTheType) {
  const std::string message = error_of([] { parse("name = \"x\"\n[model]\nsigma_w2 = 2.0\n"); });
  EXPECT_TRUE(contains(message, "test.toml:3: model.sigma_w2: only valid when model.type = \"mlp\"")) << message;
  EXPECT_TRUE(contains(message, "model.type is \"transformer\"")) << message;
  EXPECT_TRUE(contains(message, "allowed: for model.type = \"transformer\": type, layers")) << message;
  // The same for optimizers and data kinds.
  const std::string optimizer = error_of([] { parse("name = \"x\"\n[train]\nmomentum = 0.5\n"); });
  EXPECT_TRUE(contains(optimizer, "train.momentum: only valid when train.optimizer = \"sgd\"")) << optimizer;
  const std::string data = error_of([] { parse("name = \"x\"\n[data]\npath = \"a.txt\"\n"); });
  EXPECT_TRUE(contains(data, "test.toml:3: data.path: only valid when data.kind = \"text\" or \"tokens\"")) << data;
}

TEST(Study, WrongTypesAreErrors) {
  const std::string message = error_of([] {
    parse(R"(name = "x"
[model]
layers = 8.0
bias = 1
norm = 3
[train]
lr = "1e-3"
[record]
forward = "mean"
)");
  });
  EXPECT_TRUE(contains(message,
                       "test.toml:3: model.layers: expected an integer, got float 8.0; allowed: an integer "
                       "in 1..100000"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:4: model.bias: expected a boolean, got integer 1; allowed: true or false"))
      << message;
  EXPECT_TRUE(contains(message,
                       "test.toml:5: model.norm: expected a string, got integer 3; allowed: one of "
                       "\"pre\", \"post\", \"both\", \"none\""))
      << message;
  EXPECT_TRUE(contains(message,
                       "test.toml:7: train.lr: expected a number, got string \"1e-3\"; allowed: a number "
                       "in (0, 100]"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:9: record.forward: expected an array of strings")) << message;
  EXPECT_EQ(lines_of(message).size(), 5u) << message;
  expect_well_formed(message);
}

TEST(Study, OutOfRangeValuesAreErrors) {
  const std::string message = error_of([] {
    parse(R"(name = "x"
seed = -1
[model]
layers = 0
dropout = 1.0
activation = "tanh"
[train]
lr = 0
eval_batches = 0
[device]
threads = -2
)");
  });
  EXPECT_TRUE(contains(message, "test.toml:2: seed: -1 is out of range; allowed: an integer >= 0")) << message;
  EXPECT_TRUE(contains(message, "test.toml:4: model.layers: 0 is out of range; allowed: an integer in 1..100000"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:5: model.dropout: 1.0 is out of range; allowed: a number in [0, 1)"))
      << message;
  // tanh is an MLP activation, not a transformer one; the closest choice is offered.
  EXPECT_TRUE(contains(message, "test.toml:6: model.activation: \"tanh\" is not a choice")) << message;
  EXPECT_TRUE(contains(message, "allowed: one of \"gelu\", \"gelu_erf\", \"relu\"")) << message;
  EXPECT_TRUE(contains(message, "test.toml:8: train.lr: 0 is out of range; allowed: a number in (0, 100]")) << message;
  EXPECT_TRUE(contains(message, "test.toml:9: train.eval_batches: 0 is out of range")) << message;
  EXPECT_TRUE(contains(message, "test.toml:11: device.threads: -2 is out of range; allowed: an integer in 0..4096"))
      << message;
  expect_well_formed(message);
}

TEST(Study, DevicePrecisionIsAChoiceOfFp32OrBf16) {
  EXPECT_EQ(parse("name = \"x\"\n").device.precision, "fp32");
  const Study bf16 = parse("name = \"x\"\n[device]\nprecision = \"bf16\"\n");
  EXPECT_EQ(bf16.device.precision, "bf16");
  EXPECT_TRUE(contains(bf16.config_toml, "\n[device]\ntype = \"auto\"\nthreads = 0\nprecision = \"bf16\"\n"))
      << bf16.config_toml;
  const std::string message = error_of([] { parse("name = \"x\"\n[device]\nprecision = \"fp16\"\n"); });
  EXPECT_TRUE(contains(message, "test.toml:3: device.precision: \"fp16\" is not a choice")) << message;
  EXPECT_TRUE(contains(message, "\"fp32\"")) << message;
  EXPECT_TRUE(contains(message, "\"bf16\"")) << message;
  const std::string set_message = error_of([] { parse("name = \"x\"\n", {"device.precision=\"tf32\""}); });
  EXPECT_TRUE(contains(set_message, "device.precision: \"tf32\" is not a choice")) << set_message;
  expect_well_formed(message);
}

TEST(Study, ChoiceTyposGetASuggestion) {
  const std::string message = error_of([] { parse("name = \"x\"\n[model]\nnorm_kind = \"RMSNorm\"\n"); });
  EXPECT_TRUE(contains(message, "model.norm_kind: \"RMSNorm\" is not a choice (did you mean \"rmsnorm\"?)")) << message;
}

TEST(Study, WidthMustBeDivisibleByHeads) {
  const std::string message = error_of([] { parse("name = \"x\"\n[model]\nwidth = 250\nheads = 4\n"); });
  EXPECT_TRUE(contains(message,
                       "test.toml:4: model.heads: model.width = 250 is not divisible by 4 heads; allowed: "
                       "a divisor of model.width"))
      << message;
  // With heads left at its default, the line is width's.
  const std::string width_only = error_of([] { parse("name = \"x\"\n[model]\n\nwidth = 10\n"); });
  EXPECT_TRUE(contains(width_only, "test.toml:4: model.heads:")) << width_only;
}

TEST(Study, OtherCombinationsAreChecked) {
  const std::string message = error_of([] {
    parse(R"(name = "x"
[model]
vocab = 4
[train]
steps = 10
batch = 10
grad_accum = 4
warmup = 11
[data]
markov_successors = 8
)");
  });
  EXPECT_TRUE(contains(message, "test.toml:7: train.grad_accum: train.batch = 10 is not divisible by 4")) << message;
  EXPECT_TRUE(contains(message,
                       "test.toml:8: train.warmup: 11 exceeds train.steps = 10; allowed: an integer in "
                       "0..train.steps"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:10: data.markov_successors: 8 exceeds model.vocab = 4")) << message;
  EXPECT_EQ(lines_of(message).size(), 3u) << message;

  const std::string mismatch =
      error_of([] { parse("name = \"x\"\n[model]\ntype = \"mlp\"\n[data]\nkind = \"markov\"\n"); });
  EXPECT_TRUE(contains(mismatch,
                       "test.toml:5: data.kind: \"markov\" makes token sequences, which an mlp cannot read; "
                       "allowed: \"gaussian\""))
      << mismatch;
  const std::string classes = error_of([] { parse("name = \"x\"\n[model]\ntype = \"mlp\"\noutputs = 1\n"); });
  EXPECT_TRUE(contains(classes, "test.toml:4: model.outputs: a classification head needs at least 2 classes"))
      << classes;
  EXPECT_NO_THROW(parse("name = \"x\"\n[model]\ntype = \"mlp\"\noutputs = 1\nhead = \"regression\"\n"));
}

TEST(Study, NameIsRequiredAndFilesystemSafe) {
  const std::string missing = error_of([] { parse("seed = 1\n"); });
  EXPECT_TRUE(contains(missing, "test.toml:1: name: missing; allowed: a name of letters, digits")) << missing;
  const std::string unsafe = error_of([] { parse("seed = 1\nname = \"a/b c\"\n"); });
  EXPECT_TRUE(contains(unsafe, "test.toml:2: name: \"a/b c\" has characters that are not safe in file names"))
      << unsafe;
  EXPECT_THROW(parse("name = \"..\"\n"), UserError);
  EXPECT_THROW(parse("name = 12\n"), UserError);
}

TEST_F(StudyFiles, MissingDataFileIsAnErrorNamingThePath) {
  const std::string path = write("study.toml", "name = \"x\"\n[data]\nkind = \"text\"\npath = \"no/such.txt\"\n");
  const std::string message = error_of([&] { load_study(path); });
  const std::string resolved = (dir_ / "no/such.txt").lexically_normal().string();
  EXPECT_TRUE(contains(message, path + ":4: data.path: \"" + resolved + "\" does not exist; allowed: a readable"))
      << message;
  // A file kind without a path names data.path and points at data.kind.
  const std::string no_path = write("no_path.toml", "name = \"x\"\n[data]\n\nkind = \"tokens\"\n");
  const std::string missing = error_of([&] { load_study(no_path); });
  EXPECT_TRUE(contains(missing, no_path + ":4: data.path: missing: data.kind = \"tokens\" reads a file")) << missing;
}

TEST_F(StudyFiles, DataFilesAreChecked) {
  write("odd.bin", std::string(2001, '\0'));
  write("even.bin", std::string(2000, '\0'));
  write("short.txt", std::string(100, 'x'));
  write("empty.txt", "");
  const auto study = [&](const std::string& kind, const std::string& file, int vocab) {
    return write("study.toml", "name = \"x\"\n[model]\nseq_len = 32\nvocab = " + std::to_string(vocab) +
                                   "\n[data]\nkind = \"" + kind + "\"\npath = \"" + file + "\"\n");
  };
  const std::string odd = error_of([&] { load_study(study("tokens", "odd.bin", 256)); });
  EXPECT_TRUE(contains(odd, ":7: data.path: ")) << odd;
  EXPECT_TRUE(contains(odd, "odd.bin\" has 2001 bytes, not a multiple of 2")) << odd;
  EXPECT_NO_THROW(load_study(study("tokens", "even.bin", 256)));
  // 100 bytes split 90 / 10 cannot hold windows of 33 tokens.
  const std::string too_short = error_of([&] { load_study(study("text", "short.txt", 256)); });
  EXPECT_TRUE(contains(too_short, "short.txt\" is too short: its 100 tokens split into train 90 and validation 10"))
      << too_short;
  const std::string empty = error_of([&] { load_study(study("text", "empty.txt", 256)); });
  EXPECT_TRUE(contains(empty, "empty.txt\" is empty")) << empty;
  const std::string directory = error_of([&] { load_study(study("text", ".", 256)); });
  EXPECT_TRUE(contains(directory, "is not a regular file")) << directory;
  // Text is byte level.
  const std::string vocab = error_of([&] { load_study(study("text", "even.bin", 100)); });
  EXPECT_TRUE(contains(vocab, ":4: model.vocab: 100 is too small for data.kind = \"text\"")) << vocab;
}

TEST(Study, ParallelLayoutsAcceptedAndRangesChecked) {
  const Study study =
      parse("name = \"x\"\n[parallel]\ndp = 4\ntp = 2\ntimeout_s = 30\ndp_mode = \"local_sgd\"\nsync_every = 8\n");
  EXPECT_EQ(study.parallel.dp, 4);
  EXPECT_EQ(study.parallel.tp, 2);
  EXPECT_EQ(study.parallel.timeout_s, 30.0);
  EXPECT_EQ(study.parallel.dp_mode, "local_sgd");
  EXPECT_EQ(study.parallel.sync_every, 8);
  const Study gossip = parse("name = \"x\"\n[parallel]\ndp = 4\ndp_mode = \"gossip\"\nbucket_mb = 0.25\nzero = 1\n");
  EXPECT_EQ(gossip.parallel.dp_mode, "gossip");
  EXPECT_EQ(gossip.parallel.bucket_mb, 0.25);
  EXPECT_EQ(gossip.parallel.zero, 1);
  const std::string mode = error_of([] { parse("name = \"x\"\n[parallel]\ndp_mode = \"ring\"\n"); });
  EXPECT_TRUE(contains(mode, "test.toml:3: parallel.dp_mode: \"ring\" is not a choice")) << mode;
  const std::string zero = error_of([] { parse("name = \"x\"\n[parallel]\nzero = 2\n"); });
  EXPECT_TRUE(contains(zero, "test.toml:3: parallel.zero:")) << zero;
  const std::string bucket = error_of([] { parse("name = \"x\"\n[parallel]\nbucket_mb = -1\n"); });
  EXPECT_TRUE(contains(bucket, "test.toml:3: parallel.bucket_mb:")) << bucket;
  const std::string message =
      error_of([] { parse("name = \"x\"\n[parallel]\ndp = 0\ntp = 1\npp = 0\ntimeout_s = 0\n"); });
  EXPECT_TRUE(contains(message, "test.toml:3: parallel.dp:")) << message;
  EXPECT_TRUE(contains(message, "test.toml:5: parallel.pp: 0 is out of range")) << message;
  EXPECT_TRUE(contains(message, "test.toml:6: parallel.timeout_s:")) << message;
  EXPECT_EQ(lines_of(message).size(), 3u) << message;
}

TEST_F(StudyFiles, SyntaxErrorsGiveFileLineAndColumn) {
  const std::string path = write("broken.toml", "name = \"x\"\n[model]\nlayers = = 3\n");
  const std::string message = error_of([&] { load_study(path); });
  EXPECT_TRUE(contains(message, path + ":3:")) << message;
  EXPECT_TRUE(contains(message, "TOML syntax error: ")) << message;
  // Line and column: <file>:3:<column>: ...
  const auto after = message.substr(message.find(path + ":3:") + path.size() + 3);
  EXPECT_TRUE(!after.empty() && std::isdigit(static_cast<unsigned char>(after[0]))) << message;
  const std::string duplicate = error_of([] { parse("name = \"x\"\n[model]\n[model]\n"); });
  EXPECT_TRUE(contains(duplicate, "test.toml:3:")) << duplicate;
}

TEST(Study, UnreadableStudyFileIsAUserError) {
  const std::string message = error_of([] { load_study("/no/such/study.toml"); });
  EXPECT_TRUE(contains(message, "/no/such/study.toml")) << message;
}

TEST(Study, OverridesEditTheTree) {
  const Study study = parse("name = \"x\"\n[model]\nlayers = 4\n",
                            {"model.layers=12", "scaling.rule=xavier", "train.lr = 1e-4", "data.kind=\"uniform\"",
                             "device.threads=3", "model.norm=post", "record.forward=[\"mean\", \"rms\"]",
                             "name=renamed", "model.bias=false", "sweep.axes.lr=[1e-3, 1e-2]"});
  EXPECT_EQ(study.model.transformer().layers, 12);
  EXPECT_EQ(study.scaling.rule, "xavier");  // a bare word is a string
  EXPECT_TRUE(study.scaling.params.empty());
  EXPECT_EQ(study.train.lr, 1e-4);
  EXPECT_EQ(study.data.kind, "uniform");
  EXPECT_EQ(study.device.threads, 3);  // [device] did not exist: created
  EXPECT_EQ(study.model.transformer().norm, NormPlacement::post);
  EXPECT_EQ(study.record.forward, (std::vector<std::string>{"mean", "rms"}));
  EXPECT_EQ(study.name, "renamed");
  EXPECT_FALSE(study.model.transformer().bias);
  EXPECT_TRUE(study.has_sweep);
  // The resolved text carries the overridden values.
  EXPECT_TRUE(contains(study.config_toml, "layers = 12\n")) << study.config_toml;
  EXPECT_TRUE(contains(study.config_toml, "rule = \"xavier\"\n")) << study.config_toml;
}

TEST(Study, OverrideOfTheSameKeyTwiceKeepsTheLast) {
  const Study study = parse("name = \"x\"\n", {"model.layers=3", "model.layers=5"});
  EXPECT_EQ(study.model.transformer().layers, 5);
}

TEST(Study, BadOverridesAreReportedWithTheirText) {
  const std::string message = error_of([] {
    parse("name = \"x\"\n[model]\nlayers = 4\n", {"model.layers", "model..width=3", "train.lr=[1,", "train.lr=0",
                                                  "model.layers.deep=1", "seed=", "model.layers=1.5"});
  });
  EXPECT_TRUE(contains(message, "--set model.layers: malformed override: no '='; allowed: key.path=value")) << message;
  EXPECT_TRUE(contains(message, "--set model..width=3: malformed override: \"model..width\" is not a key path"))
      << message;
  EXPECT_TRUE(contains(message, "--set train.lr=[1,: train.lr: malformed value: ")) << message;
  EXPECT_TRUE(contains(message, "--set model.layers.deep=1: model.layers: is integer 4, not a table")) << message;
  EXPECT_TRUE(contains(message, "--set seed=: seed: malformed override: no value after '='")) << message;
  // A well-formed override with a bad value is located at the override, not in the file.
  EXPECT_TRUE(contains(message, "--set train.lr=0: train.lr: 0 is out of range; allowed: a number in (0, 100]"))
      << message;
  EXPECT_TRUE(contains(message, "--set model.layers=1.5: model.layers: expected an integer, got float 1.5")) << message;
  EXPECT_EQ(lines_of(message).size(), 7u) << message;
  expect_well_formed(message);
}

TEST(Study, CombinationErrorsPointAtTheOverrideThatCausedThem) {
  const std::string message =
      error_of([] { parse("name = \"x\"\n[model]\nwidth = 256\nheads = 4\n", {"model.width=250"}); });
  EXPECT_TRUE(contains(message, "--set model.width=250: model.heads: model.width = 250 is not divisible by 4"))
      << message;
  const std::string table = error_of([] { parse("name = \"x\"\n", {"modle.layers=3"}); });
  EXPECT_TRUE(contains(table, "--set modle.layers=3: modle: unknown key (did you mean `model`?)")) << table;
  const std::string kind = error_of([] { parse("name = \"x\"\n", {"data.kind=text"}); });
  EXPECT_TRUE(contains(kind, "--set data.kind=text: data.path: missing")) << kind;
}

TEST(Study, ScalingParamsAreCheckedAgainstTheRule) {
  const std::string message = error_of([] {
    parse(R"(name = "x"
[scaling]
rule = "custom"
lamda = 0.5
beta = 1000
hidden_std = "big"
)");
  });
  EXPECT_TRUE(contains(message,
                       "test.toml:4: scaling.lamda: not a parameter of rule \"custom\" (did you mean "
                       "`lambda`?); allowed: rule, lambda, beta"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:5: scaling.beta: 1000 is out of range; allowed: a number in [")) << message;
  EXPECT_TRUE(contains(message, "test.toml:6: scaling.hidden_std: expected a number or boolean, got string \"big\""))
      << message;
  const std::string rule = error_of([] { parse("name = \"x\"\n[scaling]\nrule = \"xavir\"\n"); });
  EXPECT_TRUE(contains(rule,
                       "test.toml:3: scaling.rule: unknown rule \"xavir\" (did you mean \"xavier\"?); "
                       "allowed: one of "))
      << rule;
  EXPECT_TRUE(contains(rule, "custom") && contains(rule, "standard")) << rule;
  const std::string none = error_of([] { parse("name = \"x\"\n[scaling]\nrule = \"xavier\"\nstd = 0.1\n"); });
  EXPECT_TRUE(contains(none, "test.toml:4: scaling.std: not a parameter of rule \"xavier\"")) << none;
}

TEST(Study, ARuleThatRejectsTheModelIsReportedAtScalingRule) {
  EXPECT_NO_THROW(parse("name = \"x\"\n[scaling]\nrule = \"test_pre_only\"\n"));
  const std::string message =
      error_of([] { parse("name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"test_pre_only\"\n"); });
  EXPECT_TRUE(contains(message,
                       "test.toml:5: scaling.rule: rule \"test_pre_only\" rejects this study: this rule "
                       "needs model.norm = \"pre\"; allowed: a model the rule supports"))
      << message;
}

TEST(Study, RecordStatisticsAreChecked) {
  const std::string message = error_of([] {
    parse(
        "name = \"x\"\n[record]\nforward = [\"mean\", \"rsm\", \"mean\"]\nparams = [\"rms\"]\n"
        "on_nonfinite = \"ignore\"\nevery = 0\n");
  });
  EXPECT_TRUE(contains(message,
                       "test.toml:3: record.forward: \"rsm\" is not a statistic (did you mean \"rms\"?), "
                       "\"mean\" is listed twice; allowed: an array of distinct names from: mean, var"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:4: record.params: \"rms\" is not a statistic")) << message;
  EXPECT_TRUE(contains(message, "allowed: an array of distinct names from: weight_rms, grad_rms, update_ratio"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:5: record.on_nonfinite: \"ignore\" is not a choice")) << message;
  EXPECT_TRUE(contains(message, "test.toml:6: record.every: 0 is out of range")) << message;
}

TEST(Study, AllProblemsAreReportedTogetherInLineOrder) {
  const std::string message = error_of([] {
    parse(R"(name = "x"
[train]
lr = -1
steps = 0
[model]
layers = "8"
widht = 64
[parallel]
tp = 0
)");
  });
  const auto lines = lines_of(message);
  ASSERT_EQ(lines.size(), 5u) << message;
  EXPECT_TRUE(lines[0].rfind("test.toml:3: train.lr: ", 0) == 0) << message;
  EXPECT_TRUE(lines[1].rfind("test.toml:4: train.steps: ", 0) == 0) << message;
  EXPECT_TRUE(lines[2].rfind("test.toml:6: model.layers: ", 0) == 0) << message;
  EXPECT_TRUE(lines[3].rfind("test.toml:7: model.widht: unknown key (did you mean `width`?)", 0) == 0) << message;
  EXPECT_TRUE(lines[4].rfind("test.toml:9: parallel.tp: ", 0) == 0) << message;
}

TEST(Study, OverrideProblemsComeAfterFileProblems) {
  const std::string message = error_of([] { parse("name = \"x\"\n[model]\nlayers = 0\n", {"device.type=gpu"}); });
  const auto lines = lines_of(message);
  ASSERT_EQ(lines.size(), 2u) << message;
  EXPECT_TRUE(lines[0].rfind("test.toml:3: model.layers", 0) == 0) << message;
  EXPECT_TRUE(lines[1].rfind("--set device.type=gpu: device.type: \"gpu\" is not a choice", 0) == 0) << message;
}

TEST(Study, TablesMustBeTables) {
  const std::string message = error_of([] { parse("name = \"x\"\nmodel = 3\nsweep = \"all\"\n"); });
  EXPECT_TRUE(contains(message, "test.toml:2: model: expected a table, got integer 3; allowed: a table [model]"))
      << message;
  EXPECT_TRUE(contains(message, "test.toml:3: sweep: expected a table")) << message;
}

TEST(Study, HasSweepFollowsTheSweepTable) {
  EXPECT_FALSE(parse("name = \"x\"\n").has_sweep);
  EXPECT_TRUE(parse("name = \"x\"\n[sweep]\n").has_sweep);
  EXPECT_TRUE(parse("name = \"x\"\n[sweep]\n\"model.layers\" = [4, 8]\nanything = {goes = true}\n").has_sweep);
  EXPECT_TRUE(parse("name = \"x\"\n[sweep.grid]\nlr = [1e-3, 1e-2]\n").has_sweep);
}

TEST_F(StudyFiles, ResolvedTomlParsesBackToAnEqualStudy) {
  write("tokens.bin", std::string(4096, '\x01'));
  const std::vector<std::string> studies = {
      "name = \"t\"\n",
      R"(name = "full"
seed = 123456789
[model]
layers = 3
width = 96
heads = 3
norm = "none"
norm_eps = 1e-5
dropout = 0.3
vocab = 300
seq_len = 16
[scaling]
rule = "custom"
learnable_lambda = true
logit_scale = 0.125
[train]
optimizer = "sgd"
momentum = 0.95
schedule = "cosine"
lr = 0.1
[data]
kind = "tokens"
path = "tokens.bin"
val_fraction = 0.3
[record]
forward = ["corr", "chan_var"]
backward = ["nonfinite"]
[theory]
input_corr = -0.1
[sweep]
"train.lr" = [0.1, 0.01]
[sweep.nested]
x = { y = "z" }
)",
      R"(name = "mlp"
[model]
type = "mlp"
activation = "linear"
sigma_w2 = 2.0000000000000004
head = "regression"
outputs = 1
[data]
gaussian_noise = 0.3333333333333333
)",
  };
  for (const auto& text : studies) {
    const std::string path = write("study.toml", text);
    const Study first = load_study(path, {"train.eval_every=7"});
    // Parsed from another directory: the data path is already absolute.
    const Study second = parse_study(first.config_toml, "resolved.toml", "/");
    expect_same_study(first, second);
    EXPECT_EQ(first.config_toml, second.config_toml);
    EXPECT_EQ(second.train.eval_every, 7);
    // Every table is written out, defaults included.
    for (const char* table : {"[model]", "[scaling]", "[train]", "[data]", "[record]", "[parallel]", "[device]"})
      EXPECT_TRUE(contains(first.config_toml, std::string("\n") + table + "\n")) << first.config_toml;
  }
}

TEST(Study, ResolvedTomlFillsEveryDefault) {
  const Study study = parse("name = \"d\"\n");
  const std::string& text = study.config_toml;
  for (const char* line :
       {"seed = 0\n", "type = \"transformer\"\n", "layers = 4\n", "norm = \"pre\"\n", "activation = \"gelu\"\n",
        "norm_eps = 1e-05\n", "rule = \"standard\"\n", "std = ", "optimizer = \"adamw\"\n", "beta2 = 0.95\n",
        "lr = 0.001\n", "kind = \"markov\"\n", "markov_successors = 4\n", "forward = []\n", "on_nonfinite = \"stop\"\n",
        "dp = 1\n", "microbatches = 1\n", "threads = 0\n", "precision = \"fp32\"\n"})
    EXPECT_TRUE(contains(text, line)) << line << " missing from\n" << text;
  // Keys of settings not chosen are not written (they would be errors).
  EXPECT_FALSE(contains(text, "sigma_w2")) << text;
  EXPECT_FALSE(contains(text, "momentum")) << text;
  EXPECT_FALSE(contains(text, "gaussian_noise")) << text;
  EXPECT_FALSE(contains(text, "[sweep]")) << text;
}

TEST(Study, FinalCheckpointIsWrittenOutOnlyWhenFalse) {
  // true by default and then left out of the resolved text, which the run files and checkpoints of before the key
  // existed hold; false is written, and read back.
  const Study plain = parse("name = \"d\"\n");
  EXPECT_TRUE(plain.train.final_checkpoint);
  EXPECT_FALSE(contains(plain.config_toml, "final_checkpoint")) << plain.config_toml;
  EXPECT_FALSE(parse("name = \"d\"\n[train]\nfinal_checkpoint = true\n").config_toml.find("final_checkpoint") !=
               std::string::npos);
  const Study off = parse("name = \"d\"\n[train]\nfinal_checkpoint = false\n");
  EXPECT_FALSE(off.train.final_checkpoint);
  EXPECT_TRUE(contains(off.config_toml, "\n[train]\n")) << off.config_toml;
  EXPECT_TRUE(contains(off.config_toml, "checkpoint_every = 0\nfinal_checkpoint = false\n")) << off.config_toml;
  EXPECT_FALSE(parse(off.config_toml).train.final_checkpoint);
  const std::string wrong = error_of([] { parse("name = \"d\"\n[train]\nfinal_checkpoint = 0\n"); });
  EXPECT_TRUE(contains(wrong, "train.final_checkpoint: expected a boolean")) << wrong;
}

TEST(Study, CommittedStudiesAndSampleDataLoad) {
  const std::string quickstart_path = (source_dir() / "studies/quickstart.toml").string();
  const Study quickstart = load_study(quickstart_path);
  EXPECT_EQ(quickstart.name, "quickstart");
  EXPECT_EQ(quickstart.model.transformer().vocab, 64);
  EXPECT_EQ(quickstart.data.markov_successors, 3);
  // Switching the data kind leaves a markov-only key behind: refused, naming the key and the kind.
  const std::string message = error_of([&] { load_study(quickstart_path, {"data.kind=uniform"}); });
  EXPECT_TRUE(contains(message, quickstart_path + ":")) << message;
  EXPECT_TRUE(contains(message,
                       ": data.markov_successors: only valid when data.kind = "
                       "\"markov\", but data.kind is \"uniform\""))
      << message;
  // The sample data, from a study in studies/ (relative paths start at the study file's directory).
  for (const auto& [kind, file] : std::vector<std::pair<std::string, std::string>>{
           {"text", "../data/sample.txt"}, {"tokens", "../data/sample_tokens.bin"}}) {
    const Study study = parse_study(
        "name = \"sample\"\n[model]\nseq_len = 64\n[data]\nkind = \"" + kind + "\"\npath = \"" + file + "\"\n",
        "sample.toml", (source_dir() / "studies").string());
    EXPECT_TRUE(fs::equivalent(study.data.path, source_dir() / "studies" / file)) << study.data.path;
  }
}

TEST(Study, DocumentedExamplesAreValid) {
  std::ifstream doc(source_dir() / "docs/studies.md");
  ASSERT_TRUE(doc) << "docs/studies.md";
  std::vector<std::string> examples;
  std::string line;
  bool inside = false;
  while (std::getline(doc, line)) {
    if (line == "```toml") {
      inside = true;
      examples.emplace_back();
    } else if (inside && line == "```") {
      inside = false;
    } else if (inside) {
      examples.back() += line + "\n";
    }
  }
  ASSERT_EQ(examples.size(), 2u);
  for (const auto& example : examples) {
    // The examples are written as if saved in studies/ (their data path is ../data/sample.txt).
    const Study study = parse_study(example, "example.toml", (source_dir() / "studies").string());
    EXPECT_FALSE(study.name.empty());
  }
}

}  // namespace proplab
