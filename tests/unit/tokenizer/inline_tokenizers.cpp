#include "inline_tokenizers.h"

#include "tokenizer/byte_level.h"

namespace oasis::tokenizer::testing {

Json ByteLevelTokenizerJson(const RawMerges& merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelAlphabet()[b]] = b;
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [left, right] : merges) {
    const std::string merged = BytesToByteLevel(left + right);
    if (!vocab.contains(merged)) vocab[merged] = next++;
    merge_list.push_back(BytesToByteLevel(left) + " " + BytesToByteLevel(right));
  }
  Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                     {"use_regex", false}};
  return Json{
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({SplitStage({{"Regex", kQwenPattern}}, "Isolated", false),
                                       byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

Json SplitStage(const Json& pattern, const std::string& behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

Json AddedTokenJson(int id, const std::string& content, bool special, bool lstrip, bool rstrip,
                    bool single_word, bool normalized) {
  return {{"id", id},         {"content", content},         {"single_word", single_word},
          {"lstrip", lstrip}, {"rstrip", rstrip},           {"normalized", normalized},
          {"special", special}};
}

}  // namespace oasis::tokenizer::testing
