// core/error: proplab's error types and invariant checks.
//
// - UserError: bad input from the user (study file, data file, command line). Carries a message that says
//   where (file, line, key path) and what would be valid; the CLI prints it and exits with status 2.
// - InternalError: a broken invariant inside proplab (a bug); PROPLAB_CHECK raises it with the invariant's text.
// - IoError: the operating system refused to write a file proplab produces (no space, quota, a read-only or
//   vanished directory, a device error). Neither bad input nor a bug: a run stops resumably (exit status 6).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace proplab {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

struct IoError : std::runtime_error {
  // what(): "<strerror(error_number)> while writing '<path>'".
  IoError(std::string path, int error_number);
  const std::string& path() const { return path_; }
  int error_number() const { return error_number_; }
  // strerror(error_number), e.g. "No space left on device".
  std::string reason() const;

 private:
  std::string path_;
  int error_number_ = 0;
};

namespace detail {
[[noreturn]] void fail_check(const char* expr, const char* file, int line, const std::string& message);

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace proplab

// PROPLAB_CHECK(cond, parts...): throws InternalError naming the invariant, file and line when cond is false.
#define PROPLAB_CHECK(cond, ...)                                                                                   \
  do {                                                                                                             \
    if (!(cond)) ::proplab::detail::fail_check(#cond, __FILE__, __LINE__, ::proplab::detail::concat(__VA_ARGS__)); \
  } while (0)
