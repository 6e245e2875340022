#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>

#include "common/json_depth.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

enum class DecoderKind { kByteLevel, kJoinWithSpace };

Status ParseDecoder(const Json& json, const std::string& path, DecoderKind* kind) {
  OASIS_ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "ByteLevel") {
    *kind = DecoderKind::kByteLevel;
    return Status::Ok();
  }
  if (type == "Sequence") {
    const Json* list = FindMember(json, "decoders");
    if (list == nullptr || !list->is_array() || list->size() != 1) {
      return Unimplemented("decoder Sequence (at " + path + ") is supported only as [ByteLevel]");
    }
    return ParseDecoder((*list)[0], path + ".decoders[0]", kind);
  }
  return Unimplemented("decoder type \"" + type + "\" (at " + path +
                       ") is not supported; supported: ByteLevel");
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open tokenizer file " + path.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in.good() && !in.eof()) return DataLoss("cannot read tokenizer file " + path.string());
  return FromJson(contents.str(), path.string());
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json,
                                                         std::string source) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->source_ = std::move(source);
  Status status = t->Load(json);
  if (!status.ok()) return status.WithContext("loading tokenizer " + t->source_);
  return t;
}

Status Tokenizer::Load(std::string_view text) {
  if (JsonNestedDeeperThan(text))
    return InvalidArgument("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  Json json;
  try {
    json = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    return InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
  if (!json.is_object()) return InvalidArgument("expected a JSON object at the top level");
  static const Json kNull;
  auto member = [&](std::string_view key) -> const Json& {
    const Json* v = FindMember(json, key);
    return v != nullptr ? *v : kNull;
  };

  OASIS_ASSIGN_OR_RETURN(normalizer_, Normalizer::FromJson(member("normalizer")));
  OASIS_ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::FromJson(member("pre_tokenizer")));
  const Json* model = FindMember(json, "model");
  if (model == nullptr) return JsonError("model", "missing");
  const SymbolMode mode =
      pre_tokenizer_->byte_level() ? SymbolMode::kByteLevel : SymbolMode::kCharacter;
  OASIS_ASSIGN_OR_RETURN(model_, BpeModel::FromJson(*model, mode));
  OASIS_ASSIGN_OR_RETURN(
      AddedVocabulary added,
      AddedVocabulary::FromJson(FindMember(json, "added_tokens"), normalizer_.get()));
  added_ = std::make_unique<AddedVocabulary>(std::move(added));
  OASIS_ASSIGN_OR_RETURN(PostProcessor post, PostProcessor::FromJson(member("post_processor")));
  post_processor_ = std::make_unique<PostProcessor>(std::move(post));

  DecoderKind decoder = DecoderKind::kJoinWithSpace;
  if (const Json* d = FindMember(json, "decoder"))
    OASIS_RETURN_IF_ERROR(ParseDecoder(*d, "decoder", &decoder));
  joins_with_space_ = decoder == DecoderKind::kJoinWithSpace;

  // Per-id decoding tables. Added tokens take precedence over the model's strings (HF's
  // simple_id_to_token first); the ByteLevel decoder maps a token made only of alphabet chars
  // to its bytes and keeps any other token's UTF-8 as it is.
  int32_t limit = model_->id_limit();
  for (const AddedToken& t : added_->tokens()) limit = std::max(limit, t.id + 1);
  decoded_.assign(limit, std::string());
  known_.assign(limit, 0);
  special_.assign(limit, 0);
  added_ids_.assign(limit, 0);
  auto set_decoded = [&](int32_t id, const std::string& token) {
    known_[id] = 1;
    if (decoder == DecoderKind::kByteLevel) {
      auto bytes = ByteLevelToBytes(token);
      decoded_[id] = bytes ? std::move(*bytes) : token;
    } else {
      decoded_[id] = token;
    }
  };
  for (int32_t id = 0; id < model_->id_limit(); ++id) {
    if (const std::string* token = model_->IdToToken(id)) set_decoded(id, *token);
  }
  for (const AddedToken& t : added_->tokens()) {
    set_decoded(t.id, t.content);
    special_[t.id] = t.special ? 1 : 0;
    added_ids_[t.id] = 1;
    has_normalized_added_tokens_ = has_normalized_added_tokens_ || t.normalized;
  }
  for (int32_t id : post_processor_->prefix()) {
    if (id >= limit || !known_[id])
      return InvalidArgument("post_processor: unknown token id " + std::to_string(id));
  }
  for (int32_t id : post_processor_->suffix()) {
    if (id >= limit || !known_[id])
      return InvalidArgument("post_processor: unknown token id " + std::to_string(id));
  }
  return Status::Ok();
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, AddSpecialTokens add) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    AppendUtf8Lossy(text, &repaired);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add == AddSpecialTokens::kYes) {
    ids.insert(ids.end(), post_processor_->prefix().begin(), post_processor_->prefix().end());
  }
  std::string normalized;
  added_->Split(text, AddedTokenSet::kRaw, [&](std::string_view piece, int32_t id) {
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    std::string_view form = piece;
    if (normalizer_) {
      normalizer_->Normalize(piece, &normalized);
      form = normalized;
    }
    if (!has_normalized_added_tokens_) {
      EncodeNormalized(form, &ids);
      return;
    }
    added_->Split(form, AddedTokenSet::kNormalized, [&](std::string_view sub, int32_t sub_id) {
      if (sub_id >= 0) {
        ids.push_back(sub_id);
      } else {
        EncodeNormalized(sub, &ids);
      }
    });
  });
  if (add == AddSpecialTokens::kYes) {
    ids.insert(ids.end(), post_processor_->suffix().begin(), post_processor_->suffix().end());
  }
  return ids;
}

void Tokenizer::EncodeNormalized(std::string_view text, std::vector<int32_t>* ids) const {
  pre_tokenizer_->Split(text, [&](std::string_view word) { model_->Tokenize(word, ids); });
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, SkipSpecialTokens skip) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (!Decodes(id, skip)) continue;
    if (joins_with_space_ && !first) bytes.push_back(' ');
    bytes += decoded_[id];
    first = false;
  }
  if (IsValidUtf8(bytes)) return bytes;
  std::string text;
  AppendUtf8Lossy(bytes, &text);
  return text;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* t = added_->FindByContent(token)) return t->id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (!IsKnown(id)) return std::nullopt;
  if (const AddedToken* t = added_->FindById(id)) return t->content;
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const { return IsKnown(id) && special_[id]; }

bool Tokenizer::IsAdded(int32_t id) const { return IsKnown(id) && added_ids_[id]; }

std::string_view Tokenizer::DecodedBytes(int32_t id) const {
  return IsKnown(id) ? std::string_view(decoded_[id]) : std::string_view();
}

}  // namespace oasis::tokenizer
