// study: a study file (TOML) turned into a typed, validated Study.
//
// toml++ parses the file into a tree; each --set override (key.path=value, value in TOML syntax) edits the tree;
// one validator walks the tree and reports EVERY problem at once (unknown key, wrong type, out-of-range value,
// impossible combination, missing data file) with the file, line, key path and what is allowed, as a UserError.
// Nothing is written and no work starts before validation succeeds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace proplab {

// A study is the RunSpec it describes (config_toml: the whole study, defaults filled in, as TOML text, stored in
// run files) and where it came from.
struct Study : RunSpec {
  bool has_sweep = false;   // a [sweep] table is present (proplab run refuses it)
  std::string source_path;  // the study file as given
};

// Loads, applies overrides ("model.layers=8", "train.lr=1e-3", "scaling.rule=\"xavier\""), validates.
// Throws UserError listing every problem found.
Study load_study(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from TOML text (source_name is used in messages; relative data paths resolve against base_dir).
Study parse_study(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                  const std::vector<std::string>& overrides = {});

// `text` as a TOML basic string: quoted, with `"` and `\` escaped and control characters as \uXXXX.
std::string toml_basic_string(const std::string& text);

}  // namespace proplab
