// study/emit: a validated study written back as TOML (Study::config_toml, stored in every run file): every key of
// the schema that applies, defaults filled in, [scaling] with every parameter of its rule, [sweep] as given. The
// text parses back to the same study.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "study/schema.h"

namespace proplab::study_detail {

// `sweep`: the study's [sweep] table, or null.
std::string resolved_toml(const std::vector<TableSpec>& schema, const Study& study, const toml::table* sweep);

}  // namespace proplab::study_detail
