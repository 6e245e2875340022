// vLLM's text datasets (vllm bench serve --dataset-name sharegpt | sonnet | custom), built
// the way vLLM builds them, with token lengths from a PromptTokenizer (the server's /tokenize,
// or an approximation) instead of a local HF tokenizer:
//
// - ShareGPT: a JSON list of {"id", "conversations": [{"from", "value"}, ...]}. Entries with
//   fewer than two turns are skipped; the order is shuffled with the seed; turn 0 is the prompt
//   and turn 1's token length the output length (or the fixed --sharegpt-output-len); pairs
//   with a prompt under 4 tokens, an output under 4 (unless fixed), a prompt over 1024 or both
//   over 2048 are pruned; too few usable pairs are topped up by random choices among them.
// - Sonnet: a text file of poem lines. Every prompt is the instruction "Pick as many lines as
//   you can from these poem lines:\n", the first lines of the file (about prefix_len tokens,
//   shared by all prompts) and random lines up to about input_len tokens; a prompt whose chat
//   rendering is longer than input_len is drawn again. On completions endpoints the prompt is
//   sent rendered by the chat template, on chat endpoints as the user message.
// - Custom: JSONL prompts (workload.h's reader) shuffled with the seed, rendered by the chat
//   template for completions endpoints unless told not to.
//
// Functions over values; thread-compatible (the tokenizer is used from the calling thread).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "oasis/status.h"
#include "tools/loadgen/prompt_tokenizer.h"
#include "tools/loadgen/workload.h"

namespace oasis::loadgen {

// ---- ShareGPT ---------------------------------------------------------------------------------

struct ShareGptPair {
  std::string id;          // the entry's "id" ("" when none), for messages
  std::string prompt;      // turn 0's "value"
  std::string completion;  // turn 1's "value"
};

struct ShareGptFile {
  std::vector<ShareGptPair> pairs;  // in file order
  int64_t entries = 0;              // entries in the list
  int64_t skipped = 0;              // without "conversations" or with fewer than two turns
};

// Parses the file's text; `name` (the path) prefixes errors: not JSON (with the byte offset),
// not a list, an entry that is not an object, "conversations" not a list, turn 0 or 1 without
// a string "value".
StatusOr<ShareGptFile> ParseShareGpt(const std::string& text, const std::string& name);

struct ShareGptOptions {
  int64_t num_prompts = 1000;         // <= 0: every usable pair once
  std::optional<int64_t> output_len;  // --sharegpt-output-len: fixed, skips the min check
  uint64_t seed = 0;
  bool shuffle = true;     // false: --disable-shuffle
  bool oversample = true;  // false: --no-oversample (fewer prompts than asked may come back)
};

struct ShareGptStats {
  int64_t pruned = 0;  // pairs dropped for their lengths
  int64_t usable = 0;  // pairs kept before oversampling
};

// vLLM's length filter (benchmarks' is_valid_sequence with its defaults).
bool IsValidShareGptPair(int64_t prompt_len, int64_t output_len, bool fixed_output_len);

StatusOr<std::vector<Prompt>> SampleShareGpt(const ShareGptFile& file,
                                             const ShareGptOptions& options,
                                             PromptTokenizer* tokenizer, ShareGptStats* stats);

// Reads and samples `path`.
StatusOr<std::vector<Prompt>> ReadShareGptWorkload(const std::filesystem::path& path,
                                                   const ShareGptOptions& options,
                                                   PromptTokenizer* tokenizer,
                                                   ShareGptStats* stats);

// ---- Sonnet -----------------------------------------------------------------------------------

inline constexpr const char* kSonnetInstruction =
    "Pick as many lines as you can from these poem lines:\n";

struct SonnetOptions {
  int64_t num_prompts = 1000;
  int64_t input_len = 550;  // vLLM's defaults
  int64_t prefix_len = 200;
  int64_t output_len = 150;
  uint64_t seed = 0;
  bool render_chat = false;  // completions endpoint: send the chat-rendered prompt (vLLM)
};

struct SonnetStats {
  double avg_line_tokens = 0;
  int64_t base_offset = 0;  // tokens of the instruction alone, rendered as a chat message
  int64_t num_input_lines = 0;
  int64_t num_prefix_lines = 0;
  int64_t redrawn = 0;    // prompts drawn again for being longer than input_len
  bool rendered = false;  // prompts were sent rendered by the chat template
};

// The file's lines, each with its "\n" (as Python's readlines; a last line without one gets
// it). Empty files are an error.
StatusOr<std::vector<std::string>> ReadPoemLines(const std::filesystem::path& path);

StatusOr<std::vector<Prompt>> MakeSonnetWorkload(const std::vector<std::string>& lines,
                                                 const SonnetOptions& options,
                                                 PromptTokenizer* tokenizer, SonnetStats* stats);

// ---- Custom (vLLM's JSONL with "prompt") -------------------------------------------------------

struct CustomOptions {
  int64_t num_prompts = 1000;  // <= 0: every line once
  uint64_t seed = 0;
  bool shuffle = true;
  bool oversample = true;
  bool render_chat = false;  // completions endpoint without --skip-chat-template
};

// `lines`: ReadJsonlWorkload(path, 0, output_len)'s prompts. Text prompts get their token
// length from `tokenizer` (after rendering, when asked).
StatusOr<std::vector<Prompt>> MakeCustomWorkload(std::vector<Prompt> lines,
                                                 const CustomOptions& options,
                                                 PromptTokenizer* tokenizer);

}  // namespace oasis::loadgen
