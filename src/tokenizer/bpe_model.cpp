#include "tokenizer/bpe_model.h"

#include <cstdio>

#include "common/check.h"
#include "tokenizer/bpe_merge.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

// Ids above this are rejected: they would make the id tables absurdly large.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

Status CheckEmptyOrNull(const Json& model, std::string_view key) {
  const Json* v = FindMember(model, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string()) return JsonError("model." + std::string(key), "expected a string or null");
  if (!v->get_ref<const std::string&>().empty()) {
    return Unimplemented("BPE model option " + std::string(key) + "=\"" + v->get<std::string>() +
                         "\" is not supported");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& model, SymbolMode mode) {
  if (!model.is_object()) return JsonError("model", "expected an object");
  const Json* type = FindMember(model, "type");
  if (type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return Unimplemented("model type " + type->dump() + " is not supported (only \"BPE\")");
  }
  if (type == nullptr && FindMember(model, "merges") == nullptr) {
    return Unimplemented("model without a type is not supported (only \"BPE\")");
  }
  if (const Json* dropout = FindMember(model, "dropout")) {
    if (!dropout->is_number()) return JsonError("model.dropout", "expected a number or null");
    if (dropout->get<double>() != 0.0) {
      return Unimplemented("BPE dropout is not supported (inference only)");
    }
  }
  OASIS_RETURN_IF_ERROR(CheckEmptyOrNull(model, "continuing_subword_prefix"));
  OASIS_RETURN_IF_ERROR(CheckEmptyOrNull(model, "end_of_word_suffix"));

  std::unique_ptr<BpeModel> m(new BpeModel());
  m->mode_ = mode;
  OASIS_ASSIGN_OR_RETURN(m->byte_fallback_, GetBool(model, "byte_fallback", "model", false));
  OASIS_ASSIGN_OR_RETURN(m->ignore_merges_, GetBool(model, "ignore_merges", "model", false));
  OASIS_ASSIGN_OR_RETURN(m->fuse_unk_, GetBool(model, "fuse_unk", "model", false));

  const Json* vocab = FindMember(model, "vocab");
  if (vocab == nullptr) return JsonError("model.vocab", "missing");
  OASIS_RETURN_IF_ERROR(m->LoadVocab(*vocab));

  if (const Json* unk = FindMember(model, "unk_token")) {
    if (!unk->is_string()) return JsonError("model.unk_token", "expected a string or null");
    auto id = m->TokenToId(unk->get<std::string>());
    if (!id) {
      return JsonError("model.unk_token",
                       "\"" + unk->get<std::string>() + "\" is not in the vocabulary");
    }
    m->unk_id_ = *id;
  }

  const Json* merges = FindMember(model, "merges");
  if (merges == nullptr) return JsonError("model.merges", "missing");
  OASIS_RETURN_IF_ERROR(m->LoadMerges(*merges));

  // Start symbols and byte-fallback tokens per byte.
  for (int b = 0; b < 256; ++b) {
    m->byte_to_id_[b] = -1;
    if (mode == SymbolMode::kByteLevel) {
      auto it = m->symbol_to_id_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
      if (it != m->symbol_to_id_.end()) m->byte_to_id_[b] = it->second;
    }
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    // "<0xAB>" is plain ASCII, identical in both vocabulary forms.
    m->byte_fallback_id_[b] = m->SymbolId(name).value_or(-1);
  }
  return m;
}

Status BpeModel::LoadVocab(const Json& vocab) {
  if (!vocab.is_object()) return JsonError("model.vocab", "expected an object of token -> id");
  token_to_id_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return JsonError("model.vocab[\"" + it.key() + "\"]", "expected an integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return JsonError("model.vocab[\"" + it.key() + "\"]",
                       "id " + std::to_string(id) + " out of range");
    }
    token_to_id_.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_token_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : token_to_id_) {
    if (has_token_[id]) continue;  // two strings share an id: keep the first seen
    id_to_token_[id] = token;
    has_token_[id] = 1;
  }
  if (mode_ == SymbolMode::kByteLevel) {
    symbol_to_id_.reserve(token_to_id_.size());
    for (const auto& [token, id] : token_to_id_) {
      // A token with characters outside the byte alphabet can never come out of byte-level input.
      if (auto bytes = ByteLevelToBytes(token)) symbol_to_id_.emplace(std::move(*bytes), id);
    }
  }
  return Status::Ok();
}

Status BpeModel::LoadMerges(const Json& merges) {
  if (!merges.is_array()) return JsonError("model.merges", "expected an array");
  merges_.Reserve(merges.size());
  std::string merged;
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& rule = merges[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    std::string_view left, right;
    if (rule.is_string()) {  // legacy "a b"
      const std::string& s = rule.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return JsonError(path, "expected \"left right\"");
      left = std::string_view(s).substr(0, space);
      right = std::string_view(s).substr(space + 1);
    } else if (rule.is_array() && rule.size() == 2 && rule[0].is_string() && rule[1].is_string()) {
      left = rule[0].get_ref<const std::string&>();
      right = rule[1].get_ref<const std::string&>();
    } else {
      return JsonError(path, "expected \"left right\" or [\"left\", \"right\"]");
    }
    auto left_id = TokenToId(left);
    auto right_id = TokenToId(right);
    merged.assign(left);
    merged.append(right);
    auto merged_id = TokenToId(merged);
    if (!left_id || !right_id || !merged_id) {
      return JsonError(path, "merge \"" + std::string(left) + "\" + \"" + std::string(right) +
                                 "\" uses a token that is not in the vocabulary");
    }
    merges_.Insert(*left_id, *right_id, MergeRule{static_cast<int32_t>(i), *merged_id});
  }
  return Status::Ok();
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeModel::SymbolId(std::string_view symbol) const {
  const VocabMap& map = mode_ == SymbolMode::kByteLevel ? symbol_to_id_ : token_to_id_;
  auto it = map.find(symbol);
  if (it == map.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::StartSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  // Fast path: every byte has its own symbol (always true for real byte-level vocabularies).
  if (mode_ == SymbolMode::kByteLevel) {
    bool complete = true;
    for (unsigned char b : word) {
      const int32_t id = byte_to_id_[b];
      if (id < 0) {
        complete = false;
        break;
      }
      symbols->push_back(id);
    }
    if (complete) return;
    symbols->clear();
  }
  // HF's merge_word: unknown units go to byte fallback, then to a (possibly fused) unk token,
  // else they are dropped.
  const auto& alphabet = ByteLevelAlphabet();
  int32_t pending_unk = -1;  // an unk token waiting to be emitted (fused runs share one)
  size_t i = 0;
  while (i < word.size()) {
    std::string_view unit;  // the unit's string as the vocabulary spells it
    std::optional<int32_t> id;
    if (mode_ == SymbolMode::kByteLevel) {
      const auto b = static_cast<unsigned char>(word[i]);
      unit = alphabet[b];
      if (byte_to_id_[b] >= 0) id = byte_to_id_[b];
      i += 1;
    } else {
      const size_t len = std::min<size_t>(Utf8SequenceLength(static_cast<unsigned char>(word[i])),
                                          word.size() - i);
      unit = word.substr(i, len);
      id = SymbolId(unit);
      i += len;
    }
    if (id) {
      if (pending_unk >= 0) {
        symbols->push_back(pending_unk);
        pending_unk = -1;
      }
      symbols->push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : unit) all = all && byte_fallback_id_[b] >= 0;
      if (all) {
        for (unsigned char b : unit) symbols->push_back(byte_fallback_id_[b]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) symbols->push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) symbols->push_back(pending_unk);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = SymbolId(word)) {
      out->push_back(*id);
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  // Short words: the lock-free cache.
  if (word.size() <= ShortWordCache::kMaxWordBytes) {
    const uint64_t hash = ShortWordCache::Hash(word);
    if (short_cache_.Lookup(word, hash, out)) return;
    symbols.clear();
    StartSymbols(word, &symbols);
    ApplyMerges(merges_, &symbols);
    out->insert(out->end(), symbols.begin(), symbols.end());
    if (symbols.size() <= ShortWordCache::kMaxIds) {
      short_cache_.Insert(word, hash, symbols.data(), symbols.size());
    }
    return;
  }
  // Longer words: the shared cache (up to WordCache::kMaxWordBytes).
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  const size_t hash = cacheable ? WordCache::Hash(word) : 0;
  if (cacheable && cache_.Lookup(word, hash, out)) return;
  symbols.clear();
  StartSymbols(word, &symbols);
  ApplyMerges(merges_, &symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
  if (cacheable) cache_.Insert(word, hash, symbols.data(), symbols.size());
}

}  // namespace oasis::tokenizer
