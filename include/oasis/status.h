// Status and StatusOr: the error values of OasisKV.
//
// Request errors (bad input, missing files, limits) travel as Status values up to the
// HTTP/gRPC layer, where each code maps to an HTTP status. Broken invariants are CHECKs
// (common/check.h), never Status. Value types; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace oasis {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // malformed request or file contents (HTTP 400)
  kNotFound,            // unknown model, missing file or tensor (HTTP 404)
  kOutOfRange,          // prompt longer than the context, index past the end (HTTP 400)
  kResourceExhausted,   // no KV memory, queue full (HTTP 429)
  kUnavailable,         // still loading, shutting down (HTTP 503)
  kFailedPrecondition,  // operation not valid in the current state
  kUnimplemented,       // unsupported architecture, component or feature
  kDataLoss,            // truncated or corrupted file
  kCancelled,           // aborted by the client
  kInternal,            // a bug surfaced as an error
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Prefixes context to the message: "while loading x: <message>".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or an error. Accessing value() of an error is a broken invariant (aborts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() {
    CheckOk();
    return &*value_;
  }
  const T* operator->() const {
    CheckOk();
    return &*value_;
  }
  T& operator*() & {
    CheckOk();
    return *value_;
  }
  const T& operator*() const& {
    CheckOk();
    return *value_;
  }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void AbortOnBadStatusAccess(const Status& status);

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!status_.ok()) AbortOnBadStatusAccess(status_);
}

}  // namespace oasis

#define OASIS_STATUS_CONCAT_INNER(a, b) a##b
#define OASIS_STATUS_CONCAT(a, b) OASIS_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define OASIS_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::oasis::Status oasis_status_ = (expr);        \
    if (!oasis_status_.ok()) return oasis_status_; \
  } while (0)

// `lhs = value of expr` or return its error. lhs may be a declaration.
#define OASIS_ASSIGN_OR_RETURN(lhs, expr) \
  OASIS_ASSIGN_OR_RETURN_IMPL(OASIS_STATUS_CONCAT(oasis_statusor_, __LINE__), lhs, expr)
#define OASIS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
