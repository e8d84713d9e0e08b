// study/validator: reads a study's TOML tree (and its --set overrides) through the schema (study/schema.h), checks
// every key, value and combination, collects EVERY problem as one located line, and writes the resolved text
// (config_toml). load_study / parse_study (study/study.h) are run_validation with a file or a string.
#pragma once

#include <string>
#include <vector>

#include "study/study.h"

namespace proplab::study_detail {

// Parses `toml_text`, applies the overrides, validates and fills a Study; UserError listing every problem.
Study run_validation(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                     const std::vector<std::string>& overrides);

}  // namespace proplab::study_detail
