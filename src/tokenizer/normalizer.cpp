#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "common/check.h"

namespace oasis::tokenizer {
namespace {

Status ParseInto(const Json& json, const std::string& path, std::vector<UnicodeForm>* forms) {
  OASIS_ASSIGN_OR_RETURN(std::string type, GetType(json, path));
  if (type == "NFC") {
    forms->push_back(UnicodeForm::kNfc);
  } else if (type == "NFD") {
    forms->push_back(UnicodeForm::kNfd);
  } else if (type == "NFKC") {
    forms->push_back(UnicodeForm::kNfkc);
  } else if (type == "NFKD") {
    forms->push_back(UnicodeForm::kNfkd);
  } else if (type == "Sequence") {
    const Json* list = FindMember(json, "normalizers");
    if (list == nullptr || !list->is_array())
      return JsonError(path + ".normalizers", "expected an array");
    for (size_t i = 0; i < list->size(); ++i) {
      OASIS_RETURN_IF_ERROR(
          ParseInto((*list)[i], path + ".normalizers[" + std::to_string(i) + "]", forms));
    }
  } else {
    return Unimplemented("normalizer type \"" + type + "\" (at " + path +
                         ") is not supported; supported: NFC, NFD, NFKC, NFKD, Sequence");
  }
  return Status::Ok();
}

// True when `text` is unchanged by `form`: only chars below U+0300 (no char there decomposes
// differently under NFC, and none combines with a preceding char), and no compatibility form.
bool TriviallyNormalized(std::string_view text, UnicodeForm form) {
  for (unsigned char b : text) {
    if (b >= 0x80) {
      if (form != UnicodeForm::kNfc || b >= 0xCC) return false;  // 0xCC leads U+0300..U+033F
    }
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const Json& json) {
  if (json.is_null()) return std::unique_ptr<Normalizer>();
  auto n = std::make_unique<Normalizer>();
  OASIS_RETURN_IF_ERROR(ParseInto(json, "normalizer", &n->forms_));
  return n;
}

void Normalizer::Normalize(std::string_view text, std::string* out) const {
  out->assign(text);
  std::string scratch;
  for (UnicodeForm form : forms_) {
    NormalizeUnicode(*out, form, &scratch);
    out->swap(scratch);
  }
}

void NormalizeUnicode(std::string_view text, UnicodeForm form, std::string* out) {
  out->clear();
  // ASCII runs are invariant under every form, and a char after an ASCII char never composes
  // with it unless it is non-ASCII: normalise only the non-ASCII runs, each together with the
  // ASCII char before it (its possible starter).
  size_t i = 0;
  while (i < text.size()) {
    size_t run = i;
    while (run < text.size() && static_cast<unsigned char>(text[run]) < 0x80) ++run;
    if (run == text.size()) {
      out->append(text.substr(i));
      return;
    }
    const size_t start = run > i ? run - 1 : run;  // include the ASCII starter
    out->append(text.substr(i, start - i));
    size_t stop = run;
    while (stop < text.size() && static_cast<unsigned char>(text[stop]) >= 0x80) ++stop;
    const std::string_view segment = text.substr(start, stop - start);
    if (TriviallyNormalized(segment, form)) {
      out->append(segment);
    } else {
      int options = UTF8PROC_STABLE;
      switch (form) {
        case UnicodeForm::kNfc:
          options |= UTF8PROC_COMPOSE;
          break;
        case UnicodeForm::kNfd:
          options |= UTF8PROC_DECOMPOSE;
          break;
        case UnicodeForm::kNfkc:
          options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
          break;
        case UnicodeForm::kNfkd:
          options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
          break;
      }
      utf8proc_uint8_t* result = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(segment.data()),
                       static_cast<utf8proc_ssize_t>(segment.size()), &result,
                       static_cast<utf8proc_option_t>(options));
      OASIS_CHECK(n >= 0) << "utf8proc_map failed on well-formed UTF-8: " << utf8proc_errmsg(n);
      out->append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
      std::free(result);
    }
    i = stop;
  }
}

}  // namespace oasis::tokenizer
