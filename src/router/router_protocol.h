// oasis-router's protocol with clients and instances (router.h has the whole exchange): the
// client's body checked, the bodies sent to the prefill and decode instances, error bodies and
// SSE events, and the SSE stream synthesized for a request that finished on its prefill
// instance. Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace oasis::router {

using OrderedJson = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChatCompletions };

// JSON text as sent (invalid UTF-8 replaced).
std::string Dump(const OrderedJson& j);

// {"error":{"message","type","param":null,"code":status}}; type "invalid_request_error" for 4xx,
// "service_unavailable" for 503, "server_error" for other 5xx.
OrderedJson ErrorJson(int status, const std::string& message);
// ErrorJson as one SSE event ("data: ...\n\n").
std::string ErrorEvent(int status, const std::string& message);
// The message of an OpenAI error body, or a short prefix of whatever the body is.
std::string ErrorMessageOf(const std::string& body);

struct ClientRequest {
  OrderedJson body;  // B, the client's body as sent (key order kept)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage == true
};
// Parses and checks a client body. On failure returns nullopt with `*status` / `*message`.
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
// response: one chunk with the whole text, a usage chunk when include_usage, then [DONE].
std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage);

}  // namespace oasis::router
