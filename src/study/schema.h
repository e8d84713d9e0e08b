// study/schema: the study module's one schema: each table a list of Fields, and a Field knows its key, what is
// allowed (as text for messages), how to check a TOML node and store it into the Study, how to write the stored
// value back as TOML, and when it applies. The validator (study/validator.h) reads and writes studies through it.
#pragma once

#include <toml++/toml.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "study/study.h"
#include "study/text.h"

namespace proplab::study_detail {

// "an integer in lo..hi" or "an integer >= lo".
std::string integer_range_text(std::int64_t lo, std::int64_t hi);

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

// Every table but [scaling] (checked against the rule registry) and [sweep] (free-form), in reading order:
// selectors (model.type, data.kind, train.optimizer) come before the keys that depend on them.
std::vector<TableSpec> build_schema();

// The top-level keys, in the order config_toml writes them.
inline const std::vector<std::string> kTopLevelKeys = {"name",   "seed",     "model",  "scaling", "train", "data",
                                                       "record", "parallel", "device", "theory",  "sweep"};

}  // namespace proplab::study_detail
