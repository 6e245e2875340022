#include "server/serving.h"

#include "common/base64.h"
#include "common/http_util.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

namespace oasis::server {

std::optional<ApiError> TokenizeBadWords(const std::vector<std::string>& words,
                                         const tokenizer::Tokenizer* tok, int64_t vocab,
                                         std::vector<std::vector<int32_t>>* out) {
  if (words.empty()) return std::nullopt;
  if (tok == nullptr) return BadRequest("'bad_words' needs the model's tokenizer", "bad_words");
  for (const std::string& word : words) {
    const std::string stripped =
        word.substr(std::min(word.size(), word.find_first_not_of(" \t\n\r\f\v")));
    std::vector<int32_t> plain;
    for (const bool prefix_space : {false, true}) {
      std::vector<int32_t> ids =
          tok->Encode(prefix_space ? " " + stripped : stripped, tokenizer::AddSpecialTokens::kNo);
      if (ids.empty()) continue;
      if (!prefix_space) {
        plain = ids;
      } else if (!plain.empty() && (ids[0] == plain[0] || ids.size() != plain.size())) {
        continue;  // the space did not make a different word token
      }
      for (int32_t id : ids) {
        if (id < 0 || id >= vocab) {
          return BadRequest("'bad_words': token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(vocab) + ")",
                            "bad_words");
        }
      }
      out->push_back(std::move(ids));
    }
  }
  return std::nullopt;
}

// ---- GenerationJob -------------------------------------------------------------

GenerationJob::GenerationJob(Engine& engine, std::vector<std::shared_ptr<RequestStream>> streams,
                             std::vector<ChoiceState> choices, int64_t prompt_tokens)
    : engine_(engine),
      streams_(std::move(streams)),
      choices_(std::move(choices)),
      done_(streams_.size(), 0),
      unfinished_(streams_.size()),
      prompt_tokens_(prompt_tokens) {}

GenerationJob::~GenerationJob() { Abort(); }

void GenerationJob::Abort() {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (!done_[i]) engine_.Abort(streams_[i]->id());
  }
}

JobEvent GenerationJob::Take(size_t i, RequestOutput out) {
  cursor_ = i + 1;
  choices_[i].Add(out);
  if (out.finished) {
    done_[i] = 1;
    --unfinished_;
  }
  return JobEvent{i, std::move(out)};
}

std::optional<JobEvent> GenerationJob::Next(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (unfinished_ > 0) {
    if (std::optional<JobEvent> ev = Poll()) return ev;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    // Wait on the next unfinished stream: until the deadline when it is the only one, else
    // briefly, so that the others are looked at again.
    auto wait = std::chrono::duration_cast<milliseconds>(deadline - now);
    if (unfinished_ > 1) wait = std::min(wait, milliseconds(2));
    for (size_t k = 0; k < streams_.size(); ++k) {
      const size_t i = (cursor_ + k) % streams_.size();
      if (done_[i]) continue;
      if (std::optional<RequestOutput> out = streams_[i]->Next(wait))
        return Take(i, std::move(*out));
      break;
    }
  }
  return std::nullopt;
}

std::optional<JobEvent> GenerationJob::Poll() {
  for (size_t k = 0; k < streams_.size() && unfinished_ > 0; ++k) {
    const size_t i = (cursor_ + k) % streams_.size();
    if (done_[i]) continue;
    std::optional<RequestOutput> out = streams_[i]->Next(std::chrono::milliseconds(0));
    if (out) return Take(i, std::move(*out));
  }
  return std::nullopt;
}

void GenerationJob::SetWakeup(const std::function<void()>& wakeup) {
  for (const auto& s : streams_) s->SetWakeup(wakeup);
}

Usage GenerationJob::usage() const {
  Usage u;
  u.prompt_tokens = prompt_tokens_;
  for (const ChoiceState& c : choices_) {
    u.completion_tokens += c.completion_tokens;
    u.cached_tokens = std::max(u.cached_tokens, c.cached_tokens);  // the choices share the prompt
  }
  return u;
}

// ---- Service -------------------------------------------------------------------

Service::Service(ServerConfig config)
    : config_(std::move(config)),
      model_name_(config_.ResolvedModelName()),
      id_salt_(std::random_device{}()) {}

void Service::Publish(std::unique_ptr<ModelHost> host) {
  host_ = std::move(host);
  ready_.store(true, std::memory_order_release);
}

void Service::StopEngine() {
  BeginShutdown();
  if (host_ && host_->engine) host_->engine->Stop();
}

ProtocolLimits Service::limits() const {
  ProtocolLimits l;
  l.max_n = config_.max_n;
  l.max_top_logprobs = kMaxTopLogprobs;
  // Validated at start (ServerConfig::Validate).
  l.enable_auto_tool_choice = config_.enable_auto_tool_choice;
  if (auto kind = ParseToolParserKind(config_.tool_call_parser); kind.ok()) l.tool_parser = *kind;
  if (auto kind = ParseReasoningParserKind(config_.reasoning_parser); kind.ok())
    l.reasoning_parser = *kind;
  if (const ModelHost* h = host()) {
    l.max_model_len = h->max_model_len();
    l.vocab_size = h->config.vocab_size;
    l.default_sampling = h->generation.sampling;
  }
  return l;
}

std::optional<ApiError> Service::CheckModel(const std::string& requested) const {
  // The served name, or the --model path itself when no --served-model-name was given.
  if (config_.ServesModelName(requested)) return std::nullopt;
  ApiError e;
  e.http_status = 404;
  e.type = "not_found_error";
  e.param = "model";
  e.code = "model_not_found";
  e.message = "The model `" + Clip(requested, 256) + "` does not exist (this server serves `" +
              model_name_ + "`).";
  return e;
}

std::string Service::NewRequestId(const char* prefix) {
  const uint64_t n = next_id_.fetch_add(1, std::memory_order_relaxed);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%016llx", prefix,
                static_cast<unsigned long long>(id_salt_), static_cast<unsigned long long>(n));
  return buf;
}

namespace {

// An error of a request's own chat template: always the client's (400), whatever the kind.
Status RequestTemplateError(const Status& s) {
  return InvalidArgument("'chat_template': " + std::string(s.message()));
}

constexpr const char* kSpaces = " \t\n\r\f\v";

// continue_final_message, as Hugging Face's apply_chat_template: the rendered text is cut right
// after the final message's content (whatever the template appended — its end-of-turn marker —
// goes). A template may trim the content (`| trim`): the content stripped of surrounding
// whitespace is looked for, and its trailing whitespace is kept only where the template kept it.
// A content the rendered text does not hold is an error (the cut would be a guess).
std::optional<ApiError> CutAfterFinalMessage(const OrderedJson& messages, std::string* text) {
  const OrderedJson& last = messages.back();
  auto content = last.find("content");
  if (content == last.end() || !content->is_string()) return std::nullopt;
  const std::string& full = content->get_ref<const std::string&>();
  const size_t first = full.find_first_not_of(kSpaces);
  if (first == std::string::npos) return std::nullopt;  // empty: found at the end, nothing cut
  const std::string lstripped = full.substr(first);
  const std::string stripped = lstripped.substr(0, lstripped.find_last_not_of(kSpaces) + 1);
  const size_t at = text->rfind(stripped);
  if (at == std::string::npos) {
    return BadRequest(
        "continue_final_message is set but the final message does not appear in the rendered "
        "chat (the chat template changed its content), so the prompt cannot end with it",
        "continue_final_message");
  }
  const bool spacing_kept = text->compare(at, lstripped.size(), lstripped) == 0;
  text->resize(at + (spacing_kept ? lstripped.size() : stripped.size()));
  return std::nullopt;
}

// The request field an engine refusal is about: its message starts with the field's name (as
// SamplingParams::Validate and ValidateRequest write them). Empty (null) when none fits: the
// request as a whole (say, more KV than the whole pool).
std::string EngineErrorParam(const Status& s, const GenerateSpec& spec) {
  const std::string_view m = s.message();
  auto starts = [&](std::string_view word) {
    return m.substr(0, word.size()) == word &&
           (m.size() == word.size() || m[word.size()] == ' ' || m[word.size()] == ':');
  };
  if (starts("prompt token id"))
    return spec.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (starts("forced output")) return "forced_output_ids";
  if (starts("max_tokens")) return spec.max_tokens_param;
  if (starts("top_logprobs"))
    return spec.endpoint == Endpoint::kChatCompletions ? "top_logprobs" : "logprobs";
  if (starts("a stop string") || starts("stop strings")) return "stop";
  for (const char* field : {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                            "frequency_penalty", "repetition_penalty", "logit_bias",
                            "allowed_token_ids", "bad_words", "min_tokens", "prompt_logprobs"}) {
    if (starts(field)) return field;
  }
  return "";
}

}  // namespace

std::optional<ApiError> Service::RenderChatPrompt(const GenerateSpec& spec,
                                                  std::string* text) const {
  StatusOr<std::string> rendered = RenderChat(spec);
  if (!rendered.ok()) {
    return FromStatus(
        spec.chat_template ? rendered.status() : rendered.status().WithContext("chat template"),
        ChatTemplateParam(spec));
  }
  *text = std::move(rendered).value();
  if (spec.continue_final_message) return CutAfterFinalMessage(spec.messages, text);
  return std::nullopt;
}

StatusOr<std::string> Service::RenderChat(const GenerateSpec& spec) const {
  const ModelHost* h = host();
  if (h == nullptr) return Unavailable("the model is loading");
  std::shared_ptr<const ChatTemplate> request_template;
  if (spec.chat_template) {
    StatusOr<std::shared_ptr<const ChatTemplate>> parsed =
        request_templates_.Get(*spec.chat_template);
    if (!parsed.ok()) return RequestTemplateError(parsed.status());
    request_template = std::move(parsed).value();
  } else if (!h->chat_template) {
    return InvalidArgument(
        "this model has no chat template (tokenizer_config.json); start the server with "
        "--chat-template or send 'chat_template'");
  }
  const ChatTemplate& tmpl = request_template ? *request_template : *h->chat_template;
  OrderedJson ctx = OrderedJson::object();
  ctx["messages"] = spec.messages;
  ctx["add_generation_prompt"] = spec.add_generation_prompt;
  if (!spec.tools.is_null()) ctx["tools"] = spec.tools;
  if (h->template_files.bos_token) ctx["bos_token"] = *h->template_files.bos_token;
  if (h->template_files.eos_token) ctx["eos_token"] = *h->template_files.eos_token;
  // Extra template variables never replace the server's own (ParseChatRequest refuses them
  // already; this also covers a key set above but missing from kServerChatTemplateKeys).
  for (const auto& [k, v] : spec.chat_template_kwargs.items()) {
    if (ctx.contains(k) || IsServerChatTemplateKey(k)) {
      return InvalidArgument("'chat_template_kwargs' may not set '" + k +
                             "': the server sets that template variable itself");
    }
    ctx[k] = v;
  }
  StatusOr<std::string> rendered = tmpl.Render(ctx);
  if (!rendered.ok()) {
    if (request_template) return RequestTemplateError(rendered.status());
    // The model's template failed on these messages (raise_exception, a loop or recursion
    // past its bounds): the request cannot be rendered — a 400, never a retryable 429.
    if (rendered.status().code() == StatusCode::kInvalidArgument) return rendered.status();
    return InvalidArgument(std::string(rendered.status().message()));
  }
  return rendered;
}

std::optional<ApiError> Service::BuildPrompts(const GenerateSpec& spec,
                                              std::vector<std::vector<int32_t>>* prompts,
                                              std::vector<std::string>* echo_texts,
                                              std::string* chat_text) const {
  const ModelHost* h = host();
  if (h == nullptr) return FromStatus(Unavailable("the model is loading"));
  const tokenizer::Tokenizer* tok = h->tokenizer.get();
  const char* param = spec.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (spec.endpoint == Endpoint::kChatCompletions) {
    if (tok == nullptr)
      return BadRequest("this model has no tokenizer: chat needs one", "messages");
    std::string text;
    if (std::optional<ApiError> e = RenderChatPrompt(spec, &text)) return e;
    // The template writes the special tokens; add_special_tokens (vLLM's, default false) adds
    // the tokenizer's on top.
    prompts->push_back(tok->Encode(text, spec.add_special_tokens.value_or(false)
                                             ? tokenizer::AddSpecialTokens::kYes
                                             : tokenizer::AddSpecialTokens::kNo));
    if (chat_text != nullptr) *chat_text = std::move(text);
  } else {
    for (const PromptInput& p : spec.prompts) {
      if (p.text) {
        if (tok == nullptr)
          return BadRequest("this model has no tokenizer: send token ids", "prompt");
        prompts->push_back(tok->Encode(*p.text, spec.add_special_tokens.value_or(true)
                                                    ? tokenizer::AddSpecialTokens::kYes
                                                    : tokenizer::AddSpecialTokens::kNo));
        if (spec.echo) echo_texts->push_back(*p.text);
      } else {
        prompts->push_back(p.ids);
        if (spec.echo) {
          echo_texts->push_back(
              tok != nullptr ? tok->Decode(p.ids, tokenizer::SkipSpecialTokens::kNo) : "");
        }
      }
    }
  }
  const int64_t context = h->max_model_len();
  const int64_t vocab = h->config.vocab_size;
  if (spec.truncate_prompt_tokens != 0) {  // each prompt keeps its last N tokens (vLLM's)
    const int64_t keep = spec.truncate_prompt_tokens < 0 ? context : spec.truncate_prompt_tokens;
    for (size_t i = 0; i < prompts->size(); ++i) {
      std::vector<int32_t>& ids = (*prompts)[i];
      if (static_cast<int64_t>(ids.size()) <= keep) continue;
      ids.erase(ids.begin(), ids.end() - keep);
      if (spec.echo && i < echo_texts->size()) {  // echo what the model was given
        (*echo_texts)[i] =
            tok != nullptr ? tok->Decode(ids, tokenizer::SkipSpecialTokens::kNo) : "";
      }
    }
  }
  for (const std::vector<int32_t>& ids : *prompts) {
    if (ids.empty()) return BadRequest("the prompt is empty after tokenization", param);
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) {
        return BadRequest("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")",
                          param);
      }
    }
    const int64_t len = static_cast<int64_t>(ids.size());
    if (len >= context) {
      return BadRequest("This model's maximum context length is " + std::to_string(context) +
                            " tokens. However, your prompt has " + std::to_string(len) +
                            " tokens (no room for a completion).",
                        param);
    }
    if (spec.max_tokens && len + *spec.max_tokens > context) {
      return BadRequest(
          "This model's maximum context length is " + std::to_string(context) +
              " tokens. However, you requested " + std::to_string(len + *spec.max_tokens) +
              " tokens (" + std::to_string(len) + " in the prompt, " +
              std::to_string(*spec.max_tokens) +
              " for the completion). Please reduce the prompt or " + spec.max_tokens_param + ".",
          spec.max_tokens_param);
    }
    // min_tokens against the tokens the request may generate, as vLLM: max_tokens, or when it
    // is left out the room the prompt leaves in the context (or the generation config's
    // max_new_tokens), which the parser could not know.
    const int64_t room = context - len;
    const int64_t resolved = h->generation.ResolveMaxTokens(spec.max_tokens, len, context);
    const int64_t most = resolved == -1 ? room : resolved;
    if (spec.min_tokens > most) {
      const std::string n = std::to_string(most);
      const std::string max =
          spec.max_tokens && most == *spec.max_tokens ? " (" + n + ")"
          : spec.max_tokens ? ", which the generation config's max_new_tokens caps at " + n
          : most == room
              ? ", which defaults to the room the prompt leaves in the context (" + n + " tokens)"
              : ", which defaults to the generation config's max_new_tokens (" + n + ")";
      return BadRequest(
          "min_tokens (" + std::to_string(spec.min_tokens) + ") must be <= max_tokens" + max,
          "min_tokens");
    }
  }
  return std::nullopt;
}

std::unique_ptr<GenerationJob> Service::Start(const GenerateSpec& spec,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              const std::string& request_id,
                                              ApiError* error) const {
  const ModelHost* h = host();
  if (h == nullptr) {
    *error = FromStatus(Unavailable("the model is loading"));
    return nullptr;
  }
  std::vector<std::vector<int32_t>> bad_words;
  if (std::optional<ApiError> e =
          TokenizeBadWords(spec.bad_words, h->tokenizer.get(), h->config.vocab_size, &bad_words)) {
    *error = std::move(*e);
    return nullptr;
  }
  std::vector<EngineRequest> group;
  std::vector<ChoiceState> choices;
  int64_t prompt_tokens = 0;
  // Disaggregation: a prefill instance hands every request off; a decode instance takes only
  // requests with a ticket (from oasis-router).
  std::shared_ptr<KvImportSource> import;
  if (h->role != "both" && (spec.n != 1 || prompts.size() != 1)) {
    *error = BadRequest("a " + h->role + " instance serves one prompt with n = 1 per request", "n");
    return nullptr;
  }
  if (h->role != "both" && spec.prompt_logprobs) {
    *error = BadRequest("'prompt_logprobs' is not supported with disaggregated prefill/decode",
                        "prompt_logprobs");
    return nullptr;
  }
  if (h->role == "prefill" && spec.stream) {
    *error = BadRequest(
        "a prefill instance answers with stream=false only (it is called by oasis-router)",
        "stream");
    return nullptr;
  }
  if (!spec.oasis_ticket.empty() && h->role != "decode") {
    *error = BadRequest("'oasis_ticket' is for decode instances (--role decode)", "oasis_ticket");
    return nullptr;
  }
  if (h->role == "decode") {
    if (spec.oasis_ticket.empty()) {
      *error = BadRequest(
          "a decode instance serves requests handed off by a prefill instance: send them through "
          "oasis-router (no 'oasis_ticket')",
          "oasis_ticket");
      return nullptr;
    }
    StatusOr<std::string> bytes = Base64Decode(spec.oasis_ticket);
    StatusOr<disagg::HandoffTicket> ticket = bytes.ok()
                                                 ? disagg::ParseHandoffTicket(*bytes)
                                                 : StatusOr<disagg::HandoffTicket>(bytes.status());
    if (!ticket.ok()) {
      *error = BadRequest("bad 'oasis_ticket': " + std::string(ticket.status().message()),
                          "oasis_ticket");
      return nullptr;
    }
    import = h->importer->Source(std::move(*ticket), h->full_transfer);
  }
  // Structured output: a constraint per sequence (each keeps its own matcher states).
  std::vector<int32_t> grammar_eos;
  structured::ReasoningGate gate;
  if (spec.grammar != nullptr) {
    if (h->grammar_vocab == nullptr) {
      *error = BadRequest("'" + spec.grammar_param +
                              "' needs the model's tokenizer (this server serves token ids only)",
                          spec.grammar_param);
      return nullptr;
    }
    for (int64_t id : h->config.eos_token_ids) {
      if (id >= 0 && id < h->config.vocab_size) grammar_eos.push_back(static_cast<int32_t>(id));
    }
    // With a reasoning parser the structure is the answer's: it starts after the thinking
    // block (vLLM's behaviour).
    if (spec.endpoint == Endpoint::kChatCompletions &&
        spec.output.reasoning != ReasoningParserKind::kNone && h->tokenizer != nullptr) {
      const auto start = h->tokenizer->TokenToId("<think>");
      const auto end = h->tokenizer->TokenToId("</think>");
      if (start && end) {
        gate.enabled = true;
        gate.think_start = *start;
        gate.think_end = *end;
        gate.open_at_start = spec.output.reasoning_open_at_start ||
                             spec.output.reasoning == ReasoningParserKind::kDeepSeekR1;
      }
    }
  }
  std::shared_ptr<structured::GrammarConstraint> first_constraint;
  for (size_t p = 0; p < prompts.size(); ++p) {
    prompt_tokens += static_cast<int64_t>(prompts[p].size());
    for (int64_t j = 0; j < spec.n; ++j) {
      const size_t index = p * static_cast<size_t>(spec.n) + static_cast<size_t>(j);
      EngineRequest r;
      r.id = request_id + "-" + std::to_string(index);
      r.prompt = prompts[p];
      r.max_tokens = h->generation.ResolveMaxTokens(
          spec.max_tokens, static_cast<int64_t>(prompts[p].size()), h->max_model_len());
      r.min_tokens = spec.min_tokens;
      r.sampling = spec.sampling;
      r.sampling.bad_words_token_ids = bad_words;
      if (spec.grammar != nullptr) {
        // One matcher for the request's sequences (n, several prompts): states and allowed sets
        // computed once, one memory bound.
        if (first_constraint == nullptr) {
          first_constraint = std::make_shared<structured::GrammarConstraint>(
              spec.grammar, h->grammar_vocab, grammar_eos, gate);
          r.sampling.constraint = first_constraint;
        } else {
          r.sampling.constraint = first_constraint->Sibling();
        }
      }
      if (spec.sampling.seed) r.sampling.seed = *spec.sampling.seed + static_cast<uint64_t>(j);
      r.stop_token_ids = spec.stop_token_ids;
      r.forced_output = spec.forced_output_ids;
      r.stop = spec.stop;
      r.include_stop_str_in_output = spec.include_stop_str_in_output;
      r.skip_special_tokens = spec.skip_special_tokens;
      r.spaces_between_special_tokens = spec.spaces_between_special_tokens;
      r.ignore_eos = spec.ignore_eos;
      r.cache_salt = spec.cache_salt;
      r.logprobs = spec.logprobs;
      r.num_top_logprobs = spec.top_logprobs;
      r.prompt_logprobs = spec.prompt_logprobs.value_or(-1);
      r.detokenize = h->tokenizer != nullptr;
      r.handoff = h->role == "prefill";
      r.import = import;
      // Sparse KV: a request whose KV can never fit the host store is too large (413).
      if (Status room =
              h->engine->CheckHostKvRoom(static_cast<int64_t>(r.prompt.size()), r.max_tokens);
          !room.ok()) {
        *error = HostKvTooLarge(room);
        return nullptr;
      }
      group.push_back(std::move(r));
      ChoiceState c;
      c.index = static_cast<int>(index);
      c.prompt_tokens = static_cast<int64_t>(prompts[p].size());  // the engine's outputs re-set it
      if (spec.echo && spec.logprobs) c.echo_prompt = prompts[p];
      choices.push_back(std::move(c));
    }
  }
  // All sequences at once: a refused request (say, more prompts than the waiting queue has
  // room for) queues none of them.
  StatusOr<std::vector<std::shared_ptr<RequestStream>>> streams =
      h->engine->SubmitGroup(std::move(group));
  if (!streams.ok()) {
    *error = FromStatus(streams.status(), EngineErrorParam(streams.status(), spec));
    return nullptr;
  }
  return std::make_unique<GenerationJob>(*h->engine, std::move(streams).value(), std::move(choices),
                                         prompt_tokens);
}

}  // namespace oasis::server
