// PromptTokenizer: see prompt_tokenizer.h.
#include "tools/loadgen/prompt_tokenizer.h"

#include <nlohmann/json.hpp>

namespace oasis::loadgen {

using nlohmann::json;

namespace {

json UserMessages(const std::string& user_message) {
  return json::array({{{"role", "user"}, {"content", user_message}}});
}

// {"count": n} (oasis-server, vLLM), else the length of {"tokens": [...]}.
StatusOr<json> Tokenize(BenchClient* client, const json& body) {
  StatusOr<json> answer = client->PostJson("/tokenize", body);
  if (!answer.ok()) return answer.status();
  const auto tokens = answer->find("tokens");
  if (!answer->is_object() || tokens == answer->end() || !tokens->is_array()) {
    return InvalidArgument("POST /tokenize: the answer has no \"tokens\" list");
  }
  return answer;
}

int64_t TokenCount(const json& answer) {
  const auto count = answer.find("count");
  if (count != answer.end() && count->is_number_integer()) return count->get<int64_t>();
  return static_cast<int64_t>(answer["tokens"].size());
}

}  // namespace

StatusOr<int64_t> ServerTokenizer::Count(const std::string& text) {
  StatusOr<json> answer = Tokenize(client_, {{"model", model_}, {"prompt", text}});
  if (!answer.ok()) return answer.status();
  return TokenCount(*answer);
}

StatusOr<int64_t> ServerTokenizer::CountChat(const std::string& user_message) {
  StatusOr<json> answer = Tokenize(client_, {{"model", model_},
                                             {"messages", UserMessages(user_message)},
                                             {"add_generation_prompt", true}});
  if (!answer.ok()) return answer.status();
  return TokenCount(*answer);
}

StatusOr<std::string> ServerTokenizer::RenderChat(const std::string& user_message) {
  StatusOr<json> answer = Tokenize(client_, {{"model", model_},
                                             {"messages", UserMessages(user_message)},
                                             {"add_generation_prompt", true}});
  if (!answer.ok()) return answer.status();
  StatusOr<json> text =
      client_->PostJson("/detokenize", {{"model", model_}, {"tokens", (*answer)["tokens"]}});
  if (!text.ok()) return text.status();
  const auto prompt = text->find("prompt");
  if (!text->is_object() || prompt == text->end() || !prompt->is_string()) {
    return InvalidArgument("POST /detokenize: the answer has no \"prompt\" string");
  }
  return prompt->get<std::string>();
}

StatusOr<TokenCounting> ParseTokenCounting(const std::string& text) {
  if (text == "auto") return TokenCounting::kAuto;
  if (text == "server") return TokenCounting::kServer;
  if (text == "approx") return TokenCounting::kApprox;
  return InvalidArgument("--token-count must be auto, server or approx, not '" + text + "'");
}

StatusOr<std::unique_ptr<PromptTokenizer>> MakePromptTokenizer(TokenCounting mode,
                                                               BenchClient* client,
                                                               const std::string& model,
                                                               std::string* note) {
  if (mode == TokenCounting::kApprox) return std::unique_ptr<PromptTokenizer>(new ApproxTokenizer);
  auto server = std::make_unique<ServerTokenizer>(client, model);
  const StatusOr<int64_t> probe = server->Count("Hello");
  if (probe.ok()) return std::unique_ptr<PromptTokenizer>(std::move(server));
  if (mode == TokenCounting::kServer) {
    return probe.status().WithContext("--token-count server: the server cannot tokenize");
  }
  *note = "the server cannot tokenize (" + probe.status().message() +
          "): token lengths are approximated as 4 bytes a token";
  return std::unique_ptr<PromptTokenizer>(new ApproxTokenizer);
}

}  // namespace oasis::loadgen
