// Benchmark workloads: the prompts to send and the output length asked of each.
//
// - Random (like vllm bench serve's "random" dataset): every prompt is `prefix_len` shared
//   tokens followed by its own random tokens; its input and output lengths are drawn
//   uniformly from [floor(len * (1 - range_ratio)), ceil(len * (1 + range_ratio))]. Prompts
//   are token-id lists (for /v1/completions), or random English words for endpoints that
//   take text (chat); a word is about one token. The same options and seed give the same
//   workload on every platform (mt19937_64 with our own range reduction).
// - Multi-turn (like vLLM's benchmarks/multi_turn): conversations whose every turn resends the
//   whole history. Turn 1's prompt is `first_len` tokens: a system prompt of `prefix_len`
//   tokens shared by all conversations, then the conversation's own tokens; every later turn
//   appends `increment_len` tokens — a synthetic assistant reply of the previous turn's output
//   length, then a new user message filling the rest — so turn t's prompt begins with turn
//   t-1's prompt exactly. Token ids for /v1/completions, or chat messages of random words
//   (system, user, assistant, user, ...) for chat, from the random generator above.
// - JSONL: one JSON object a line, {"prompt": "text" | [ids], "output_len"?: n} ("max_tokens"
//   is accepted for "output_len"); lines are used in order and reused cyclically when more
//   prompts are asked for than the file has.
//
// Pure functions returning values; thread-compatible.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "oasis/status.h"

namespace oasis::loadgen {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
  bool operator==(const ChatMessage&) const = default;
};

struct Prompt {
  std::vector<int64_t> token_ids;     // the prompt as token ids, when it is one
  std::string text;                   // the prompt as text, when it is one (token_ids empty)
  std::vector<ChatMessage> messages;  // the prompt as chat messages (chat only; text empty)
  int64_t prompt_len = 0;             // its length in tokens: exact for ids, estimated for text
  int64_t output_len = 0;             // max_tokens to ask for
};

enum class PromptForm { kTokenIds, kText };

// The most tokens (ids or words) a synthetic workload (random, multi-turn) may hold in memory
// (2 GiB of ids), and the most prompts of any workload (--num-prompts, --num-warmups: past it
// they no longer fit memory; 99999999999999 threw std::bad_alloc).
inline constexpr int64_t kMaxWorkloadTokens = int64_t{1} << 28;
inline constexpr int64_t kMaxPrompts = int64_t{1} << 24;

struct RandomWorkloadOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  int64_t prefix_len = 0;
  int64_t vocab_size = 32000;  // token ids are drawn from [0, vocab_size)
  uint64_t seed = 0;
  PromptForm form = PromptForm::kTokenIds;
};

StatusOr<std::vector<Prompt>> MakeRandomWorkload(const RandomWorkloadOptions& options);
// MakeRandomWorkload's checks alone (before the server is asked anything): positive counts,
// at most kMaxPrompts prompts and kMaxWorkloadTokens tokens in all.
Status CheckRandomWorkloadOptions(const RandomWorkloadOptions& options);

struct MultiTurnWorkloadOptions {
  int64_t num_conversations = 8;
  int64_t num_turns = 4;
  int64_t first_len = 1024;     // turn 1's prompt tokens, the shared system prompt included
  int64_t increment_len = 256;  // tokens each later turn appends (>= output_len)
  int64_t output_len = 128;     // max_tokens of every turn
  int64_t prefix_len = 0;       // the system prompt shared by all conversations (< first_len)
  int64_t vocab_size = 32000;
  uint64_t seed = 0;
  PromptForm form = PromptForm::kTokenIds;
};

// One conversation, stored as its last turn's prompt (every earlier turn's is a prefix of it)
// and where each turn's prompt ends in it.
struct MultiTurnConversation {
  Prompt last;
  std::vector<int64_t> turn_lens;     // prompt tokens of turn 1, 2, ...
  std::vector<size_t> turn_messages;  // chat form: messages of turn 1, 2, ...
  int64_t num_turns() const { return static_cast<int64_t>(turn_lens.size()); }
};

// InvalidArgument naming the flag at fault when `options` are out of range or contradict
// each other; checked by MakeMultiTurnWorkload too.
Status CheckMultiTurnOptions(const MultiTurnWorkloadOptions& options);

// Every conversation of the workload, or CheckMultiTurnOptions's error.
StatusOr<std::vector<MultiTurnConversation>> MakeMultiTurnWorkload(
    const MultiTurnWorkloadOptions& options);

// The prompt of turn `turn` (0-based) of `c`.
Prompt TurnPrompt(const MultiTurnConversation& c, int64_t turn);

// Reads `path`; prompts without an output length get `default_output_len`. num_prompts <= 0
// takes every line once.
StatusOr<std::vector<Prompt>> ReadJsonlWorkload(const std::filesystem::path& path,
                                                int64_t num_prompts, int64_t default_output_len);

// Uniform integer in [lo, hi] (inclusive), the same on every platform.
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi);
// Uniform double in [0, 1) with 53 random bits.
double UniformUnit(std::mt19937_64& rng);

}  // namespace oasis::loadgen
