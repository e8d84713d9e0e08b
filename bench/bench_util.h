// bench/bench_util: the pieces the training benchmarks (bench_train, bench_resnet) share: a recorder writing a
// real run file as a study run would, the PyTorch yardsticks (bench/torch_reference.py under PyTorch 2.x from the
// bench virtual environment, and under Debian's 1.13), and numbers read out of their JSON. Header-only, like
// sgemm_rate.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"
#include "train/recorder.h"

namespace proplab::bench {

// The median of the values (the upper one of an even count; 0 for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Starts recording every statistic every `every` steps (> 0) of `model` into the run file DIR/every<N><tag>.h5
// (overwritten; the folder is created), as a study run does: sets `recorder` and `writer`.
inline void start_recording(Model& model, std::int64_t every, std::int64_t total_steps,
                            const std::filesystem::path& dir, std::unique_ptr<Recorder>& recorder,
                            std::optional<RunWriter>& writer, const std::string& tag = "") {
  RecordConfig record;
  record.every = every;
  recorder = std::make_unique<Recorder>(record, model.probes(), model.params(), total_steps);
  RunHeader header;
  header.proplab_version = "bench";
  writer.emplace(RunWriter::create(dir / ("every" + std::to_string(every) + tag + ".h5"), header, true));
  recorder->create_datasets(*writer);
  writer->start();
}

// The setups the benches time side by side, by `every`: 0 recording off, 10 and 1 recording every 10 steps and every
// step, −1 every step with every probe summed after its op (ApartSink).
inline const char* recording_label(std::int64_t every) {
  return every == 0    ? "record off"
         : every == 1  ? "record every step"
         : every == 10 ? "record every 10"
                       : "every, ops apart";
}

// The recorder as a sink that takes whole tensors only: every probe summed in a pass of its own after the op that
// produced it, none inside the ops (ops::OpMoments), for timing the two side by side.
class ApartSink final : public ProbeSink {
 public:
  explicit ApartSink(Recorder& recorder) : recorder_(recorder) {}
  void forward(int probe, const Tensor& x, std::int64_t sequences) override { recorder_.forward(probe, x, sequences); }
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override {
    recorder_.backward(probe, d_x, sequences);
  }
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads, float scale) override {
    recorder_.attention_logits(probe, sums, qkv, heads, scale);
  }
  bool image(int probe, const Tensor& x, bool backward) override { return recorder_.image(probe, x, backward); }

 private:
  Recorder& recorder_;
};

// The standard output of a shell command, or "" when it cannot start or exits non-zero.
inline std::string run_command(const std::string& command) {
  std::string output;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
    if (pclose(pipe) != 0) output.clear();
  }
  return output;
}

// A number after `"key":` in JSON text (first occurrence), or nullopt.
inline std::optional<double> json_number(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\"");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(text.find(':', at) + 1));
}

// A string after `"key":` in JSON text (first occurrence), or "" (also for null or a non-string value).
inline std::string json_string(const std::string& text, const std::string& key) {
  const auto at = text.find("\"" + key + "\"");
  if (at == std::string::npos) return "";
  const auto open = text.find_first_not_of(" \t\n", text.find(':', at) + 1);
  if (open == std::string::npos || text[open] != '"') return "";
  const auto close = text.find('"', open + 1);
  return close == std::string::npos ? "" : text.substr(open + 1, close - open - 1);
}

// One PyTorch yardstick: bench/torch_reference.py under one interpreter. search() finds its fastest thread setup
// and variant (eager or torch.compile) once; round() then times that setup in a fresh interpreter, once per round
// of the benchmark, so each round's ratio compares runs made minutes apart at most.
struct TorchYardstick {
  std::string label;                    // what the report calls it
  std::string python;                   // the interpreter
  std::string script;                   // bench/torch_reference.py
  std::string model;                    // "transformer" or "resnet20"
  std::string version, setup, variant;  // after search(): torch version, "intra,blas", "eager" | "compiled"
  double search_ms = 0.0;
  std::string search_output;            // search()'s JSON (hook overhead etc.)
  std::vector<double> round_ms, ratio;  // per round: PyTorch ms/step, and PyTorch ms / proplab ms

  // Runs the full search (every thread setup eagerly, then the fastest compiled under torch 2.x); false when this
  // interpreter cannot run it (no torch).
  bool search(int steps, const std::string& extra = "") {
    std::ostringstream command;
    command << python << " " << script << " --model " << model << " --json --warmup 2 --steps " << steps << " " << extra
            << " 2>/dev/null";
    search_output = run_command(command.str());
    setup = json_string(search_output, "best_setup");
    variant = json_string(search_output, "variant");
    version = json_string(search_output, "torch_version");
    search_ms = json_number(search_output, "ms_per_step").value_or(0.0);
    if (variant.empty()) variant = "eager";
    return !setup.empty();
  }

  // ms/step of the searched setup and variant in a fresh interpreter (OpenBLAS reads its thread count at load).
  std::optional<double> round(int steps) const {
    const std::string blas = setup.substr(setup.find(',') + 1);
    std::ostringstream command;
    command << "env -u OMP_NUM_THREADS OPENBLAS_NUM_THREADS=" << blas << " " << python << " " << script << " --model "
            << model << " --setup " << setup << " --variant " << variant << " --warmup 2 --steps " << steps
            << " 2>/dev/null";
    return json_number(run_command(command.str()), "ms_per_step");
  }
};

// The yardsticks, in the order reports show them: PyTorch 2.x (the interpreter PROPLAB_TORCH_PYTHON names, else
// SOURCE/.bench-venv/bin/python, made by bench/make-torch-venv.sh) first, Debian's /usr/bin/python3
// (python3-torch 1.13) second. An interpreter that does not exist is left out; one without torch fails search().
inline std::vector<TorchYardstick> torch_yardsticks(const std::string& source_dir, const std::string& model) {
  std::vector<TorchYardstick> out;
  auto add = [&](const std::string& label, const std::string& python) {
    TorchYardstick y;
    y.label = label;
    y.python = python;
    y.script = source_dir + "/bench/torch_reference.py";
    y.model = model;
    out.push_back(std::move(y));
  };
  std::string modern = source_dir + "/.bench-venv/bin/python";
  if (const char* named = std::getenv("PROPLAB_TORCH_PYTHON"); named && *named) modern = named;
  if (std::filesystem::exists(modern) && modern != "/usr/bin/python3") add("pytorch (bench venv)", modern);
  add("pytorch (debian)", "/usr/bin/python3");
  return out;
}

// The yardsticks that run here, each searched once (or pinned to `pinned_setup`, eager, when it is given), with a
// line each saying what was found; `extra` goes to the search (bench_train passes --hooks).
inline std::vector<TorchYardstick> find_yardsticks(const std::string& source_dir, const std::string& model, int steps,
                                                   const std::string& extra = "",
                                                   const std::string& pinned_setup = "") {
  std::vector<TorchYardstick> found;
  for (TorchYardstick& y : torch_yardsticks(source_dir, model)) {
    if (!pinned_setup.empty()) {
      y.setup = pinned_setup;
      y.variant = "eager";
    } else if (!y.search(steps, extra)) {
      std::printf("%s: not available (%s cannot run bench/torch_reference.py)\n", y.label.c_str(), y.python.c_str());
      continue;
    } else {
      std::printf("%s: torch %s, fastest intra,blas = %s %s (%.1f ms/step in the search)\n", y.label.c_str(),
                  y.version.c_str(), y.setup.c_str(), y.variant.c_str(), y.search_ms);
      if (const std::string error = json_string(y.search_output, "compile_error"); !error.empty())
        std::printf("  (torch.compile failed, eager kept: %s)\n", error.c_str());
    }
    found.push_back(std::move(y));
  }
  if (found.empty() || found.front().python == "/usr/bin/python3")
    std::printf("pytorch 2.x: no bench virtual environment (bench/make-torch-venv.sh makes one)\n");
  std::fflush(stdout);
  return found;
}

}  // namespace proplab::bench
