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

void AppendRandomTokens(std::mt19937_64& rng, int64_t n, const RandomWorkloadOptions& o,
                        Prompt* p) {
  if (o.form == PromptForm::kTokenIds) {
    for (int64_t i = 0; i < n; ++i) p->token_ids.push_back(UniformInt(rng, 0, o.vocab_size - 1));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      if (!p->text.empty()) p->text.push_back(' ');
      p->text += kWords[UniformInt(rng, 0, kNumWords - 1)];
    }
  }
  p->prompt_len += n;
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
