// CHECK macros for broken invariants: print the condition, the location and a message,
// then abort. Request errors are Status values (oasis/status.h), never CHECKs.
//
//   OASIS_CHECK(n <= capacity) << "block table overflow: " << n;
//   OASIS_CHECK_EQ(a.size(), b.size()) << "shapes differ";
#pragma once

#include <sstream>
#include <string>

namespace oasis::detail {

// Collects the message of a failed CHECK and aborts in its destructor. Not thread-shared.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & CheckFailure(...).stream() << ...` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

template <typename A, typename B>
std::string CheckOpValues(const A& a, const B& b) {
  std::ostringstream s;
  s << "(" << a << " vs " << b << ") ";
  return s.str();
}

}  // namespace oasis::detail

#define OASIS_CHECK(cond)               \
  (cond) ? (void)0                      \
         : ::oasis::detail::Voidify() & \
               ::oasis::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define OASIS_CHECK_OP(a, b, op)                                                                 \
  ((a)op(b)) ? (void)0                                                                           \
             : ::oasis::detail::Voidify() &                                                      \
                   ::oasis::detail::CheckFailure(__FILE__, __LINE__, #a " " #op " " #b).stream() \
                       << ::oasis::detail::CheckOpValues((a), (b))

#define OASIS_CHECK_EQ(a, b) OASIS_CHECK_OP(a, b, ==)
#define OASIS_CHECK_NE(a, b) OASIS_CHECK_OP(a, b, !=)
#define OASIS_CHECK_LT(a, b) OASIS_CHECK_OP(a, b, <)
#define OASIS_CHECK_LE(a, b) OASIS_CHECK_OP(a, b, <=)
#define OASIS_CHECK_GT(a, b) OASIS_CHECK_OP(a, b, >)
#define OASIS_CHECK_GE(a, b) OASIS_CHECK_OP(a, b, >=)

// CHECK that a Status is OK (for call sites where an error is a bug).
#define OASIS_CHECK_OK(expr)                                                 \
  do {                                                                       \
    ::oasis::Status oasis_check_status_ = (expr);                            \
    OASIS_CHECK(oasis_check_status_.ok()) << oasis_check_status_.ToString(); \
  } while (0)
