#include "server/openai_response.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/tokenizer.h"

namespace oasis::server {
namespace {

// JSON has no -inf: vLLM reports impossible tokens as -9999.0.
double JsonLogprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

}  // namespace

std::string DumpJson(const OrderedJson& j) {
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

void ChoiceState::Add(const RequestOutput& out) {
  text += out.text;
  tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end());
  prompt_tokens = out.prompt_tokens;
  completion_tokens = out.completion_tokens;
  cached_tokens = out.cached_tokens;
  if (!out.prompt_logprobs.empty()) prompt_logprobs = out.prompt_logprobs;
  if (out.finished) {
    finished = true;
    finish_reason = out.finish_reason;
    stop_reason = out.stop_reason;
    error = out.error;
    handoff_ticket = out.handoff_ticket;
  }
}

OrderedJson Usage::ToJson() const {
  OrderedJson j = {{"prompt_tokens", prompt_tokens},
                   {"total_tokens", prompt_tokens + completion_tokens},
                   {"completion_tokens", completion_tokens}};
  if (cached_tokens > 0) j["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return j;
}

ResponseBuilder::ResponseBuilder(const GenerateSpec& spec, std::string id, std::string model,
                                 int64_t created, const tokenizer::Tokenizer* tok)
    : spec_(spec), id_(std::move(id)), model_(std::move(model)), created_(created), tok_(tok) {}

std::string ResponseBuilder::TokenString(int32_t id) const {
  if (tok_ == nullptr) return "<" + std::to_string(id) + ">";
  const int32_t one[1] = {id};
  return tok_->Decode(one, tokenizer::SkipSpecialTokens::kNo);
}

std::string ResponseBuilder::TokenLabel(int32_t id) const {
  return spec_.return_tokens_as_token_ids ? "token_id:" + std::to_string(id) : TokenString(id);
}

OrderedJson ResponseBuilder::TokenBytes(int32_t id) const {
  OrderedJson bytes = OrderedJson::array();
  if (tok_ == nullptr) return bytes;
  for (unsigned char c : tok_->DecodedBytes(id)) bytes.push_back(static_cast<int>(c));
  return bytes;
}

namespace {

// text_offset counts characters (code points of the UTF-8 text), as OpenAI's and vLLM's do.
size_t Chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

OrderedJson ResponseBuilder::Logprobs(const std::vector<GeneratedToken>& tokens,
                                      size_t* text_offset) const {
  if (!spec_.logprobs) return nullptr;
  if (spec_.endpoint == Endpoint::kChatCompletions) {
    OrderedJson content = OrderedJson::array();
    for (const GeneratedToken& t : tokens) {
      OrderedJson top = OrderedJson::array();
      for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int>(k) < spec_.top_logprobs;
           ++k) {
        const TokenLogprob& alt = t.top_logprobs[k];
        top.push_back({{"token", TokenLabel(alt.token)},
                       {"logprob", JsonLogprob(alt.logprob)},
                       {"bytes", TokenBytes(alt.token)}});
      }
      content.push_back({{"token", TokenLabel(t.token)},
                         {"logprob", JsonLogprob(t.logprob)},
                         {"bytes", TokenBytes(t.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  return CompletionLogprobs(tokens, nullptr, text_offset);
}

OrderedJson ResponseBuilder::CompletionLogprobs(const std::vector<GeneratedToken>& tokens,
                                                const ChoiceState* echo,
                                                size_t* text_offset) const {
  OrderedJson text_offsets = OrderedJson::array(), token_logprobs = OrderedJson::array(),
              strings = OrderedJson::array(), top_logprobs = OrderedJson::array();
  std::vector<GeneratedToken> prompt;  // echo: the prompt's tokens after the first
  if (echo != nullptr && !echo->echo_prompt.empty()) {
    // The first prompt token has no log-probability (null, as vLLM); the others' come from
    // the prompt logprobs (GenerateSpec::prompt_logprobs = logprobs with echo).
    const int32_t first = echo->echo_prompt.front();
    const std::string s = TokenLabel(first);
    strings.push_back(s);
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    text_offsets.push_back(*text_offset);
    *text_offset += Chars(spec_.return_tokens_as_token_ids ? TokenString(first) : s);
    for (const PromptTokenLogprob& e : echo->prompt_logprobs) {
      GeneratedToken g;
      g.token = e.token;
      g.logprob = e.logprob;
      g.top_logprobs = e.top_logprobs;
      prompt.push_back(std::move(g));
    }
  }
  for (const std::vector<GeneratedToken>* part :
       {static_cast<const std::vector<GeneratedToken>*>(&prompt), &tokens}) {
    for (const GeneratedToken& t : *part) {
      const std::string s = TokenLabel(t.token);
      strings.push_back(s);
      token_logprobs.push_back(JsonLogprob(t.logprob));
      text_offsets.push_back(*text_offset);
      *text_offset += Chars(spec_.return_tokens_as_token_ids ? TokenString(t.token) : s);
      OrderedJson top = OrderedJson::object();
      for (size_t k = 0; k < t.top_logprobs.size() && static_cast<int>(k) < spec_.top_logprobs;
           ++k) {
        top[TokenLabel(t.top_logprobs[k].token)] = JsonLogprob(t.top_logprobs[k].logprob);
      }
      top[s] = JsonLogprob(t.logprob);  // the sampled token too, also for logprobs=0 (as vLLM)
      top_logprobs.push_back(top);
    }
  }
  return {{"text_offset", text_offsets},
          {"token_logprobs", token_logprobs},
          {"tokens", strings},
          {"top_logprobs", top_logprobs}};
}

OrderedJson ResponseBuilder::PromptLogprobs(const std::vector<PromptTokenLogprob>& entries) const {
  OrderedJson list = OrderedJson::array({nullptr});
  for (const PromptTokenLogprob& e : entries) {
    // The prompt token first, then the top ones (ranks 1..k; the prompt token among them keeps
    // its place and takes its top-k rank, as vLLM's dict does). decoded_token is the token's
    // text (return_tokens_as_token_ids renames only the logprobs' tokens, as vLLM).
    OrderedJson entry = OrderedJson::object();
    entry[std::to_string(e.token)] = {{"logprob", JsonLogprob(e.logprob)},
                                      {"rank", e.rank},
                                      {"decoded_token", TokenString(e.token)}};
    for (size_t k = 0; k < e.top_logprobs.size(); ++k) {
      const TokenLogprob& alt = e.top_logprobs[k];
      entry[std::to_string(alt.token)] = {{"logprob", JsonLogprob(alt.logprob)},
                                          {"rank", static_cast<int64_t>(k + 1)},
                                          {"decoded_token", TokenString(alt.token)}};
    }
    list.push_back(std::move(entry));
  }
  return list;
}

OrderedJson ResponseBuilder::StopReason(const ChoiceState& s) const {
  if (s.finish_reason != FinishReasonKind::kStop || s.stop_reason.empty()) return nullptr;
  // The engine reports a stop token id as its decimal text; report ids as integers (vLLM).
  const bool is_stop_string =
      std::find(spec_.stop.begin(), spec_.stop.end(), s.stop_reason) != spec_.stop.end();
  if (!is_stop_string) {
    try {
      size_t pos = 0;
      const long long id = std::stoll(s.stop_reason, &pos);
      if (pos == s.stop_reason.size()) return id;
    } catch (...) {
    }
  }
  return s.stop_reason;
}

OrderedJson ResponseBuilder::FinishReason(FinishReasonKind reason, int tool_calls) {
  if (tool_calls > 0 && (reason == FinishReasonKind::kStop || reason == FinishReasonKind::kLength))
    return "tool_calls";
  return FinishReasonName(reason);
}

OrderedJson ResponseBuilder::ChatDeltaJson(ChoiceState& state, const std::string& text,
                                           bool finished) const {
  if (!spec_.output.active())
    return text.empty() ? OrderedJson::object() : OrderedJson{{"content", text}};
  if (!state.parser) state.parser = std::make_shared<ChatOutputParser>(spec_.output);
  ChatDelta d = state.parser->Feed(text);
  if (finished) {
    ChatDelta rest = state.parser->Finish();
    d.reasoning += rest.reasoning;
    d.content += rest.content;
    ToolStreamDelta calls{"", std::move(d.tool_calls)};
    calls.Append(ToolStreamDelta{"", std::move(rest.tool_calls)});
    d.tool_calls = std::move(calls.calls);
  }
  OrderedJson delta = OrderedJson::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    OrderedJson calls = OrderedJson::array();
    for (const ToolCallDelta& c : d.tool_calls) {
      OrderedJson call = {{"index", c.index}};
      if (c.announce) {
        call["id"] = c.id;
        call["type"] = "function";
        call["function"] = {{"name", c.name}, {"arguments", c.arguments}};
      } else {
        call["function"] = {{"arguments", c.arguments}};
      }
      calls.push_back(std::move(call));
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

OrderedJson ResponseBuilder::Envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

OrderedJson ResponseBuilder::Final(const std::vector<ChoiceState>& choices, const Usage& usage,
                                   const std::vector<std::string>& echo_prefixes) const {
  const bool chat = spec_.endpoint == Endpoint::kChatCompletions;
  OrderedJson body = Envelope(chat ? "chat.completion" : "text_completion");
  OrderedJson list = OrderedJson::array();
  for (const ChoiceState& c : choices) {
    size_t offset = 0;
    OrderedJson choice = {{"index", c.index}};
    int tool_calls = 0;
    if (chat && spec_.output.active()) {
      ChatMessageParts parts = ParseChatOutput(spec_.output, c.text);
      OrderedJson message = {{"role", "assistant"}};
      message["content"] = parts.content ? OrderedJson(*parts.content) : OrderedJson(nullptr);
      if (spec_.output.reasoning != ReasoningParserKind::kNone || parts.reasoning) {
        message["reasoning_content"] =
            parts.reasoning ? OrderedJson(*parts.reasoning) : OrderedJson(nullptr);
      }
      if (spec_.output.tools != ToolParserKind::kNone) {
        OrderedJson calls = OrderedJson::array();
        for (const ToolCall& t : parts.tool_calls) {
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      tool_calls = static_cast<int>(parts.tool_calls.size());
      choice["message"] = std::move(message);
      choice["logprobs"] = Logprobs(c.tokens, &offset);
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = Logprobs(c.tokens, &offset);
    } else {
      const std::string& prefix =
          static_cast<size_t>(c.index) < echo_prefixes.size() ? echo_prefixes[c.index] : "";
      choice["text"] = prefix + c.text;
      if (c.echo_prompt.empty()) {
        offset = Chars(prefix);
        choice["logprobs"] = Logprobs(c.tokens, &offset);
      } else {  // echo with logprobs: the prompt's tokens lead (offsets from 0)
        choice["logprobs"] = CompletionLogprobs(c.tokens, &c, &offset);
      }
    }
    choice["finish_reason"] =
        c.finished ? FinishReason(c.finish_reason, tool_calls) : OrderedJson(nullptr);
    choice["stop_reason"] = StopReason(c);
    if (!chat && spec_.prompt_logprobs)
      choice["prompt_logprobs"] = PromptLogprobs(c.prompt_logprobs);
    list.push_back(std::move(choice));
  }
  body["choices"] = std::move(list);
  body["usage"] = usage.ToJson();
  // Chat: one list for the response (every choice has the same prompt), as vLLM.
  if (chat && spec_.prompt_logprobs) {
    body["prompt_logprobs"] =
        choices.empty() ? OrderedJson(nullptr) : PromptLogprobs(choices.front().prompt_logprobs);
  }
  return body;
}

OrderedJson ResponseBuilder::Chunk(ChoiceState& state, const RequestOutput& out,
                                   const std::string& prefix) const {
  const bool chat = spec_.endpoint == Endpoint::kChatCompletions;
  const std::string text = prefix + out.text;
  OrderedJson delta = chat ? ChatDeltaJson(state, text, out.finished) : OrderedJson(nullptr);
  const bool nothing = chat ? delta.empty() : text.empty();
  if (nothing && !out.finished && !(spec_.logprobs && !out.tokens.empty())) return nullptr;
  OrderedJson chunk = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  OrderedJson choice = {{"index", state.index}};
  if (chat) {
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  if (!prefix.empty() && !state.echo_prompt.empty() && spec_.logprobs && !chat) {
    // The echoed prompt's tokens lead the first chunk's logprobs (as vLLM's stream).
    choice["logprobs"] = CompletionLogprobs(out.tokens, &state, &state.text_offset);
  } else {
    state.text_offset += Chars(prefix);
    choice["logprobs"] = Logprobs(out.tokens, &state.text_offset);
  }
  const int tool_calls = state.parser ? state.parser->tool_calls() : 0;
  choice["finish_reason"] =
      out.finished ? FinishReason(out.finish_reason, tool_calls) : OrderedJson(nullptr);
  choice["stop_reason"] = out.finished ? StopReason(state) : OrderedJson(nullptr);
  chunk["choices"] = OrderedJson::array({choice});
  if (spec_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

OrderedJson ResponseBuilder::RoleChunk(int index) const {
  OrderedJson chunk = Envelope("chat.completion.chunk");
  chunk["choices"] = OrderedJson::array({{{"index", index},
                                          {"delta", {{"role", "assistant"}, {"content", ""}}},
                                          {"logprobs", nullptr},
                                          {"finish_reason", nullptr}}});
  if (spec_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

OrderedJson ResponseBuilder::UsageChunk(const Usage& usage) const {
  OrderedJson chunk = Envelope(
      spec_.endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = OrderedJson::array();
  chunk["usage"] = usage.ToJson();
  return chunk;
}

OrderedJson ResponseBuilder::ErrorChunk(const ApiError& error) { return error.ToJson(); }

}  // namespace oasis::server
