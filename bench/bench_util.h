// bench/bench_util: the pieces the training benchmarks (bench_train, bench_resnet) share: a recorder writing a
// real run file as a study run would, the PyTorch reference's output read from a shell command, and a number read
// out of its JSON. Header-only, like sgemm_rate.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
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

// Starts recording every statistic every `every` steps (> 0) of `model` into the run file DIR/every<N>.h5
// (overwritten; the folder is created), as a study run does: sets `recorder` and `writer`.
inline void start_recording(Model& model, std::int64_t every, std::int64_t total_steps,
                            const std::filesystem::path& dir, std::unique_ptr<Recorder>& recorder,
                            std::optional<RunWriter>& writer) {
  RecordConfig record;
  record.every = every;
  recorder = std::make_unique<Recorder>(record, model.probes(), model.params(), total_steps);
  RunHeader header;
  header.proplab_version = "bench";
  writer.emplace(RunWriter::create(dir / ("every" + std::to_string(every) + ".h5"), header, true));
  recorder->create_datasets(*writer);
  writer->start();
}

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

}  // namespace proplab::bench
