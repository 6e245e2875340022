// Encode throughput of OasisKV's tokenizer, single thread, on a text file — the same measurement
// as tools/bench_tokenizer.py makes for HF `tokenizers`, so the two can be compared in one run:
//
//   bench_tokenizer <tokenizer.json> <text file> [--reps N] [--mode whole|docs|both]
//
// Bad arguments (an unknown flag, --reps outside [1, 1000000], another --mode, a directory or
// an empty file as the text) are errors (exit 2 for flags, 1 for files); --help prints usage.
//
// Modes: "whole" encodes the file as one string; "docs" splits it at blank lines ("\n\n") and
// encodes each document separately (closer to serving many requests). One untimed warm-up pass,
// then N timed passes; prints the median MB/s (1 MB = 10^6 bytes of UTF-8 input), the number of
// ids and a checksum of them (FNV-1a 64 over the ids as little-endian uint32) that must equal the
// Python script's when both tokenizers agree. No special tokens are added.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

constexpr const char* kUsage =
    "usage: bench_tokenizer <tokenizer.json> <text file> [--reps N] [--mode whole|docs|both]\n"
    "  encode MB/s of OasisKV's tokenizer, single thread (compare tools/bench_tokenizer.py)\n"
    "  --reps N   timed passes after one warm-up, 1 to 1000000 (default 7)\n"
    "  --mode M   whole (the file as one string), docs (split at blank lines) or both "
    "(default)\n"
    "  --help     this text\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "bench_tokenizer: %s\n%s", error.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  std::string mode = "both";
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positional.push_back(arg);
      continue;
    }
    std::string value;
    const size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    if (name != "--reps" && name != "--mode") return Usage("unknown flag " + name);
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Usage(name + " needs a value");
    }
    if (name == "--reps") {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1000000)
        return Usage("--reps must be an integer in [1, 1000000], got '" + value + "'");
      reps = static_cast<int>(v);
    } else {
      if (value != "whole" && value != "docs" && value != "both")
        return Usage("--mode must be whole, docs or both, got '" + value + "'");
      mode = value;
    }
  }
  if (positional.size() != 2) {
    return Usage("expected 2 arguments (<tokenizer.json> <text file>), got " +
                 std::to_string(positional.size()));
  }
  auto tokenizer = Tokenizer::FromFile(positional[0]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const std::string& text_path = positional[1];
  std::error_code ec;
  if (std::filesystem::is_directory(text_path, ec)) {
    std::fprintf(stderr, "bench_tokenizer: %s is a directory, not a text file\n",
                 text_path.c_str());
    return 1;
  }
  if (std::filesystem::exists(text_path, ec) && !std::filesystem::is_regular_file(text_path, ec)) {
    std::fprintf(stderr, "bench_tokenizer: %s is not a regular file\n", text_path.c_str());
    return 1;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot open %s\n", text_path.c_str());
    return 1;
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  if (text.empty()) {
    std::fprintf(stderr, "bench_tokenizer: %s is empty: nothing to encode\n", text_path.c_str());
    return 1;
  }

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
