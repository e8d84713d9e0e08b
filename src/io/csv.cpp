#include "io/csv.h"

namespace proplab {

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    const std::string& field = fields[i];
    if (field.find_first_of(",\"\n\r") == std::string::npos) {
      line += field;
      continue;
    }
    line += '"';
    for (const char c : field) line += c == '"' ? std::string("\"\"") : std::string(1, c);
    line += '"';
  }
  return line + "\n";
}

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        field += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        field += c;
    } else if (c == '"') {
      quoted = true, any = true;
    } else if (c == ',') {
      record.push_back(std::move(field)), field.clear(), any = true;
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) record.push_back(std::move(field));
      if (!record.empty()) records.push_back(std::move(record));
      record.clear(), field.clear(), any = false;
    } else {
      field += c, any = true;
    }
  }
  if (any || !field.empty()) record.push_back(std::move(field));
  if (!record.empty()) records.push_back(std::move(record));
  return records;
}

}  // namespace proplab
