// study/text: the study module's private text helpers (TOML spelling of values, messages, "did you mean").
#pragma once

#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace proplab::study_detail {

inline constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t kMaxSteps = 1'000'000'000'000;  // steps and every step interval
inline constexpr std::int64_t kMaxDim = 1 << 20;              // widths, vocabularies, sequence lengths, batches
inline constexpr double kInf = std::numeric_limits<double>::infinity();

std::string join(const std::vector<std::string>& parts, const std::string& separator);
std::string trim(const std::string& text);
std::vector<std::string> split(const std::string& text, char separator);
std::string shortest(double value);
std::string toml_float(double value);
double float_as_decimal(float value);
std::string toml_string(const std::string& text);
std::string toml_string_array(const std::vector<std::string>& items);
std::string describe(const toml::node& node);
std::size_t edit_distance(const std::string& a, const std::string& b);
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace proplab::study_detail
