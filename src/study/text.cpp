#include "study/text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>

namespace proplab::study_detail {

// ---- text helpers ------------------------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string::size_type begin = 0;
  while (true) {
    const auto end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

// Shortest text that reads back as exactly `value`.
std::string shortest(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// A TOML float literal (always with a '.' or an exponent, so it reads back as a float).
std::string toml_float(double value) {
  std::string text = shortest(value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

// The double whose shortest text equals the float's shortest text: 1e-5f is written as 1e-05, not 9.99...e-06.
double float_as_decimal(float value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
}

// A TOML basic string.
std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string toml_string_array(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items) quoted.push_back(toml_string(item));
  std::string text = "[";
  text += join(quoted, ", ");
  text += "]";
  return text;
}

// What a node is, for "expected X, got Y" messages.
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "string " + toml_string(node.as_string()->get());
    case toml::node_type::integer:
      return "integer " + std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return "float " + toml_float(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const bool same =
          std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate closest to `word` when it is close enough to be a likely typo (or one is a prefix of the other).
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& candidate : candidates) {
    std::size_t distance = edit_distance(word, candidate);
    const std::size_t shorter = std::min(word.size(), candidate.size());
    const bool prefix = shorter >= 3 && (word.rfind(candidate, 0) == 0 || candidate.rfind(word, 0) == 0);
    if (distance > std::max<std::size_t>(2, word.size() / 3) && !prefix) continue;
    if (prefix) distance = std::min(distance, std::size_t{1});
    if (distance < best_distance) best_distance = distance, best = candidate;
  }
  return best;
}

}  // namespace proplab::study_detail
