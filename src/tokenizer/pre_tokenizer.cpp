#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

namespace oasis::tokenizer {
namespace {

// GPT-2's pattern, used by ByteLevel with use_regex = true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Piece {
  uint32_t begin;
  uint32_t end;
  bool is_match;
};

StatusOr<SplitBehavior> ParseBehavior(const Json& json, const std::string& path) {
  OASIS_ASSIGN_OR_RETURN(std::string name, GetString(json, "behavior", path));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return JsonError(path + ".behavior", "unknown split behavior \"" + name + "\"");
}

// HF's NormalizedString::split: turns the match/non-match pieces into the kept ranges.
void ApplyBehavior(const std::vector<Piece>& pieces, SplitBehavior behavior,
                   std::vector<Piece>* out) {
  out->clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      *out = pieces;
      break;
    case SplitBehavior::kRemoved:
      for (const Piece& p : pieces) {
        if (!p.is_match) out->push_back(p);
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Piece& p : pieces) {
        if (p.is_match == previous_match && !out->empty()) {
          out->back().end = p.end;
        } else {
          out->push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Piece& p : pieces) {
        if (p.is_match && !previous_match && !out->empty()) {
          out->back().end = p.end;
        } else {
          out->push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = pieces.size(); k-- > 0;) {
        const Piece& p = pieces[k];
        if (p.is_match && !previous_match && !out->empty()) {
          out->back().begin = p.begin;
        } else {
          out->push_back(p);
        }
        previous_match = p.is_match;
      }
      std::reverse(out->begin(), out->end());
      break;
  }
}

}  // namespace

PreTokenizer::~PreTokenizer() = default;

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const Json& json) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  if (!json.is_null()) OASIS_RETURN_IF_ERROR(p->ParseInto(json, "pre_tokenizer"));
  for (size_t i = 0; i < p->stages_.size(); ++i) {
    if (p->stages_[i].kind == Stage::Kind::kByteLevel && i + 1 != p->stages_.size()) {
      return Unimplemented(
          "a ByteLevel pre-tokenizer followed by other "
          "pre-tokenizers is not supported (ByteLevel must come last)");
    }
  }
  p->byte_level_ = !p->stages_.empty() && p->stages_.back().kind == Stage::Kind::kByteLevel;
  return p;
}

Status PreTokenizer::ParseInto(const Json& json, const std::string& path) {
  OASIS_ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "Sequence") {
    const Json* list = FindMember(json, "pretokenizers");
    if (list == nullptr || !list->is_array())
      return JsonError(path + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      OASIS_RETURN_IF_ERROR(
          ParseInto((*list)[i], path + ".pretokenizers[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  Stage stage;
  if (type == "Split") {
    const Json* pattern = FindMember(json, "pattern");
    if (pattern == nullptr || !pattern->is_object()) {
      return JsonError(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (const Json* re = FindMember(*pattern, "Regex"); re != nullptr && re->is_string()) {
      auto compiled = Regex::Compile(re->get<std::string>());
      if (!compiled.ok()) return compiled.status().WithContext(path + ".pattern");
      stage.regex = std::move(compiled).value();
    } else if (const Json* lit = FindMember(*pattern, "String");
               lit != nullptr && lit->is_string()) {
      stage.literal = lit->get<std::string>();
      if (stage.literal.empty()) return JsonError(path + ".pattern.String", "empty split string");
    } else {
      return JsonError(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    OASIS_ASSIGN_OR_RETURN(stage.behavior, ParseBehavior(json, path));
    OASIS_ASSIGN_OR_RETURN(stage.invert, GetBool(json, "invert", path, false));
  } else if (type == "ByteLevel") {
    stage.kind = Stage::Kind::kByteLevel;
    OASIS_ASSIGN_OR_RETURN(stage.add_prefix_space, GetBool(json, "add_prefix_space", path, true));
    OASIS_ASSIGN_OR_RETURN(bool use_regex, GetBool(json, "use_regex", path, true));
    if (use_regex) {
      auto compiled = Regex::Compile(kGpt2Pattern);
      if (!compiled.ok()) return compiled.status().WithContext(path);
      stage.regex = std::move(compiled).value();
    }
  } else {
    return Unimplemented("pre_tokenizer type \"" + type + "\" (at " + path +
                         ") is not supported; supported: Split, ByteLevel, Sequence");
  }
  stages_.push_back(std::move(stage));
  return Status::Ok();
}

void PreTokenizer::Split(std::string_view text, FunctionRef<void(std::string_view)> sink) const {
  if (text.empty()) return;
  RunStage(0, text, sink);
}

void PreTokenizer::RunStage(size_t index, std::string_view text,
                            FunctionRef<void(std::string_view)> sink) const {
  if (index == stages_.size()) {
    sink(text);
    return;
  }
  const Stage& stage = stages_[index];
  std::string prefixed;
  if (stage.kind == Stage::Kind::kByteLevel) {
    if (stage.add_prefix_space && text.front() != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!stage.regex) {
      RunStage(index + 1, text, sink);
      return;
    }
  }
  // Matches -> a cover of `text` by match and non-match pieces (HF's Pattern::find_matches).
  std::vector<ByteRange> matches;
  if (stage.regex) {
    stage.regex->FindAll(text, &matches);
  } else {
    for (size_t at = text.find(stage.literal); at != std::string_view::npos;
         at = text.find(stage.literal, at + stage.literal.size())) {
      matches.push_back(
          {static_cast<uint32_t>(at), static_cast<uint32_t>(at + stage.literal.size())});
    }
  }
  const bool invert = stage.kind == Stage::Kind::kSplit && stage.invert;
  std::vector<Piece> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  uint32_t previous = 0;
  for (const ByteRange& m : matches) {
    if (m.begin != previous) pieces.push_back({previous, m.begin, invert});
    pieces.push_back({m.begin, m.end, !invert});
    previous = m.end;
  }
  if (previous != text.size())
    pieces.push_back({previous, static_cast<uint32_t>(text.size()), invert});

  const SplitBehavior behavior =
      stage.kind == Stage::Kind::kSplit ? stage.behavior : SplitBehavior::kIsolated;
  std::vector<Piece> kept;
  ApplyBehavior(pieces, behavior, &kept);
  for (const Piece& p : kept) {
    if (p.end > p.begin) RunStage(index + 1, text.substr(p.begin, p.end - p.begin), sink);
  }
}

}  // namespace oasis::tokenizer
