// vLLM's text datasets: see text_datasets.h.
#include "tools/loadgen/text_datasets.h"

#include <cfenv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace oasis::loadgen {

using nlohmann::json;

namespace {

// vLLM's pruning limits (is_valid_sequence's defaults).
constexpr int64_t kMinLen = 4;
constexpr int64_t kMaxPromptLen = 1024;
constexpr int64_t kMaxTotalLen = 2048;

// Consecutive over-long sonnet prompts after which the lengths are declared impossible.
constexpr int64_t kMaxRedraws = 1000;

void Shuffle(std::vector<size_t>* order, std::mt19937_64& rng) {
  for (size_t i = order->size(); i > 1; --i) {
    std::swap((*order)[i - 1], (*order)[UniformInt(rng, 0, static_cast<int64_t>(i) - 1)]);
  }
}

// Tops `prompts` up to `n` by random choices among them (vLLM's maybe_oversample_requests).
void Oversample(std::vector<Prompt>* prompts, int64_t n, std::mt19937_64& rng) {
  const auto have = static_cast<int64_t>(prompts->size());
  for (int64_t i = have; i < n; ++i) prompts->push_back((*prompts)[UniformInt(rng, 0, have - 1)]);
}

StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open --dataset-path " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string EntryName(size_t index, const json& entry) {
  std::string name = "entry " + std::to_string(index);
  const auto id = entry.find("id");
  if (id != entry.end())
    name += " (id " + (id->is_string() ? id->get<std::string>() : id->dump()) + ")";
  return name;
}

// Python's round(): to the nearest integer, ties to even.
int64_t RoundHalfEven(double v) {
  const int previous = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double r = std::nearbyint(v);
  std::fesetround(previous);
  return static_cast<int64_t>(r);
}

}  // namespace

// ---- ShareGPT ---------------------------------------------------------------------------------

StatusOr<ShareGptFile> ParseShareGpt(const std::string& text, const std::string& name) {
  json list;
  try {
    list = json::parse(text);
  } catch (const json::parse_error& e) {
    return InvalidArgument(name + ": not valid JSON (byte " + std::to_string(e.byte) +
                           "): " + e.what());
  }
  if (!list.is_array()) {
    return InvalidArgument(name + ": a ShareGPT file is a JSON list of conversations");
  }
  ShareGptFile file;
  file.entries = static_cast<int64_t>(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& entry = list[i];
    if (!entry.is_object()) {
      return InvalidArgument(name + ": entry " + std::to_string(i) + " is not a JSON object");
    }
    const auto conversations = entry.find("conversations");
    if (conversations == entry.end()) {
      ++file.skipped;
      continue;
    }
    if (!conversations->is_array()) {
      return InvalidArgument(name + ": " + EntryName(i, entry) +
                             ": \"conversations\" is not a list");
    }
    if (conversations->size() < 2) {
      ++file.skipped;
      continue;
    }
    ShareGptPair pair;
    if (const auto id = entry.find("id"); id != entry.end() && id->is_string()) pair.id = *id;
    for (int turn = 0; turn < 2; ++turn) {
      const json& t = (*conversations)[turn];
      const auto value = t.is_object() ? t.find("value") : t.end();
      if (!t.is_object() || value == t.end() || !value->is_string()) {
        return InvalidArgument(name + ": " + EntryName(i, entry) + ": turn " +
                               std::to_string(turn) + " has no string \"value\"");
      }
      (turn == 0 ? pair.prompt : pair.completion) = value->get<std::string>();
    }
    file.pairs.push_back(std::move(pair));
  }
  return file;
}

bool IsValidShareGptPair(int64_t prompt_len, int64_t output_len, bool fixed_output_len) {
  const bool prompt_too_short = prompt_len < kMinLen;
  const bool output_too_short = !fixed_output_len && output_len < kMinLen;
  const bool prompt_too_long = prompt_len > kMaxPromptLen;
  const bool total_too_long = prompt_len + output_len > kMaxTotalLen;
  return !(prompt_too_short || output_too_short || prompt_too_long || total_too_long);
}

StatusOr<std::vector<Prompt>> SampleShareGpt(const ShareGptFile& file, const ShareGptOptions& o,
                                             PromptTokenizer* tokenizer, ShareGptStats* stats) {
  if (o.output_len && *o.output_len <= 0) {
    return InvalidArgument("--sharegpt-output-len must be positive");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<size_t> order(file.pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (o.shuffle) Shuffle(&order, rng);
  const size_t wanted = o.num_prompts > 0 ? static_cast<size_t>(o.num_prompts) : order.size();
  std::vector<Prompt> prompts;
  ShareGptStats s;
  for (size_t index : order) {
    if (prompts.size() >= wanted) break;
    const ShareGptPair& pair = file.pairs[index];
    StatusOr<int64_t> prompt_len = tokenizer->Count(pair.prompt);
    if (!prompt_len.ok()) return prompt_len.status().WithContext("counting ShareGPT prompt tokens");
    int64_t output_len = 0;
    if (o.output_len) {
      output_len = *o.output_len;
    } else {
      StatusOr<int64_t> completion_len = tokenizer->Count(pair.completion);
      if (!completion_len.ok()) {
        return completion_len.status().WithContext("counting ShareGPT completion tokens");
      }
      output_len = *completion_len;
    }
    if (!IsValidShareGptPair(*prompt_len, output_len, o.output_len.has_value())) {
      ++s.pruned;
      continue;
    }
    Prompt p;
    p.text = pair.prompt;
    p.prompt_len = *prompt_len;
    p.output_len = output_len;
    prompts.push_back(std::move(p));
  }
  s.usable = static_cast<int64_t>(prompts.size());
  if (stats != nullptr) *stats = s;
  if (prompts.empty()) {
    return InvalidArgument("no usable ShareGPT conversation: " + std::to_string(file.entries) +
                           " entries, " + std::to_string(file.skipped) +
                           " with fewer than two turns, " + std::to_string(s.pruned) +
                           " pruned for their lengths (prompt >= 4 and <= 1024 tokens, output "
                           ">= 4, both <= 2048)");
  }
  if (o.oversample && o.num_prompts > 0) Oversample(&prompts, o.num_prompts, rng);
  return prompts;
}

StatusOr<std::vector<Prompt>> ReadShareGptWorkload(const std::filesystem::path& path,
                                                   const ShareGptOptions& options,
                                                   PromptTokenizer* tokenizer,
                                                   ShareGptStats* stats) {
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  StatusOr<ShareGptFile> file = ParseShareGpt(*text, path.string());
  if (!file.ok()) return file.status();
  return SampleShareGpt(*file, options, tokenizer, stats);
}

// ---- Sonnet -----------------------------------------------------------------------------------

StatusOr<std::vector<std::string>> ReadPoemLines(const std::filesystem::path& path) {
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text->size()) {
    const size_t end = text->find('\n', start);
    if (end == std::string::npos) {
      lines.push_back(text->substr(start) + "\n");
      break;
    }
    lines.push_back(text->substr(start, end + 1 - start));
    start = end + 1;
  }
  if (lines.empty()) return InvalidArgument(path.string() + ": no poem lines (empty file)");
  return lines;
}

StatusOr<std::vector<Prompt>> MakeSonnetWorkload(const std::vector<std::string>& lines,
                                                 const SonnetOptions& o, PromptTokenizer* tokenizer,
                                                 SonnetStats* stats) {
  if (lines.empty()) return InvalidArgument("sonnet: no poem lines");
  if (o.num_prompts <= 0) return InvalidArgument("--num-prompts must be positive");
  if (o.output_len <= 0) return InvalidArgument("--sonnet-output-len must be positive");
  if (o.prefix_len < 0) return InvalidArgument("--sonnet-prefix-len must be >= 0");
  SonnetStats s;
  int64_t total = 0;
  for (const std::string& line : lines) {
    StatusOr<int64_t> n = tokenizer->Count(line);
    if (!n.ok()) return n.status().WithContext("counting poem line tokens");
    total += *n;
  }
  s.avg_line_tokens = static_cast<double>(total) / static_cast<double>(lines.size());
  if (!(s.avg_line_tokens > 0)) return InvalidArgument("sonnet: the poem lines have no tokens");
  StatusOr<int64_t> base = tokenizer->CountChat(kSonnetInstruction);
  if (!base.ok()) return base.status().WithContext("counting the sonnet instruction's tokens");
  s.base_offset = *base;
  if (o.input_len <= s.base_offset) {
    return InvalidArgument("--sonnet-input-len " + std::to_string(o.input_len) +
                           " must be higher than the base prompt length (" +
                           std::to_string(s.base_offset) + " tokens)");
  }
  s.num_input_lines =
      RoundHalfEven(static_cast<double>(o.input_len - s.base_offset) / s.avg_line_tokens);
  s.num_prefix_lines = std::max<int64_t>(
      RoundHalfEven(static_cast<double>(o.prefix_len - s.base_offset) / s.avg_line_tokens), 0);
  // As in vLLM: the random lines are counted before the prefix is cut to the file's length.
  const int64_t extra = std::max<int64_t>(s.num_input_lines - s.num_prefix_lines, 0);
  s.num_prefix_lines = std::min<int64_t>(s.num_prefix_lines, static_cast<int64_t>(lines.size()));
  std::string prefix = kSonnetInstruction;
  for (int64_t i = 0; i < s.num_prefix_lines; ++i) prefix += lines[static_cast<size_t>(i)];

  std::mt19937_64 rng(o.seed);
  std::vector<Prompt> prompts;
  int64_t redraws_in_a_row = 0;
  while (static_cast<int64_t>(prompts.size()) < o.num_prompts) {
    std::string text = prefix;
    for (int64_t i = 0; i < extra; ++i) {
      text +=
          lines[static_cast<size_t>(UniformInt(rng, 0, static_cast<int64_t>(lines.size()) - 1))];
    }
    StatusOr<int64_t> len = tokenizer->CountChat(text);
    if (!len.ok()) return len.status().WithContext("counting sonnet prompt tokens");
    if (*len > o.input_len) {
      ++s.redrawn;
      if (++redraws_in_a_row >= kMaxRedraws) {
        return InvalidArgument("sonnet: " + std::to_string(kMaxRedraws) +
                               " prompts in a row were longer than --sonnet-input-len " +
                               std::to_string(o.input_len) + " (the last: " + std::to_string(*len) +
                               " tokens); raise it");
      }
      continue;
    }
    redraws_in_a_row = 0;
    Prompt p;
    p.prompt_len = *len;
    p.output_len = o.output_len;
    if (o.render_chat && tokenizer->exact()) {
      StatusOr<std::string> rendered = tokenizer->RenderChat(text);
      if (!rendered.ok()) return rendered.status().WithContext("rendering a sonnet prompt");
      p.text = std::move(*rendered);
      s.rendered = true;
    } else {
      p.text = std::move(text);
    }
    prompts.push_back(std::move(p));
  }
  if (stats != nullptr) *stats = s;
  return prompts;
}

// ---- Custom -------------------------------------------------------------------------------------

StatusOr<std::vector<Prompt>> MakeCustomWorkload(std::vector<Prompt> lines, const CustomOptions& o,
                                                 PromptTokenizer* tokenizer) {
  if (lines.empty()) return InvalidArgument("custom: no prompts");
  std::mt19937_64 rng(o.seed);
  std::vector<size_t> order(lines.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (o.shuffle) Shuffle(&order, rng);
  const size_t wanted = o.num_prompts > 0 ? static_cast<size_t>(o.num_prompts) : order.size();
  std::vector<Prompt> prompts;
  for (size_t index : order) {
    if (prompts.size() >= wanted) break;
    Prompt p = std::move(lines[index]);
    if (p.token_ids.empty()) {
      if (o.render_chat) {
        StatusOr<std::string> rendered = tokenizer->RenderChat(p.text);
        if (!rendered.ok()) {
          return rendered.status().WithContext(
              "--dataset-name custom on a completions endpoint applies the chat template, as "
              "vLLM does (pass --skip-chat-template to send the prompts as they are)");
        }
        p.text = std::move(*rendered);
      }
      StatusOr<int64_t> n = tokenizer->Count(p.text);
      if (!n.ok()) return n.status().WithContext("counting custom prompt tokens");
      p.prompt_len = *n;
    }
    prompts.push_back(std::move(p));
  }
  if (o.oversample && o.num_prompts > 0) Oversample(&prompts, o.num_prompts, rng);
  return prompts;
}

}  // namespace oasis::loadgen
