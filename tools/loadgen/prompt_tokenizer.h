// PromptTokenizer: token counts (and chat rendering) for datasets of text, which vLLM measures
// with the model's tokenizer. oasis-bench has none of its own, so it either asks the server
// (`POST /tokenize`, served by oasis-server and vLLM: {"model", "prompt"} or {"model",
// "messages"} -> {"count", "tokens"}; `POST /detokenize` {"model", "tokens"} -> {"prompt"}) or
// approximates (4 bytes a token, no chat template).
//
// ServerTokenizer owns nothing but borrows a BenchClient (one connection); neither class is
// thread-safe. Used by the dataset loaders before the run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "oasis/status.h"
#include "tools/loadgen/http_client.h"

namespace oasis::loadgen {

class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;
  // Tokens of `text` with the tokenizer's default special tokens (HF's `tokenizer(text)`).
  virtual StatusOr<int64_t> Count(const std::string& text) = 0;
  // Tokens of one user message rendered by the chat template with the generation prompt
  // (HF's `apply_chat_template([...], add_generation_prompt=True)`).
  virtual StatusOr<int64_t> CountChat(const std::string& user_message) = 0;
  // That rendered text, for completions endpoints; Unimplemented when it cannot be rendered.
  virtual StatusOr<std::string> RenderChat(const std::string& user_message) = 0;
  // "the server's /tokenize" or "approximate (4 bytes a token)", for logs and the result.
  virtual std::string Name() const = 0;
  virtual bool exact() const = 0;
};

// ceil(bytes / 4) tokens (a rough average of BPE tokenizers on English text); the chat
// template is not counted and cannot be rendered.
class ApproxTokenizer : public PromptTokenizer {
 public:
  static int64_t Estimate(const std::string& text) {
    return static_cast<int64_t>((text.size() + 3) / 4);
  }
  StatusOr<int64_t> Count(const std::string& text) override { return Estimate(text); }
  StatusOr<int64_t> CountChat(const std::string& user_message) override {
    return Estimate(user_message);
  }
  StatusOr<std::string> RenderChat(const std::string&) override {
    return Unimplemented("approximate token counts cannot render a chat template");
  }
  std::string Name() const override { return "approximate (4 bytes a token)"; }
  bool exact() const override { return false; }
};

class ServerTokenizer : public PromptTokenizer {
 public:
  // `client` must outlive this object.
  ServerTokenizer(BenchClient* client, std::string model)
      : client_(client), model_(std::move(model)) {}
  StatusOr<int64_t> Count(const std::string& text) override;
  StatusOr<int64_t> CountChat(const std::string& user_message) override;
  StatusOr<std::string> RenderChat(const std::string& user_message) override;
  std::string Name() const override { return "the server's /tokenize"; }
  bool exact() const override { return true; }

 private:
  BenchClient* client_;
  std::string model_;
};

enum class TokenCounting { kAuto, kServer, kApprox };
StatusOr<TokenCounting> ParseTokenCounting(const std::string& text);

// kServer: a ServerTokenizer, after one probe request (an error if it fails); kApprox: an
// ApproxTokenizer; kAuto: the server's when the probe succeeds, else the approximation with
// `*note` saying why.
StatusOr<std::unique_ptr<PromptTokenizer>> MakePromptTokenizer(TokenCounting mode,
                                                               BenchClient* client,
                                                               const std::string& model,
                                                               std::string* note);

}  // namespace oasis::loadgen
