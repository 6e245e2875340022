#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>
#include <spdlog/spdlog.h>

#include "common/check.h"
#include "tokenizer/utf8.h"

namespace oasis::tokenizer {
namespace {

// Oniguruma's \s for UTF-8: U+0009-U+000D, U+0085 and the Zs, Zl, Zp categories.
constexpr std::string_view kSpaceClassItems = "\\t-\\r\\x{85}\\p{Zs}\\x{2028}\\x{2029}";
constexpr std::string_view kHexClassItems = "0-9a-fA-F";

// Per-thread PCRE2 matching state, shared by all patterns on the thread.
class MatchState {
 public:
  MatchState() {
    data_ = pcre2_match_data_create(32, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    OASIS_CHECK(data_ && context_ && jit_stack_) << "out of memory creating PCRE2 match state";
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* jit_stack_;
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string Regex::TranslateOnigurumaPattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's' || n == 'h') {
        const std::string_view items = n == 's' ? kSpaceClassItems : kHexClassItems;
        if (in_class) {
          out += items;
        } else {
          out += '[';
          out += items;
          out += ']';
        }
      } else if ((n == 'S' || n == 'H') && !in_class) {
        out += "[^";
        out += n == 'S' ? kSpaceClassItems : kHexClassItems;
        out += ']';
      } else {
        out += c;
        out += n;
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      const size_t end = close == std::string_view::npos ? p.size() : close + 2;
      out += p.substr(i, end - i);
      i = end;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  std::string translated = TranslateOnigurumaPattern(pattern);
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  OASIS_CHECK(cctx != nullptr) << "out of memory creating a PCRE2 compile context";
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, cctx);
  pcre2_compile_context_free(cctx);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgument("cannot compile regex \"" + std::string(pattern) + "\" (as PCRE2 \"" +
                           translated + "\") at offset " + std::to_string(offset) + ": " +
                           reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation: when it is unavailable pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code, std::move(translated)));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::FindAll(std::string_view subject, std::vector<ByteRange>* matches) const {
  OASIS_CHECK_LT(subject.size(), size_t{UINT32_MAX}) << "regex subject too large";
  MatchState& state = ThreadMatchState();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t search_from = 0;
  bool have_last_end = false;
  size_t last_match_end = 0;
  while (search_from <= subject.size()) {
    const int rc = pcre2_match(code, data, subject.size(), search_from, PCRE2_NO_UTF_CHECK,
                               state.data(), state.context());
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      spdlog::warn("tokenizer: regex match stopped early on a {}-byte input: {}", subject.size(),
                   reinterpret_cast<const char*>(message));
      return;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data());
    const size_t begin = ov[0], end = ov[1];
    if (begin == end && have_last_end && last_match_end == end) {
      // No empty match right after the previous match: step one character and retry.
      search_from += search_from < subject.size()
                         ? Utf8SequenceLength(static_cast<unsigned char>(subject[search_from]))
                         : 1;
      continue;
    }
    search_from = end;
    have_last_end = true;
    last_match_end = end;
    matches->push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(end)});
  }
}

}  // namespace oasis::tokenizer
