// study: load_study / parse_study (see study.h and docs/studies.md). The work is split by job: study/text (text
// helpers), study/schema (the schema), study/validator (reading and checking a study), study/emit (writing it
// back as TOML).
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

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "study/text.h"
#include "study/validator.h"

namespace proplab {

namespace fs = std::filesystem;
using study_detail::run_validation;

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

std::string toml_basic_string(const std::string& text) { return study_detail::toml_string(text); }

}  // namespace proplab
