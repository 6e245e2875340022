// OpenAI-compatible request bodies and streamed responses: see openai_stream.h.
#include "tools/loadgen/openai_stream.h"

namespace oasis::loadgen {

using nlohmann::json;

StatusOr<json> BuildRequestBody(const RequestOptions& options, const Prompt& prompt) {
  json body = json::object();
  body["model"] = options.model;
  if (options.type == EndpointType::kChat) {
    if (!prompt.token_ids.empty()) {
      return InvalidArgument("token-id prompts cannot be sent to a chat endpoint");
    }
    if (prompt.messages.empty()) {
      body["messages"] = json::array({{{"role", "user"}, {"content", prompt.text}}});
    } else {
      body["messages"] = json::array();
      for (const ChatMessage& m : prompt.messages) {
        body["messages"].push_back({{"role", m.role}, {"content", m.content}});
      }
    }
  } else if (!prompt.messages.empty()) {
    return InvalidArgument("chat-message prompts need a chat endpoint (--endpoint-type chat)");
  } else if (!prompt.token_ids.empty()) {
    body["prompt"] = prompt.token_ids;
  } else {
    body["prompt"] = prompt.text;
  }
  body["max_tokens"] = prompt.output_len;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.force_min_tokens) body["min_tokens"] = prompt.output_len;
  if (options.temperature) body["temperature"] = *options.temperature;
  body.update(options.extra_body);
  return body;
}

std::string ErrorMessageFromBody(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    for (const char* key : {"error", "detail", "message"}) {
      const auto it = j.find(key);
      if (it == j.end()) continue;
      if (it->is_string()) return it->get<std::string>();
      if (it->is_object()) {
        const auto msg = it->find("message");
        if (msg != it->end() && msg->is_string()) return msg->get<std::string>();
      }
      return it->dump();
    }
  }
  std::string text(body.substr(0, 200));
  if (body.size() > 200) text += "...";
  return text.empty() ? "(empty body)" : text;
}

StreamAccumulator::StreamAccumulator(EndpointType type, const Prompt& prompt, double start_s,
                                     bool save_text)
    : type_(type), save_text_(save_text) {
  record_.start_s = start_s;
  record_.prompt_tokens = prompt.prompt_len;
  record_.expected_output_tokens = prompt.output_len;
  record_.http_status = 200;
}

void StreamAccumulator::OnBytes(std::string_view bytes, double now_s) {
  events_.clear();
  parser_.Feed(bytes, &events_);
  for (const SseEvent& e : events_) OnEvent(e, now_s);
}

void StreamAccumulator::OnEvent(const SseEvent& event, double now_s) {
  if (!stream_error_.empty() || done_) return;
  if (event.data == "[DONE]") {
    done_ = true;
    return;
  }
  const json chunk = json::parse(event.data, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object()) {
    stream_error_ = "malformed chunk: " + event.data.substr(0, 200);
    return;
  }
  if (const auto err = chunk.find("error"); err != chunk.end() && !err->is_null()) {
    stream_error_ = ErrorMessageFromBody(event.data);
    return;
  }
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    const auto prompt = usage->find("prompt_tokens");
    const auto completion = usage->find("completion_tokens");
    if (prompt != usage->end() && prompt->is_number_integer() && completion != usage->end() &&
        completion->is_number_integer()) {
      record_.prompt_tokens = prompt->get<int64_t>();
      record_.output_tokens = completion->get<int64_t>();
      record_.usage_reported = true;
      // Prompt tokens served from the server's prefix cache (OpenAI's field; absent: none).
      record_.cached_tokens = 0;
      if (const auto details = usage->find("prompt_tokens_details");
          details != usage->end() && details->is_object()) {
        const auto cached = details->find("cached_tokens");
        if (cached != details->end() && cached->is_number_integer() && cached->get<int64_t>() > 0)
          record_.cached_tokens = cached->get<int64_t>();
      }
    }
  }
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return;
  const json& choice = (*choices)[0];
  if (!choice.is_object()) return;
  const auto finish = choice.find("finish_reason");
  const bool finished = finish != choice.end() && finish->is_string();
  if (finished) record_.finish_reason = finish->get<std::string>();

  const json* text = nullptr;
  bool role_chunk = false;
  if (type_ == EndpointType::kCompletions) {
    const auto it = choice.find("text");
    if (it != choice.end() && it->is_string()) text = &*it;
  } else if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
    role_chunk = delta->contains("role");
    for (const char* key : {"content", "reasoning_content", "reasoning"}) {
      const auto it = delta->find(key);
      if (it != delta->end() && it->is_string() &&
          (text == nullptr || !it->get_ref<const std::string&>().empty())) {
        text = &*it;
      }
    }
  }
  if (text == nullptr) return;
  const std::string& piece = text->get_ref<const std::string&>();
  if (piece.empty() && (finished || role_chunk)) {
    if (finished && finish_event_s_ < 0) finish_event_s_ = now_s;
    return;
  }
  if (token_events_ == 0) {
    record_.ttft_s = now_s - record_.start_s;
  } else {
    record_.itl_s.push_back(now_s - last_event_s_);
  }
  last_event_s_ = now_s;
  ++token_events_;
  if (save_text_) record_.generated_text += piece;
}

RequestRecord StreamAccumulator::Finish(double now_s) {
  events_.clear();
  parser_.Finish(&events_);
  for (const SseEvent& e : events_) OnEvent(e, now_s);
  record_.e2el_s = now_s - record_.start_s;
  if (!record_.usage_reported) record_.output_tokens = token_events_;
  if (stream_error_.empty() && !done_) stream_error_ = "stream ended without data: [DONE]";
  // Tokens whose text is empty (special tokens skipped) arrive as a finishing chunk with no
  // text: the usage still counts them, and that chunk is the first token.
  const bool silent_tokens = token_events_ == 0 && record_.usage_reported &&
                             record_.output_tokens > 0 && finish_event_s_ >= 0;
  if (silent_tokens) record_.ttft_s = finish_event_s_ - record_.start_s;
  if (stream_error_.empty() && token_events_ == 0 && !silent_tokens)
    stream_error_ = "no token in the stream";
  if (!stream_error_.empty()) {
    record_.success = false;
    record_.failure = FailureKind::kStreamError;
    record_.error = stream_error_;
  } else {
    record_.success = true;
  }
  return std::move(record_);
}

}  // namespace oasis::loadgen
