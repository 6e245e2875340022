#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace oasis::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "CHECK failed at " << file << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  std::string message = stream_.str();
  std::fprintf(stderr, "FATAL: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace oasis::detail
