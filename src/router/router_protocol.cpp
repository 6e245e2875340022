#include "router/router_protocol.h"

#include <algorithm>
#include <string_view>

#include "common/base64.h"
#include "common/http_util.h"
#include "common/json_depth.h"
#include "disagg/ticket.h"

namespace oasis::router {

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

OrderedJson ErrorJson(int status, const std::string& message) {
  // The types oasis-server gives these statuses (FromStatus in server/openai_protocol.cpp).
  const char* type = status == 404   ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "service_unavailable_error"
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
      *message = std::string(key) + " > 1 is not supported by the disaggregated router";
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
  // stream_options decide whether the decode instance takes the request, but the prefill
  // instance never sees them (it answers stream=false): checked here by the instances' rules
  // (server/openai_protocol.cpp, ParseCommon), with their messages, before anything is staged.
  auto options = out.body.find("stream_options");
  if (options != out.body.end() && !options->is_null()) {
    if (!options->is_object()) {
      *message = "'stream_options' must be an object";
      return std::nullopt;
    }
    if (!out.stream) {
      *message = "'stream_options' is only allowed with stream=true";
      return std::nullopt;
    }
    bool continuous = false;
    for (const auto& [key, value] : options->items()) {
      const std::string param = "stream_options." + key;
      bool* flag = key == "include_usage"            ? &out.include_usage
                   : key == "continuous_usage_stats" ? &continuous
                                                     : nullptr;
      if (flag == nullptr) {
        *message = "unknown parameter '" + param + "'";
        return std::nullopt;
      }
      if (value.is_null()) continue;
      if (!value.is_boolean()) {
        *message = "'" + param + "' must be a boolean";
        return std::nullopt;
      }
      *flag = value.get<bool>();
    }
    out.continuous_usage = continuous && out.include_usage;
  }
  return out;
}

StatusOr<TicketLease> CheckHandoffTicket(const std::string& base64) {
  if (base64.empty()) return InvalidArgument("the ticket is empty");
  StatusOr<std::string> bytes = Base64Decode(base64);
  if (!bytes.ok()) return bytes.status();
  StatusOr<disagg::HandoffTicket> ticket = disagg::ParseHandoffTicket(*bytes);
  if (!ticket.ok()) return ticket.status();
  return TicketLease{ticket->staging_address, ticket->lease_id};
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

std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage,
                          bool continuous_usage) {
  // The events of oasis-server's own stream (server/http_server.cpp, GenerationPump, and
  // server/openai_response.cpp): chat's role chunk, the chunk with the text and the finish,
  // the usage chunk; every choice chunk carries "usage": null with include_usage, or the usage
  // so far with continuous_usage_stats.
  const bool chat = endpoint == Endpoint::kChatCompletions;
  continuous_usage = continuous_usage && include_usage;
  auto member = [](const OrderedJson& j, const char* key) -> OrderedJson {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() ? OrderedJson(nullptr) : *it;
  };
  OrderedJson choice = OrderedJson::object();
  const OrderedJson choices = member(response, "choices");
  if (choices.is_array() && !choices.empty()) choice = choices[0];
  const OrderedJson usage = member(response, "usage");
  auto envelope = [&] {
    return OrderedJson{{"id", member(response, "id")},
                       {"object", chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", member(response, "created")},
                       {"model", member(response, "model")}};
  };
  // The usage of a choice chunk; `completed`: the tokens so far are all of them.
  auto with_usage = [&](OrderedJson chunk, bool completed) {
    if (!include_usage) return chunk;
    if (!continuous_usage || !usage.is_object()) {
      chunk["usage"] = continuous_usage ? usage : OrderedJson(nullptr);
      return chunk;
    }
    OrderedJson u = usage;
    if (!completed) {  // the role chunk, before admission: the prompt only, nothing cached yet
      const OrderedJson prompt = member(usage, "prompt_tokens");
      u["completion_tokens"] = 0;
      u["total_tokens"] = prompt.is_number() ? prompt : OrderedJson(0);
      u.erase("prompt_tokens_details");
    }
    chunk["usage"] = std::move(u);
    return chunk;
  };
  std::string sse;
  auto emit = [&](const OrderedJson& j) { sse += "data: " + Dump(j) + "\n\n"; };
  const OrderedJson index =
      member(choice, "index").is_number() ? member(choice, "index") : OrderedJson(0);
  OrderedJson out_choice = {{"index", index}};
  if (chat) {
    OrderedJson role = envelope();
    role["choices"] = OrderedJson::array({{{"index", index},
                                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}});
    emit(with_usage(std::move(role), /*completed=*/false));
    const OrderedJson message = member(choice, "message");
    OrderedJson delta = OrderedJson::object();
    const OrderedJson reasoning = member(message, "reasoning_content");
    if (reasoning.is_string() && !reasoning.get<std::string>().empty())
      delta["reasoning_content"] = reasoning;
    const OrderedJson content = member(message, "content");
    if (content.is_string() && !content.get<std::string>().empty()) delta["content"] = content;
    const OrderedJson calls = member(message, "tool_calls");
    if (calls.is_array() && !calls.empty()) {
      OrderedJson list = OrderedJson::array();
      for (size_t i = 0; i < calls.size(); ++i) {
        OrderedJson call = {{"index", i}};
        for (const char* key : {"id", "type", "function"}) call[key] = member(calls[i], key);
        list.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(list);
    }
    out_choice["delta"] = std::move(delta);
  } else {
    OrderedJson text = member(choice, "text");
    out_choice["text"] = text.is_null() ? OrderedJson("") : text;
  }
  out_choice["logprobs"] = member(choice, "logprobs");
  out_choice["finish_reason"] = member(choice, "finish_reason");
  out_choice["stop_reason"] = member(choice, "stop_reason");
  OrderedJson chunk = envelope();
  chunk["choices"] = OrderedJson::array({out_choice});
  emit(with_usage(std::move(chunk), /*completed=*/true));
  if (include_usage) {
    OrderedJson last = envelope();
    last["choices"] = OrderedJson::array();
    last["usage"] = usage;
    emit(last);
  }
  sse += "data: [DONE]\n\n";
  return sse;
}

}  // namespace oasis::router
