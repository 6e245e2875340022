#include "tokenizer/post_processor.h"

namespace oasis::tokenizer {

StatusOr<PostProcessor> PostProcessor::FromJson(const Json& json) {
  PostProcessor p;
  if (!json.is_null()) OASIS_RETURN_IF_ERROR(p.ParseInto(json, "post_processor"));
  return p;
}

Status PostProcessor::ParseInto(const Json& json, const std::string& path) {
  OASIS_ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "ByteLevel") return Status::Ok();
  if (type == "TemplateProcessing") return ParseTemplate(json, path);
  if (type == "Sequence") {
    const Json* list = FindMember(json, "processors");
    if (list == nullptr || !list->is_array())
      return JsonError(path + ".processors", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      OASIS_RETURN_IF_ERROR(ParseInto((*list)[i], path + ".processors[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  return Unimplemented("post_processor type \"" + type + "\" (at " + path +
                       ") is not supported; supported: TemplateProcessing, ByteLevel, Sequence");
}

// {"single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", ...}}],
//  "special_tokens": {"<bos>": {"id": "<bos>", "ids": [1], "tokens": ["<bos>"]}}}
Status PostProcessor::ParseTemplate(const Json& json, const std::string& path) {
  const Json* single = FindMember(json, "single");
  if (single == nullptr || !single->is_array()) {
    return JsonError(path + ".single", "expected an array of template pieces");
  }
  const Json* specials = FindMember(json, "special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& piece = (*single)[i];
    const std::string piece_path = path + ".single[" + std::to_string(i) + "]";
    if (const Json* seq = FindMember(piece, "Sequence")) {
      OASIS_ASSIGN_OR_RETURN(std::string id, GetString(*seq, "id", piece_path + ".Sequence"));
      if (id != "A" || seen_sequence) {
        return Unimplemented(piece_path + ": a single-sequence template with " + "sequence \"" +
                             id + "\" is not supported");
      }
      seen_sequence = true;
      continue;
    }
    const Json* special = FindMember(piece, "SpecialToken");
    if (special == nullptr) {
      return JsonError(piece_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
    OASIS_ASSIGN_OR_RETURN(std::string name,
                           GetString(*special, "id", piece_path + ".SpecialToken"));
    const Json* entry = specials != nullptr ? FindMember(*specials, name) : nullptr;
    const Json* ids = entry != nullptr ? FindMember(*entry, "ids") : nullptr;
    if (ids == nullptr || !ids->is_array()) {
      return JsonError(path + ".special_tokens", "no ids for template token \"" + name + "\"");
    }
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= (int64_t{1} << 24)) {
        return JsonError(path + ".special_tokens[\"" + name + "\"].ids", "expected token ids");
      }
      (seen_sequence ? suffix_ : prefix_).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return JsonError(path + ".single", "the template has no $A sequence");
  return Status::Ok();
}

}  // namespace oasis::tokenizer
