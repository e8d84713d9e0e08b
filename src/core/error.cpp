#include "core/error.h"

#include <cstring>

namespace proplab {

IoError::IoError(std::string path, int error_number)
    : std::runtime_error(detail::concat(std::strerror(error_number), " while writing '", path, "'")),
      path_(std::move(path)),
      error_number_(error_number) {}

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
