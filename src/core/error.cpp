#include "core/error.h"

#include <cstring>

namespace proplab {

namespace {
std::string io_error_message(const std::string& path, int error_number) {
  std::string message = std::strerror(error_number);
  message.append(" while writing '").append(path).append("'");
  return message;
}
}  // namespace

IoError::IoError(std::string path, int error_number)
    : std::runtime_error(io_error_message(path, error_number)), path_(std::move(path)), error_number_(error_number) {}

std::string IoError::reason() const { return std::strerror(error_number_); }

}  // namespace proplab

namespace proplab::detail {

void fail_check(const char* expr, const char* file, int line, const std::string& message) {
  std::ostringstream out;
  out << "internal invariant failed: " << expr << " (" << file << ":" << line << ")";
  if (!message.empty()) out << ": " << message;
  throw InternalError(out.str());
}

}  // namespace proplab::detail
