// libFuzzer target for the tokenizer: arbitrary bytes through Encode, Decode and the
// IncrementalDetokenizer, checking their invariants:
//  - Decode(Encode(x)) is valid UTF-8 and equals x after U+FFFD repair (and NFC when the
//    tokenizer normalizes with NFC: the NFC of both sides must agree);
//  - the input read as a sequence of ids (any values) streams through the detokenizer to exactly
//    Decode(ids), never leaving more than 3 bytes pending.
// The tokenizer is the real Qwen3 one: env OASIS_TOKENIZER_JSON, else
// <repo>/.cache/test-data/qwen3/tokenizer.json; when neither exists, a small inline byte-level
// tokenizer so the target still runs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using oasis::tokenizer::AddSpecialTokens;
using oasis::tokenizer::SkipSpecialTokens;
using oasis::tokenizer::Tokenizer;

std::string InlineTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& alphabet = oasis::tokenizer::ByteLevelAlphabet();
  for (int b = 0; b < 256; ++b) vocab[alphabet[b]] = b;
  nlohmann::json merges = nlohmann::json::array();
  int next = 256;
  for (const char* pair : {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "Ġ Ġ", "ĠĠ ĠĠ"}) {
    std::string s(pair);
    const auto space = s.find(' ');
    const std::string merged = s.substr(0, space) + s.substr(space + 1);
    if (!vocab.contains(merged)) vocab[merged] = next++;
    merges.push_back(s);
  }
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                     {"trim_offsets", false}, {"use_regex", false}};
  const char* pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json json = {
      {"added_tokens",
       {{{"id", next}, {"content", "<|im_start|>"}, {"special", true}, {"normalized", false}},
        {{"id", next + 1}, {"content", "<x>"}, {"special", false}, {"single_word", true}}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
  return json.dump();
}

const Tokenizer& GetTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    std::filesystem::path path;
    if (const char* env = std::getenv("OASIS_TOKENIZER_JSON")) {
      path = env;
    } else {
      path = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / ".cache" /
             "test-data" / "qwen3" / "tokenizer.json";
    }
    auto t = std::filesystem::exists(path) ? Tokenizer::FromFile(path)
                                           : Tokenizer::FromJson(InlineTokenizerJson(), "inline");
    OASIS_CHECK(t.ok()) << t.status().ToString();
    std::fprintf(stderr, "fuzz_tokenizer: using %s\n", t.value()->source().c_str());
    return std::move(t).value();
  }();
  return *tokenizer;
}

std::string Nfc(std::string_view s) {
  std::string out;
  oasis::tokenizer::NormalizeUnicode(s, oasis::tokenizer::UnicodeForm::kNfc, &out);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& t = GetTokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Encode / Decode round trip.
  const auto ids = t.Encode(text, size % 2 ? AddSpecialTokens::kYes : AddSpecialTokens::kNo);
  const std::string decoded = t.Decode(ids, SkipSpecialTokens::kNo);
  OASIS_CHECK(oasis::tokenizer::IsValidUtf8(decoded)) << "Decode produced invalid UTF-8";
  std::string repaired;
  oasis::tokenizer::AppendUtf8Lossy(text, &repaired);
  if (size % 2 == 0) {  // no BOS-style tokens were added
    OASIS_CHECK(Nfc(decoded) == Nfc(repaired)) << "round trip lost text";
  }
  for (int32_t id : ids) OASIS_CHECK(t.IsKnown(id)) << "Encode produced unknown id " << id;

  // The input as ids (2 bytes each, spread over the vocabulary and a little past it).
  std::vector<int32_t> raw_ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    const uint32_t v = (uint32_t{data[i]} << 8) | data[i + 1];
    raw_ids.push_back(static_cast<int32_t>(v * (t.vocab_size() + 64) / 65536) - 8);
  }
  const std::vector<int32_t>* sequences[] = {&ids, &raw_ids};
  for (const std::vector<int32_t>* seq : sequences) {
    for (SkipSpecialTokens skip : {SkipSpecialTokens::kNo, SkipSpecialTokens::kYes}) {
      oasis::tokenizer::IncrementalDetokenizer detok(t, skip);
      std::string streamed;
      for (int32_t id : *seq) {
        const std::string piece = detok.Push(id);
        OASIS_CHECK(oasis::tokenizer::IsValidUtf8(piece)) << "partial UTF-8 streamed";
        OASIS_CHECK_LE(detok.pending_bytes(), size_t{3});
        streamed += piece;
      }
      streamed += detok.Finish();
      OASIS_CHECK(streamed == t.Decode(*seq, skip)) << "stream differs from Decode";
    }
  }
  return 0;
}

// Loads the tokenizer before fuzzing starts, so the load is not charged to the first input's
// time limit (the real tokenizer.json takes seconds to parse under ASan).
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  GetTokenizer();
  return 0;
}
