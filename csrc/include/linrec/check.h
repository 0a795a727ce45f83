// Error reporting. Messages reach Python as the exception text, so they say which argument was
// wrong, what was expected and what was given.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace linrec {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream stream;
  (stream << ... << parts);
  return stream.str();
}

}  // namespace linrec

// Throws std::invalid_argument with the concatenated message parts when `cond` is false.
#define LINREC_CHECK(cond, ...)                                   \
  do {                                                            \
    if (!(cond)) throw std::invalid_argument(::linrec::concat(__VA_ARGS__)); \
  } while (0)
