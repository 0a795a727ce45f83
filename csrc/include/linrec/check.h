// Error reporting. Messages reach Python as the exception text, so they say which argument was
// wrong, what was expected and what was given, in the words and dtype names torch's Python uses.
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

// A failed check throws std::invalid_argument with the concatenated message parts. torch hands every
// C++ exception of an op to Python as one type (ValueError, or RuntimeError from torch 2.15 on), so the
// Python exception linrec.linrec raises for it travels as the message's last word: " [TypeError]" for a
// dtype, " [IndexError]" for a dim, none for a ValueError (src/linrec/_core/checks.py, api_error).
#define LINREC_CHECK(cond, ...)                                               \
  do {                                                                        \
    if (!(cond)) throw std::invalid_argument(::linrec::concat(__VA_ARGS__)); \
  } while (0)
#define LINREC_CHECK_TYPE(cond, ...) LINREC_CHECK(cond, __VA_ARGS__, " [TypeError]")
#define LINREC_CHECK_INDEX(cond, ...) LINREC_CHECK(cond, __VA_ARGS__, " [IndexError]")
