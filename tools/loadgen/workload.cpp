// Benchmark workloads: see workload.h.
#include "tools/loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace oasis::loadgen {

namespace {

// Common English words that most BPE vocabularies encode as one token each (with their
// leading space), so a prompt of N words is roughly N tokens.
// clang-format off
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",    "she",   "other",
    "its",   "may",   "these", "what",  "them",  "than",  "some",  "him",   "time",  "into",
    "only",  "do",    "first", "any",   "my",    "now",   "such",  "like",  "our",   "over",
    "man",   "me",    "even",  "most",  "made",  "after", "also",  "well",  "did",   "many",
    "before", "must", "through", "back", "years", "where", "much", "your",  "way",   "down",
    "should", "because", "each", "just", "those", "people", "how", "too",  "little", "state",
    "good",  "very",  "make",  "world", "still", "own",   "see",   "men",   "work",  "long",
    "get",   "here",  "between", "both", "life", "being", "under", "never", "day",   "same",
    "another", "know", "while", "last", "might", "us",    "great", "old",   "year",  "off",
    "come",  "since", "against", "go",  "came",  "right", "used",  "take",  "three", "house",
};
// clang-format on
constexpr int64_t kNumWords = static_cast<int64_t>(sizeof(kWords) / sizeof(kWords[0]));

int64_t LowerBound(int64_t len, double ratio) {
  return static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - ratio)));
}
int64_t UpperBound(int64_t len, double ratio) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + ratio)));
}

void AppendRandomTokens(std::mt19937_64& rng, int64_t n, PromptForm form, int64_t vocab_size,
                        Prompt* p) {
  if (form == PromptForm::kTokenIds) {
    for (int64_t i = 0; i < n; ++i) p->token_ids.push_back(UniformInt(rng, 0, vocab_size - 1));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      if (!p->text.empty()) p->text.push_back(' ');
      p->text += kWords[UniformInt(rng, 0, kNumWords - 1)];
    }
  }
  p->prompt_len += n;
}
void AppendRandomTokens(std::mt19937_64& rng, int64_t n, const RandomWorkloadOptions& o,
                        Prompt* p) {
  AppendRandomTokens(rng, n, o.form, o.vocab_size, p);
}

// `n` random words (the chat form of n tokens), separated by spaces.
std::string RandomWords(std::mt19937_64& rng, int64_t n) {
  Prompt p;
  AppendRandomTokens(rng, n, PromptForm::kText, 0, &p);
  return std::move(p.text);
}

}  // namespace

int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(rng());  // the whole 64-bit range
  // Rejection sampling: no modulo bias.
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % span;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return lo + static_cast<int64_t>(x % span);
}

double UniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

StatusOr<std::vector<Prompt>> MakeRandomWorkload(const RandomWorkloadOptions& o) {
  OASIS_RETURN_IF_ERROR(CheckRandomWorkloadOptions(o));
  std::mt19937_64 rng(o.seed);
  Prompt prefix;
  AppendRandomTokens(rng, o.prefix_len, o, &prefix);
  std::vector<Prompt> prompts;
  prompts.reserve(static_cast<size_t>(o.num_prompts));
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    int64_t in = UniformInt(rng, LowerBound(o.input_len, o.range_ratio),
                            UpperBound(o.input_len, o.range_ratio));
    if (in + o.prefix_len == 0) in = 1;  // never send an empty prompt
    const int64_t out =
        std::max<int64_t>(1, UniformInt(rng, LowerBound(o.output_len, o.range_ratio),
                                        UpperBound(o.output_len, o.range_ratio)));
    Prompt p = prefix;
    AppendRandomTokens(rng, in, o, &p);
    p.output_len = out;
    prompts.push_back(std::move(p));
  }
  return prompts;
}

Status CheckRandomWorkloadOptions(const RandomWorkloadOptions& o) {
  if (o.num_prompts <= 0) return InvalidArgument("--num-prompts must be positive");
  if (o.input_len < 0 || o.prefix_len < 0) {
    return InvalidArgument("--random-input-len and --random-prefix-len must be >= 0");
  }
  if (o.output_len <= 0) return InvalidArgument("--random-output-len must be positive");
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return InvalidArgument("--random-range-ratio must be in [0, 1)");
  }
  if (o.form == PromptForm::kTokenIds && o.vocab_size <= 0) {
    return InvalidArgument("--random-vocab-size must be positive");
  }
  if (o.prefix_len == 0 && o.input_len == 0) {
    return InvalidArgument("random prompts would be empty: --random-input-len is 0");
  }
  // Every prompt is held in memory (the prefix copied into each): at most kMaxWorkloadTokens in
  // all (larger asks threw std::bad_alloc).
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (o.num_prompts > kMaxPrompts) {
    return InvalidArgument("--num-prompts " + n(o.num_prompts) + " is too large: at most " +
                           n(kMaxPrompts));
  }
  if (o.input_len > kMaxWorkloadTokens || o.prefix_len > kMaxWorkloadTokens ||
      o.output_len > kMaxWorkloadTokens) {
    return InvalidArgument(
        "--random-input-len, --random-prefix-len and --random-output-len must be at most 2^28 "
        "tokens (got " +
        n(o.input_len) + ", " + n(o.prefix_len) + ", " + n(o.output_len) + ")");
  }
  const int64_t per_prompt = o.prefix_len + UpperBound(o.input_len, o.range_ratio);
  if (per_prompt > kMaxWorkloadTokens / o.num_prompts) {
    return InvalidArgument(
        "the random workload is too large: " + n(o.num_prompts) +
        " prompts of up to --random-prefix-len + --random-input-len = " + n(per_prompt) +
        " tokens would hold more than 2^28 tokens; ask for fewer or shorter prompts");
  }
  return Status::Ok();
}

Status CheckMultiTurnOptions(const MultiTurnWorkloadOptions& o) {
  const auto n = [](int64_t v) { return std::to_string(v); };
  if (o.num_conversations <= 0) {
    return InvalidArgument("--multi-turn-conversations must be positive (got " +
                           n(o.num_conversations) + ")");
  }
  if (o.num_turns <= 0) {
    return InvalidArgument("--multi-turn-turns must be positive (got " + n(o.num_turns) + ")");
  }
  if (o.first_len <= 0) {
    return InvalidArgument("--multi-turn-first-len must be positive (got " + n(o.first_len) + ")");
  }
  if (o.output_len <= 0) {
    return InvalidArgument(
        "the output length (--random-output-len / --output-len) must be positive (got " +
        n(o.output_len) + ")");
  }
  if (o.prefix_len < 0) {
    return InvalidArgument("--multi-turn-prefix-len must be >= 0 (got " + n(o.prefix_len) + ")");
  }
  if (o.prefix_len >= o.first_len) {
    return InvalidArgument(
        "--multi-turn-prefix-len (--prefix-len) " + n(o.prefix_len) +
        " must be less than --multi-turn-first-len " + n(o.first_len) +
        ": turn 1's prompt is the shared system prompt and at least one token of the "
        "conversation's own");
  }
  if (o.increment_len <= 0) {
    return InvalidArgument("--multi-turn-increment-len must be positive (got " +
                           n(o.increment_len) + ")");
  }
  if (o.num_turns > 1 && o.increment_len < o.output_len) {
    return InvalidArgument(
        "--multi-turn-increment-len " + n(o.increment_len) + " is less than the output length " +
        n(o.output_len) + ": each later turn appends the previous turn's reply (" +
        n(o.output_len) + " tokens) and a new user message, so it must be >= the output length");
  }
  if (o.form == PromptForm::kTokenIds && o.vocab_size <= 0) {
    return InvalidArgument("--random-vocab-size must be positive");
  }
  // The last turn's prompt, first_len + (num_turns - 1) * increment_len, without overflow.
  const int64_t later = o.num_turns - 1;
  const bool too_long = later > 0 && later > (kMaxWorkloadTokens - o.first_len) / o.increment_len;
  const int64_t last_len = too_long ? kMaxWorkloadTokens : o.first_len + later * o.increment_len;
  if (too_long || last_len > kMaxWorkloadTokens / o.num_conversations) {
    return InvalidArgument(
        "the multi-turn workload is too large: " + n(o.num_conversations) +
        " conversations whose last turn is --multi-turn-first-len + (--multi-turn-turns - 1) * "
        "--multi-turn-increment-len tokens would hold more than 2^28 tokens; ask for fewer or "
        "shorter conversations");
  }
  return Status::Ok();
}

StatusOr<std::vector<MultiTurnConversation>> MakeMultiTurnWorkload(
    const MultiTurnWorkloadOptions& o) {
  OASIS_RETURN_IF_ERROR(CheckMultiTurnOptions(o));
  const int64_t last_len = o.first_len + (o.num_turns - 1) * o.increment_len;
  std::mt19937_64 rng(o.seed);
  const bool chat = o.form == PromptForm::kText;
  Prompt system;  // the shared system prompt
  if (chat) {
    if (o.prefix_len > 0) system.messages.push_back({"system", RandomWords(rng, o.prefix_len)});
    system.prompt_len = o.prefix_len;
  } else {
    AppendRandomTokens(rng, o.prefix_len, o.form, o.vocab_size, &system);
  }
  std::vector<MultiTurnConversation> conversations(static_cast<size_t>(o.num_conversations));
  for (MultiTurnConversation& c : conversations) {
    Prompt& p = c.last;
    p = system;
    p.output_len = o.output_len;
    if (!chat) p.token_ids.reserve(static_cast<size_t>(last_len));
    const auto append = [&](const char* role, int64_t tokens) {
      if (chat) {
        p.messages.push_back({role, RandomWords(rng, tokens)});
        p.prompt_len += tokens;
      } else {
        AppendRandomTokens(rng, tokens, o.form, o.vocab_size, &p);
      }
    };
    append("user", o.first_len - o.prefix_len);
    c.turn_lens.push_back(p.prompt_len);
    c.turn_messages.push_back(p.messages.size());
    for (int64_t t = 1; t < o.num_turns; ++t) {
      append("assistant", o.output_len);  // the previous turn's reply, as long as it was asked
      append("user", o.increment_len - o.output_len);
      c.turn_lens.push_back(p.prompt_len);
      c.turn_messages.push_back(p.messages.size());
    }
  }
  return conversations;
}

Prompt TurnPrompt(const MultiTurnConversation& c, int64_t turn) {
  const auto t = static_cast<size_t>(turn);
  Prompt p;
  p.output_len = c.last.output_len;
  p.prompt_len = c.turn_lens.at(t);
  if (!c.last.messages.empty()) {
    p.messages.assign(c.last.messages.begin(),
                      c.last.messages.begin() + static_cast<std::ptrdiff_t>(c.turn_messages.at(t)));
  } else if (!c.last.token_ids.empty()) {
    p.token_ids.assign(c.last.token_ids.begin(),
                       c.last.token_ids.begin() + static_cast<std::ptrdiff_t>(p.prompt_len));
  }
  return p;
}

StatusOr<std::vector<Prompt>> ReadJsonlWorkload(const std::filesystem::path& path,
                                                int64_t num_prompts, int64_t default_output_len) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open --dataset-path " + path.string());
  std::vector<Prompt> lines;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string where = path.string() + ":" + std::to_string(line_no) + ": ";
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + "not a JSON object");
    Prompt p;
    const auto prompt = j.find("prompt");
    if (prompt == j.end()) return InvalidArgument(where + "no \"prompt\"");
    if (prompt->is_string()) {
      p.text = prompt->get<std::string>();
      if (p.text.empty()) return InvalidArgument(where + "empty prompt");
      // Rough estimate until the server's usage says better: ~4 bytes a token.
      p.prompt_len = static_cast<int64_t>((p.text.size() + 3) / 4);
    } else if (prompt->is_array() && !prompt->empty()) {
      for (const auto& id : *prompt) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0) {
          return InvalidArgument(where + "\"prompt\" must be a string or a list of token ids");
        }
        p.token_ids.push_back(id.get<int64_t>());
      }
      p.prompt_len = static_cast<int64_t>(p.token_ids.size());
    } else {
      return InvalidArgument(where + "\"prompt\" must be a non-empty string or list of token ids");
    }
    p.output_len = default_output_len;
    for (const char* key : {"output_len", "max_tokens"}) {
      if (const auto it = j.find(key); it != j.end()) {
        if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
          return InvalidArgument(where + "\"" + key + "\" must be a positive integer");
        }
        p.output_len = it->get<int64_t>();
      }
    }
    if (p.output_len <= 0) return InvalidArgument(where + "no output length and no default");
    lines.push_back(std::move(p));
  }
  if (lines.empty()) return InvalidArgument(path.string() + ": no prompts");
  if (num_prompts <= 0) return lines;
  std::vector<Prompt> prompts;
  prompts.reserve(static_cast<size_t>(num_prompts));
  for (int64_t i = 0; i < num_prompts; ++i) prompts.push_back(lines[i % lines.size()]);
  return prompts;
}

}  // namespace oasis::loadgen
