#include "runner/logits_processing.h"

#include <algorithm>

#include "oasis/logits_penalty.h"

namespace oasis {

std::shared_ptr<const LogitsProcessing> LogitsProcessing::For(const SamplingParams& params,
                                                              int64_t min_tokens,
                                                              std::vector<int32_t> stop_ids) {
  const bool min_tokens_mask = min_tokens > 0 && !stop_ids.empty();
  if (!params.processes_logits() && !min_tokens_mask) return nullptr;
  auto p = std::make_shared<LogitsProcessing>();
  p->presence_penalty = params.presence_penalty;
  p->frequency_penalty = params.frequency_penalty;
  p->repetition_penalty = params.repetition_penalty;
  // One bias per token: the last one given wins (as a JSON object's repeated key).
  for (const auto& [token, bias] : params.logit_bias) {
    auto it = std::find_if(p->logit_bias.begin(), p->logit_bias.end(),
                           [t = token](const auto& e) { return e.first == t; });
    if (it != p->logit_bias.end()) {
      it->second = bias;
    } else {
      p->logit_bias.emplace_back(token, bias);
    }
  }
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  p->allowed_token_ids = params.allowed_token_ids;
  std::sort(p->allowed_token_ids.begin(), p->allowed_token_ids.end());
  p->allowed_token_ids.erase(std::unique(p->allowed_token_ids.begin(), p->allowed_token_ids.end()),
                             p->allowed_token_ids.end());
  for (const std::vector<int32_t>& word : params.bad_words_token_ids) {
    if (!word.empty()) p->bad_words.push_back(word);
  }
  p->constraint = params.constraint;
  if (min_tokens_mask) {
    p->min_tokens = min_tokens;
    std::sort(stop_ids.begin(), stop_ids.end());
    stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
    p->min_tokens_stop_ids = std::move(stop_ids);
  }
  return p;
}

std::vector<LogitsEntry> RowEntries(const LogitsProcessing& p, std::span<const int32_t> output,
                                    std::span<const int32_t> draft) {
  std::vector<LogitsEntry> entries;
  entries.reserve(p.logit_bias.size());
  for (const auto& [token, bias] : p.logit_bias) entries.push_back({token, bias, false});
  auto mask = [&entries](int32_t token) { entries.push_back({token, 0.0f, true}); };
  const size_t n = output.size() + draft.size();
  // The k-th generated token from the end (k >= 1).
  auto from_end = [&](size_t k) {
    return k <= draft.size() ? draft[draft.size() - k] : output[n - k];
  };
  for (const std::vector<int32_t>& word : p.bad_words) {
    const size_t prefix = word.size() - 1;
    if (prefix > n) continue;
    bool match = true;
    for (size_t j = 0; j < prefix && match; ++j) match = word[prefix - 1 - j] == from_end(j + 1);
    if (match) mask(word.back());
  }
  if (static_cast<int64_t>(n) < p.min_tokens) {
    for (int32_t token : p.min_tokens_stop_ids) mask(token);
  }
  // One entry per token (stable: a token's bias comes first, then its masks).
  std::stable_sort(entries.begin(), entries.end(),
                   [](const LogitsEntry& a, const LogitsEntry& b) { return a.token < b.token; });
  size_t out = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (out > 0 && entries[out - 1].token == entries[i].token) {
      entries[out - 1].bias += entries[i].bias;
      entries[out - 1].masked = entries[out - 1].masked || entries[i].masked;
    } else {
      entries[out++] = entries[i];
    }
  }
  entries.resize(out);
  if (p.constraint == nullptr) return entries;
  // The constraint's masks (sorted), merged in: a row in a JSON structure masks most of the
  // vocabulary.
  std::vector<int32_t> masked;
  p.constraint->Masked(output, draft, &masked);
  if (masked.empty()) return entries;
  std::vector<LogitsEntry> merged;
  merged.reserve(entries.size() + masked.size());
  size_t e = 0;
  for (int32_t token : masked) {
    while (e < entries.size() && entries[e].token < token) merged.push_back(entries[e++]);
    if (e < entries.size() && entries[e].token == token) {
      merged.push_back(entries[e++]);
      merged.back().masked = true;
    } else {
      merged.push_back({token, 0.0f, true});
    }
  }
  while (e < entries.size()) merged.push_back(entries[e++]);
  return merged;
}

void ApplyLogitsProcessing(const float* logits, int64_t vocab, const LogitsProcessing& p,
                           std::span<const int32_t> prompt, std::span<const int32_t> output,
                           std::span<const int32_t> draft, float* out) {
  const auto V = static_cast<size_t>(vocab);
  auto in_vocab = [vocab](int32_t t) { return t >= 0 && t < vocab; };
  std::vector<int32_t> counts;
  std::vector<uint8_t> in_prompt, allowed;
  if (p.has_penalties()) {
    counts.assign(V, 0);
    for (std::span<const int32_t> part : {output, draft}) {
      for (int32_t t : part) {
        if (in_vocab(t)) ++counts[static_cast<size_t>(t)];
      }
    }
  }
  if (p.repetition_penalty != 1.0f) {
    in_prompt.assign(V, 0);
    for (int32_t t : prompt) {
      if (in_vocab(t)) in_prompt[static_cast<size_t>(t)] = 1;
    }
  }
  if (!p.allowed_token_ids.empty()) {
    allowed.assign(V, 0);
    for (int32_t t : p.allowed_token_ids) {
      if (in_vocab(t)) allowed[static_cast<size_t>(t)] = 1;
    }
  }
  const std::vector<LogitsEntry> entries = RowEntries(p, output, draft);
  size_t e = 0;
  for (size_t i = 0; i < V; ++i) {
    while (e < entries.size() && entries[e].token < static_cast<int64_t>(i)) ++e;
    const bool has_entry = e < entries.size() && entries[e].token == static_cast<int64_t>(i);
    const bool masked = (!allowed.empty() && allowed[i] == 0) || (has_entry && entries[e].masked);
    out[i] = ProcessLogit(logits[i], masked, has_entry ? entries[e].bias : 0.0f,
                          counts.empty() ? 0 : counts[i], !in_prompt.empty() && in_prompt[i] != 0,
                          p.repetition_penalty, p.frequency_penalty, p.presence_penalty);
  }
}

}  // namespace oasis
