// RequestRecord: what one benchmark request measured, success or failure. Plain value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oasis::loadgen {

// Why a request failed; `kNone` for a success.
enum class FailureKind {
  kNone,
  kHttpStatus,   // the server answered with a non-2xx status
  kConnection,   // could not connect, or the connection broke mid-stream
  kTimeout,      // exceeded --request-timeout
  kStreamError,  // an error event inside the stream, or a malformed stream
};

const char* FailureKindName(FailureKind kind);

struct RequestRecord {
  int64_t index = -1;         // position in the workload
  int64_t conversation = -1;  // multi-turn: the conversation (0-based); -1 otherwise
  int64_t turn = 0;           // multi-turn: the turn (1-based); 0 otherwise
  bool success = false;
  FailureKind failure = FailureKind::kNone;
  int http_status = 0;          // 0 when no response arrived
  std::string error;            // the server's error message or the client-side reason
  double start_s = 0;           // send time, seconds since the benchmark's start
  double ttft_s = 0;            // first token event after send
  double e2el_s = 0;            // last byte after send
  std::vector<double> itl_s;    // gaps between successive token events
  int64_t prompt_tokens = 0;    // from usage; else the prompt's own length when known
  int64_t output_tokens = 0;    // from usage; else the number of token events
  bool usage_reported = false;  // prompt/output tokens came from the server's usage
  int64_t cached_tokens = 0;    // usage.prompt_tokens_details.cached_tokens (prefix cache hits)
  int64_t expected_output_tokens = 0;  // the max_tokens asked for
  std::string finish_reason;
  std::string generated_text;  // kept only with --save-text
};

// The failure as one line: "HTTP 400: message", "connection error: ...", "timeout: ...".
std::string FailureReason(const RequestRecord& record);
// FailureReason with every run of digits replaced by "N" except the HTTP status, so that
// "token id 5860077 is outside ..." and "token id 96431039 is outside ..." group together.
std::string FailureGroupKey(const RequestRecord& record);

}  // namespace oasis::loadgen
