#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

// The first and last characters of a piece of well-formed UTF-8.
char32_t FirstChar(std::string_view s) {
  char32_t c;
  DecodeUtf8(s.data(), s.data() + s.size(), &c);
  return c;
}

char32_t LastChar(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return FirstChar(s.substr(i));
}

// HF's space_leftmost_at_end: the start of the whitespace run that ends `s`.
size_t LeadingEdgeOfTrailingSpace(std::string_view s) {
  size_t edge = s.size();
  while (edge > 0) {
    size_t i = edge - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    if (!IsUnicodeWhitespace(FirstChar(s.substr(i, edge - i)))) break;
    edge = i;
  }
  return edge;
}

// HF's space_rightmost_at_start: the length of the whitespace run that starts `s`.
size_t LengthOfLeadingSpace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    const int len = DecodeUtf8(s.data() + i, s.data() + s.size(), &c);
    if (!IsUnicodeWhitespace(c)) break;
    i += len;
  }
  return i;
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view key, int32_t token) {
  int32_t node = 0;
  for (unsigned char b : key) {
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const auto& child, unsigned char v) { return child.first < v; });
    if (it != children.end() && it->first == b) {
      node = it->second;
      continue;
    }
    const auto next = static_cast<int32_t>(nodes.size());
    children.insert(it, {b, next});
    nodes.emplace_back();  // may move `children`: not used after this
    node = next;
  }
  if (nodes[node].token < 0) nodes[node].token = token;
  if (!key.empty()) first_byte[static_cast<unsigned char>(key[0])] = true;
}

std::pair<size_t, int32_t> AddedVocabulary::Trie::LongestPrefix(std::string_view text) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const auto& child, unsigned char v) { return child.first < v; });
    if (it == children.end() || it->first != b) break;
    node = it->second;
    if (nodes[node].token >= 0) best = {i + 1, nodes[node].token};
  }
  return best;
}

StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const Json* json,
                                                    const Normalizer* normalizer) {
  AddedVocabulary v;
  if (json == nullptr) return v;
  if (!json->is_array()) return JsonError("added_tokens", "expected an array");
  for (size_t i = 0; i < json->size(); ++i) {
    const Json& t = (*json)[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return JsonError(path, "expected an object");
    AddedToken token;
    const Json* id = FindMember(t, "id");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= (int64_t{1} << 24)) {
      return JsonError(path + ".id", "expected an integer id in [0, 2^24)");
    }
    token.id = static_cast<int32_t>(id->get<int64_t>());
    OASIS_ASSIGN_OR_RETURN(token.content, GetString(t, "content", path));
    OASIS_ASSIGN_OR_RETURN(token.special, GetBool(t, "special", path, false));
    OASIS_ASSIGN_OR_RETURN(token.single_word, GetBool(t, "single_word", path, false));
    OASIS_ASSIGN_OR_RETURN(token.lstrip, GetBool(t, "lstrip", path, false));
    OASIS_ASSIGN_OR_RETURN(token.rstrip, GetBool(t, "rstrip", path, false));
    OASIS_ASSIGN_OR_RETURN(token.normalized, GetBool(t, "normalized", path, !token.special));
    if (token.content.empty()) return JsonError(path + ".content", "empty token");
    if (!IsValidUtf8(token.content)) return JsonError(path + ".content", "not valid UTF-8");
    v.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < v.tokens_.size(); ++i) {
    const AddedToken& t = v.tokens_[i];
    if (!t.normalized) {
      v.raw_.Insert(t.content, static_cast<int32_t>(i));
    } else if (normalizer != nullptr) {
      std::string form;
      normalizer->Normalize(t.content, &form);
      if (!form.empty()) v.normalized_.Insert(form, static_cast<int32_t>(i));
    } else {
      v.normalized_.Insert(t.content, static_cast<int32_t>(i));
    }
  }
  return v;
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  for (const AddedToken& t : tokens_) {
    if (t.content == content) return &t;
  }
  return nullptr;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  for (const AddedToken& t : tokens_) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

void AddedVocabulary::Split(std::string_view text, AddedTokenSet set,
                            FunctionRef<void(std::string_view, int32_t)> sink) const {
  const Trie& trie = set == AddedTokenSet::kRaw ? raw_ : normalized_;
  size_t emitted = 0;  // HF's start_offset: text before it has been handed on
  size_t pos = 0;      // where the next leftmost-longest search starts
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [length, index] = trie.LongestPrefix(text.substr(pos));
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + length;
    pos = stop;  // the automaton resumes after the raw match, whatever the flags do below
    if (token.single_word) {
      const bool space_before = start == 0 || !IsUnicodeWordChar(LastChar(text.substr(0, start)));
      const bool space_after =
          stop == text.size() || !IsUnicodeWordChar(FirstChar(text.substr(stop)));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(LeadingEdgeOfTrailingSpace(text.substr(0, start)), emitted);
    if (token.rstrip) stop += LengthOfLeadingSpace(text.substr(stop));
    if (emitted < start) sink(text.substr(emitted, start - emitted), -1);
    sink(text.substr(start, stop - start), token.id);
    emitted = stop;
  }
  if (emitted < text.size()) sink(text.substr(emitted), -1);
}

}  // namespace oasis::tokenizer
