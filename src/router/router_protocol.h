// oasis-router's protocol with clients and instances (router.h has the whole exchange): the
// client's body checked, the bodies sent to the prefill and decode instances, error bodies and
// SSE events, and the SSE stream synthesized for a request that finished on its prefill
// instance. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "oasis/status.h"

namespace oasis::router {

using OrderedJson = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChatCompletions };

// JSON text as sent (invalid UTF-8 replaced).
std::string Dump(const OrderedJson& j);

// {"error":{"message","type","param":null,"code":status}}; type as oasis-server's:
// "not_found_error" (404), "rate_limit_error" (429), "service_unavailable_error" (503),
// "server_error" (other 5xx), else "invalid_request_error".
OrderedJson ErrorJson(int status, const std::string& message);
// ErrorJson as one SSE event ("data: ...\n\n").
std::string ErrorEvent(int status, const std::string& message);
// The message of an OpenAI error body, or a short prefix of whatever the body is.
std::string ErrorMessageOf(const std::string& body);

struct ClientRequest {
  OrderedJson body;  // B, the client's body as sent (key order kept)
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage == true
  bool continuous_usage = false;  // and stream_options.continuous_usage_stats == true
};
// Parses and checks a client body: a JSON object, n and best_of at most 1, stream a boolean,
// and stream_options by the instances' own rules (an object, only with stream=true, the keys
// include_usage and continuous_usage_stats, booleans or null): the prefill instance never sees
// them, and a decode instance refusing them would come after the prefill. On failure returns
// nullopt with `*status` / `*message`.
std::optional<ClientRequest> ParseClientRequest(const std::string& text, int* status,
                                                std::string* message);

// B' for the prefill instance: B with "stream": false and without "stream_options".
OrderedJson PrefillBody(const OrderedJson& client_body);
// B'' for the decode instance: B plus "oasis_ticket": ticket.
OrderedJson DecodeBody(const OrderedJson& client_body, const std::string& ticket);

// SSE relay framing: the length of the leading part of `buffered` made of complete events
// (up to and including the blank line that ends the last complete one; 0 when none is).
size_t CompleteEventsEnd(std::string_view buffered);
// Whether `events` (complete events) hold the end-of-stream event "data: [DONE]".
bool HasDoneEvent(std::string_view events);

// The SSE stream equivalent to a finished (non-streamed) completion or chat completion
// response, in oasis-server's stream format: chat's role chunk ({"role":"assistant",
// "content":""}), one chunk with the whole text (chat: content, reasoning_content, tool_calls
// as deltas), logprobs, finish_reason and stop_reason, a usage chunk when include_usage, then
// [DONE]. With include_usage the choice chunks carry "usage": null, or with continuous_usage
// the usage so far (the role chunk: the prompt's).
std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage,
                          bool continuous_usage = false);

// A prefill instance's "oasis_handoff" checked: base64 of a ticket ParseHandoffTicket takes.
// The staging address and lease id, or the error (the ticket is the instance's fault).
struct TicketLease {
  std::string staging_address;
  uint64_t lease_id = 0;
};
StatusOr<TicketLease> CheckHandoffTicket(const std::string& base64);

}  // namespace oasis::router
