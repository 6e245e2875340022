#include "router/router_protocol.h"

#include <algorithm>
#include <string_view>

#include "common/http_util.h"
#include "common/json_depth.h"

namespace oasis::router {

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

OrderedJson ErrorJson(int status, const std::string& message) {
  const char* type = status == 503   ? "service_unavailable"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
}

std::string ErrorEvent(int status, const std::string& message) {
  return "data: " + Dump(ErrorJson(status, message)) + "\n\n";
}

size_t CompleteEventsEnd(std::string_view buffered) {
  // An event ends with a blank line: "\n\n", or "\r\n\r\n" (whose tail is "\n\r\n").
  const size_t lf = buffered.rfind("\n\n");
  const size_t crlf = buffered.rfind("\n\r\n");
  size_t end = 0;
  if (lf != std::string_view::npos) end = lf + 2;
  if (crlf != std::string_view::npos) end = std::max(end, crlf + 3);
  return end;
}

bool HasDoneEvent(std::string_view events) {
  for (size_t pos = events.find("data: [DONE]"); pos != std::string_view::npos;
       pos = events.find("data: [DONE]", pos + 1)) {
    if (pos == 0 || events[pos - 1] == '\n') return true;
  }
  return false;
}

std::string ErrorMessageOf(const std::string& body) {
  const nlohmann::json j = JsonNestedDeeperThan(body)
                               ? nlohmann::json(nlohmann::json::value_t::discarded)
                               : nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object()) {
      auto m = e->find("message");
      if (m != e->end() && m->is_string()) return m->get<std::string>();
    }
  }
  std::string text = Trim(body.substr(0, 200));
  return text.empty() ? "no body" : text;
}

std::optional<ClientRequest> ParseClientRequest(const std::string& text, int* status,
                                                std::string* message) {
  *status = 400;
  ClientRequest out;
  if (JsonNestedDeeperThan(text)) {
    *message = "the request body nests arrays and objects deeper than " +
               std::to_string(kMaxJsonDepth) + " levels";
    return std::nullopt;
  }
  out.body = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.body.is_discarded()) {
    *message = "the request body is not valid JSON";
    return std::nullopt;
  }
  if (!out.body.is_object()) {
    *message = "the request body must be a JSON object";
    return std::nullopt;
  }
  // Several samples per prompt would need one handoff per sample: not supported.
  for (const char* key : {"n", "best_of"}) {
    auto it = out.body.find(key);
    if (it != out.body.end() && it->is_number() && it->get<double>() > 1) {
      *message = "n > 1 is not supported by the disaggregated router";
      return std::nullopt;
    }
  }
  auto stream = out.body.find("stream");
  if (stream != out.body.end() && !stream->is_null()) {
    if (!stream->is_boolean()) {
      *message = "'stream' must be a boolean";
      return std::nullopt;
    }
    out.stream = stream->get<bool>();
  }
  auto options = out.body.find("stream_options");
  if (options != out.body.end() && options->is_object()) {
    auto usage = options->find("include_usage");
    out.include_usage = usage != options->end() && usage->is_boolean() && usage->get<bool>();
  }
  return out;
}

OrderedJson PrefillBody(const OrderedJson& client_body) {
  OrderedJson b = client_body;
  b["stream"] = false;
  b.erase("stream_options");
  return b;
}

OrderedJson DecodeBody(const OrderedJson& client_body, const std::string& ticket) {
  OrderedJson b = client_body;
  b["oasis_ticket"] = ticket;
  return b;
}

std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  auto member = [](const OrderedJson& j, const char* key) -> OrderedJson {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() ? OrderedJson(nullptr) : *it;
  };
  OrderedJson choice = OrderedJson::object();
  const OrderedJson choices = member(response, "choices");
  if (choices.is_array() && !choices.empty()) choice = choices[0];
  auto envelope = [&] {
    return OrderedJson{{"id", member(response, "id")},
                       {"object", chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", member(response, "created")},
                       {"model", member(response, "model")}};
  };
  OrderedJson out_choice = {{"index", 0}};
  if (chat) {
    OrderedJson content = member(member(choice, "message"), "content");
    out_choice["delta"] = {{"role", "assistant"},
                           {"content", content.is_null() ? OrderedJson("") : content}};
  } else {
    OrderedJson text = member(choice, "text");
    out_choice["text"] = text.is_null() ? OrderedJson("") : text;
  }
  out_choice["logprobs"] = member(choice, "logprobs");
  out_choice["finish_reason"] = member(choice, "finish_reason");
  OrderedJson chunk = envelope();
  chunk["choices"] = OrderedJson::array({out_choice});
  std::string sse = "data: " + Dump(chunk) + "\n\n";
  if (include_usage) {
    OrderedJson usage = envelope();
    usage["choices"] = OrderedJson::array();
    usage["usage"] = member(response, "usage");
    sse += "data: " + Dump(usage) + "\n\n";
  }
  sse += "data: [DONE]\n\n";
  return sse;
}

}  // namespace oasis::router
