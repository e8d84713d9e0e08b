// io/csv: RFC 4180 CSV, as the sweep folder's index.csv is written (sweep/index.h) and read (by the sweep and by
// `proplab report`): fields quoted when they hold ',', '"' or a line break, '"' doubled inside quotes.
#pragma once

#include <string>
#include <vector>

namespace proplab {

// One record's fields as a line (ending in "\n").
std::string csv_line(const std::vector<std::string>& fields);
// A whole file's records (the first is the header).
std::vector<std::vector<std::string>> parse_csv(const std::string& text);

}  // namespace proplab
