// Encode throughput of OasisKV's tokenizer, single thread, on a text file — the same measurement
// as tools/bench_tokenizer.py makes for HF `tokenizers`, so the two can be compared in one run:
//
//   bench_tokenizer <tokenizer.json> <text file> [--reps N] [--mode whole|docs|both]
//
// Modes: "whole" encodes the file as one string; "docs" splits it at blank lines ("\n\n") and
// encodes each document separately (closer to serving many requests). One untimed warm-up pass,
// then N timed passes; prints the median MB/s (1 MB = 10^6 bytes of UTF-8 input), the number of
// ids and a checksum of them (FNV-1a 64 over the ids as little-endian uint32) that must equal the
// Python script's when both tokenizers agree. No special tokens are added.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

using oasis::tokenizer::AddSpecialTokens;
using oasis::tokenizer::Tokenizer;

struct Pass {
  double seconds = 0;
  uint64_t ids = 0;
  uint64_t checksum = 0;
};

uint64_t Fnv1a(uint64_t h, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    const auto v = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (v >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

Pass RunPass(const Tokenizer& t, const std::vector<std::string_view>& docs) {
  Pass p;
  p.checksum = 0xcbf29ce484222325ULL;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> results;
  results.reserve(docs.size());
  for (std::string_view doc : docs) results.push_back(t.Encode(doc, AddSpecialTokens::kNo));
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& ids : results) {
    p.ids += ids.size();
    p.checksum = Fnv1a(p.checksum, ids);
  }
  return p;
}

void Bench(const Tokenizer& t, const std::string& mode, const std::vector<std::string_view>& docs,
           size_t bytes, int reps) {
  RunPass(t, docs);  // warm-up (fills the BPE word cache, as HF's)
  std::vector<double> mbps;
  Pass last;
  for (int r = 0; r < reps; ++r) {
    last = RunPass(t, docs);
    mbps.push_back(static_cast<double>(bytes) / 1e6 / last.seconds);
  }
  std::sort(mbps.begin(), mbps.end());
  std::printf(
      "oasis %-5s %9.2f MB/s median of %d (min %.2f, max %.2f); %zu docs, %zu bytes, "
      "%llu ids, checksum %016llx\n",
      mode.c_str(), mbps[mbps.size() / 2], reps, mbps.front(), mbps.back(), docs.size(), bytes,
      static_cast<unsigned long long>(last.ids), static_cast<unsigned long long>(last.checksum));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s <tokenizer.json> <text file> [--reps N] [--mode whole|docs|both]\n",
                 argv[0]);
    return 2;
  }
  int reps = 7;
  std::string mode = "both";
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
  }
  auto tokenizer = Tokenizer::FromFile(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", argv[2]);
    return 1;
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();

  if (mode == "whole" || mode == "both") Bench(**tokenizer, "whole", {text}, text.size(), reps);
  if (mode == "docs" || mode == "both") {
    std::vector<std::string_view> docs;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t end = text.find("\n\n", pos);
      if (end == std::string::npos) end = text.size();
      docs.push_back(std::string_view(text).substr(pos, end - pos));
      pos = end + 2;
    }
    Bench(**tokenizer, "docs", docs, text.size(), reps);
  }
  return 0;
}
