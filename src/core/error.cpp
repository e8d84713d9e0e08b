#include "core/error.h"

namespace proplab::detail {

void fail_check(const char* expr, const char* file, int line, const std::string& message) {
  std::ostringstream out;
  out << "internal invariant failed: " << expr << " (" << file << ":" << line << ")";
  if (!message.empty()) out << ": " << message;
  throw InternalError(out.str());
}

}  // namespace proplab::detail
