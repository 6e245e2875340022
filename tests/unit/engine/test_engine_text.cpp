// Text through the engine with the real Qwen3 tokenizer (tools/fetch_test_data.sh; the test
// WARNs and passes when it is absent) and the tiny fixture model on the CPU backend.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "engine/engine.h"
#include "test_engine_util.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;
using namespace oasis::engine_test;

// Text through the engine: the fixture model's ids (< 512) are valid Qwen3 ids, so the real
// tokenizer detokenizes them. Streamed text equals Decode; a stop string spanning a token
// boundary cuts text and tokens where the incremental text first contains it.
TEST_CASE("streamed text and stop strings through the engine (Qwen3 tokenizer)", "[engine]") {
  const auto path = testing::CacheDir() / "qwen3" / "tokenizer.json";
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path << " is absent (tools/fetch_test_data.sh)");
    return;
  }
  auto tok = tokenizer::Tokenizer::FromFile(path);
  REQUIRE(tok.ok());
  TinyModel tm(256);
  Engine engine(*tm.runner, tok->get(), {});
  engine.Start();
  EngineRequest base = Request("t", {300, 301, 302, 303, 304, 305}, 60);
  base.ignore_eos = true;
  base.detokenize = true;
  base.sampling.temperature = 20.0f;  // varied ids (the tiny model repeats one id greedily)
  base.sampling.seed = 99;
  auto s = engine.Submit(base);
  REQUIRE(s.ok());
  const Collected free_run = Drain(**s);
  REQUIRE(free_run.tokens.size() == 60);
  CHECK(free_run.text == (*tok)->Decode(free_run.tokens, tokenizer::SkipSpecialTokens::kYes));

  // Per-token text pieces as the incremental detokenizer produces them.
  std::vector<std::string> pieces;
  tokenizer::IncrementalDetokenizer detok(**tok, tokenizer::SkipSpecialTokens::kYes);
  for (int32_t t : free_run.tokens) pieces.push_back(detok.Push(t));
  // A 3-character ASCII stop string straddling a piece boundary, away from the start.
  std::string stop;
  std::string so_far;
  for (size_t k = 0; k + 1 < pieces.size() && stop.empty(); ++k) {
    so_far += pieces[k];
    const std::string next = pieces[k + 1];
    if (so_far.size() < 6 || next.empty()) continue;
    const std::string cand = so_far.substr(so_far.size() - 2) + next.substr(0, 1);
    if (std::all_of(cand.begin(), cand.end(), [](char ch) { return ch >= ' ' && ch < 127; }))
      stop = cand;
  }
  REQUIRE_FALSE(stop.empty());
  std::string acc;
  size_t k_stop = 0;
  for (; k_stop < pieces.size(); ++k_stop) {
    acc += pieces[k_stop];
    if (acc.find(stop) != std::string::npos) break;
  }
  REQUIRE(k_stop < pieces.size());
  for (bool include : {false, true}) {
    INFO("stop '" << stop << "' include " << include);
    EngineRequest r = base;
    r.stop = {stop};
    r.include_stop_str_in_output = include;
    auto st = engine.Submit(r);
    REQUIRE(st.ok());
    Collected c = Drain(**st);
    CHECK(c.reason == FinishReasonKind::kStop);
    CHECK(c.stop_reason == stop);
    CHECK(c.tokens ==
          std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + k_stop + 1));
    CHECK(c.text == acc.substr(0, acc.find(stop) + (include ? stop.size() : 0)));
  }
}
