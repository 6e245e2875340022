// oasis-server settings: config files, flags overriding them, range checks, and every
// committed configs/*.json parsing with known keys.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/host_memory.h"
#include "server/server_config.h"
#include "test_support.h"

using namespace oasis;
using namespace oasis::server;

namespace {

StatusOr<ParsedCommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "oasis-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

// `args` (a flag and its value) is refused: InvalidArgument naming the flag.
void ExpectBadFlag(const std::vector<std::string>& args) {
  auto r = Parse(args);
  INFO(args[0] << " " << args[1]);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message().find(args[0]) != std::string::npos);
}

}  // namespace

TEST_CASE("server settings: defaults") {
  auto p = Parse({});
  REQUIRE(p.ok());
  const ServerConfig& c = p->config;
  CHECK(c.host == "127.0.0.1");
  CHECK(c.port == 8000);
  CHECK(c.grpc_port == 0);
  CHECK(c.grpc_max_concurrent_calls == 256);
  CHECK(c.backend == "auto");
  CHECK(c.gpu_memory_utilization == Approx(0.9));
  CHECK(c.model.empty());
  CHECK(c.ResolvedModelName() == "oasis-embedded");
  CHECK(std::filesystem::exists(std::filesystem::path(EmbeddedModelDir()) / "config.json"));
}

TEST_CASE("a config file, overridden by flags") {
  const auto dir = oasis::testing::MakeTempDir("server_config");
  const auto file = dir / "c.json";
  std::ofstream(file) << R"({"model": "/m", "max_num_seqs": 7, "port": 9001, "gpu-memory-utilization": 0.5,
                              "_comment": "ignored"})";
  auto p = Parse({"--config", file.string(), "--port", "9002"});
  REQUIRE(p.ok());
  CHECK(p->config.model == "/m");
  CHECK(p->config.max_num_seqs == 7);
  CHECK(p->config.port == 9002);  // the flag wins
  CHECK(p->config.gpu_memory_utilization == Approx(0.5));
  CHECK(p->config.ResolvedModelName() == "m");  // the name, not the path
}

TEST_CASE("bad settings are InvalidArgument naming them") {
  const auto dir = oasis::testing::MakeTempDir("server_config_bad");
  const auto unknown = dir / "u.json";
  std::ofstream(unknown) << R"({"modle": "/m"})";
  auto p = Parse({"--config", unknown.string()});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("modle") != std::string::npos);
  const auto typed = dir / "t.json";
  std::ofstream(typed) << R"({"port": "80"})";
  p = Parse({"--config", typed.string()});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("port") != std::string::npos);
  CHECK(Parse({"--config", (dir / "missing.json").string()}).status().code() == StatusCode::kNotFound);
  CHECK(Parse({"--port", "70000"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--backend", "tpu"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--gpu-memory-utilization", "1.5"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--max-num-seqs", "0"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--grpc-port", "8000"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--grpc-max-concurrent-calls", "0"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--grpc-max-concurrent-calls", "65537"}).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(Parse({"--grpc-max-concurrent-calls", "1"})->config.grpc_max_concurrent_calls == 1);
  CHECK(Parse({"--grpc-max-concurrent-calls", "65536"}).ok());
  CHECK(Parse({"--load-format", "gguf"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--no-such-flag"}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("max-num-batched-tokens: auto resolves by backend and GPU memory, explicit wins") {
  constexpr size_t kGiB = size_t{1} << 30;
  auto p = Parse({});
  REQUIRE(p.ok());
  const ServerConfig& c = p->config;
  CHECK(c.max_num_batched_tokens == 0);  // auto
  CHECK(c.ResolvedMaxNumBatchedTokens("cpu", 0) == 2048);
  CHECK(c.ResolvedMaxNumBatchedTokens("cpu", 141 * kGiB) == 2048);  // memory of no GPU used
  CHECK(c.ResolvedMaxNumBatchedTokens("cuda", 0) == 2048);          // unknown: the small value
  CHECK(c.ResolvedMaxNumBatchedTokens("cuda", 70 * kGiB - 1) == 2048);
  CHECK(c.ResolvedMaxNumBatchedTokens("cuda", 70 * kGiB) == 8192);
  CHECK(c.ResolvedMaxNumBatchedTokens("cuda", 139 * kGiB) == 8192);  // H200 as the driver reports
  auto given = Parse({"--max-num-batched-tokens", "1"});
  REQUIRE(given.ok());
  CHECK(given->config.ResolvedMaxNumBatchedTokens("cuda", 139 * kGiB) == 1);
  CHECK(Parse({"--max-num-batched-tokens", "4096"})->config.ResolvedMaxNumBatchedTokens("cpu", 0) ==
        4096);
  CHECK(Parse({"--max-num-batched-tokens", "0"}).ok());
  auto bad = Parse({"--max-num-batched-tokens", "-1"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("max-num-batched-tokens") != std::string::npos);
}

TEST_CASE("HTTP front settings: defaults and edges") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.max_connections == 4096);
  CHECK(p->config.keep_alive_timeout_s == 5);
  CHECK(p->config.header_timeout_s == 10);
  CHECK(p->config.body_timeout_s == 60);
  CHECK(p->config.write_timeout_s == 30);
  CHECK(p->config.shutdown_timeout_s == 10);
  CHECK(p->config.http_threads == 0);
  const auto bad = ExpectBadFlag;
  bad({"--max-connections", "0"});
  bad({"--max-connections", "-5"});
  bad({"--max-connections", "1000001"});
  bad({"--http-threads", "-1"});
  bad({"--http-threads", "1025"});
  for (const char* flag : {"--keep-alive-timeout-s", "--header-timeout-s", "--body-timeout-s",
                           "--write-timeout-s"}) {
    bad({flag, "0"});
    bad({flag, "-1"});
    bad({flag, "nan"});
    bad({flag, "inf"});
    bad({flag, "86401"});
    CHECK(Parse({flag, "0.001"}).ok());
    CHECK(Parse({flag, "86400"}).ok());
  }
  bad({"--shutdown-timeout-s", "-0.5"});
  bad({"--shutdown-timeout-s", "nan"});
  bad({"--shutdown-timeout-s", "1e9"});
  CHECK(Parse({"--shutdown-timeout-s", "0"}).ok());  // cut at once
  CHECK(Parse({"--max-connections", "1"}).ok());
  CHECK(Parse({"--max-connections", "1000000"}).ok());
  CHECK(Parse({"--http-threads", "1024"}).ok());
}

TEST_CASE("engine and memory settings: upper bounds and non-finite sizes are refused") {
  const auto bad = ExpectBadFlag;
  // Counts past their bounds (they overflowed sizes, or were cut to 32 bits).
  bad({"--threads", "1025"});
  bad({"--threads", "4295067296"});
  bad({"--max-num-seqs", "1048577"});
  bad({"--max-num-seqs", "9223372036854775807"});
  bad({"--num-kv-slots", "2147483648"});
  bad({"--max-model-len", "4294967296"});
  CHECK(Parse({"--threads", "1024"}).ok());
  CHECK(Parse({"--max-num-seqs", "1048576"}).ok());
  CHECK(Parse({"--num-kv-slots", "2147483647"}).ok());  // refused later if the memory lacks
  CHECK(Parse({"--max-model-len", "2147483647"}).ok());
  // GiB sizes: finite (nan and inf passed before; one message had no flag name).
  for (const char* flag : {"--host-kv-gib", "--staging-pool-gib", "--remote-kv-gib"}) {
    bad({flag, "nan"});
    bad({flag, "inf"});
    bad({flag, "-0.5"});
  }
  bad({"--remote-kv-gib", "1e9"});  // summaries larger than any machine's memory
  CHECK(Parse({"--remote-kv-gib", "-1"}).ok());
  CHECK(Parse({"--staging-pool-gib", "0"}).ok());
}

TEST_CASE("every committed configs/*.json parses and validates") {
  const auto dir = oasis::testing::SourceDir() / "configs";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path());
    ServerConfig c;
    Status st = LoadConfigFile(entry.path().string(), &c);
    CHECK(st.ok());
    CHECK(c.Validate().ok());
    // No committed config sets what its own mode ignores.
    auto p = Parse({"--config", entry.path().string()});
    REQUIRE(p.ok());
    for (const std::string& line : p->ignored) FAIL_CHECK(line);
    ++n;
  }
  CHECK(n >= 2);
}

TEST_CASE("settings the chosen mode ignores are reported, from flags and the config file") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->ignored.empty());
  // Sparse settings without sparse KV (auto with no threshold is off).
  p = Parse({"--topk-blocks", "64", "--sparse-budget", "fixed"});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 2);
  CHECK(p->ignored[0].find("--topk-blocks has no effect: sparse KV is off (--sparse auto") == 0);
  CHECK(p->ignored[1].find("--sparse-budget has no effect") == 0);
  p = Parse({"--sparse", "off", "--sparse-threshold", "4096", "--kv-home", "hbm"});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 2);
  CHECK(p->ignored[0] == "--kv-home has no effect: sparse KV is off (--sparse off)");
  CHECK(p->ignored[1] == "--sparse-threshold has no effect: sparse KV is off (--sparse off)");
  // The same settings with sparse KV on: nothing to report.
  CHECK(Parse({"--sparse-threshold", "4096", "--topk-blocks", "64", "--kv-home", "hbm"})
            ->ignored.empty());
  CHECK(Parse({"--sparse", "on", "--sparse-budget", "fixed"})->ignored.empty());
  // Another role's settings.
  p = Parse({"--staging-pool-gib", "4", "--rpf", "off", "--ucx-tls", "tcp"});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 3);
  CHECK(p->ignored[0].find("--staging-pool-gib has no effect: it applies to a --role prefill") == 0);
  CHECK(p->ignored[1].find("--rpf has no effect: it applies to a --role decode") == 0);
  CHECK(p->ignored[2].find("--ucx-tls has no effect") == 0);
  p = Parse({"--role", "prefill", "--staging-pool-gib", "4", "--rpf", "off"});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 1);
  CHECK(p->ignored[0].find("--rpf has no effect") == 0);
  // The CPU backend's settings on CUDA and the other way round.
  p = Parse({"--backend", "cuda", "--threads", "8"});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 1);
  CHECK(p->ignored[0].find("--threads has no effect: it applies to the CPU backend") == 0);
  CHECK(Parse({"--backend", "cpu", "--threads", "8"})->ignored.empty());
  CHECK(Parse({"--backend", "cpu", "--enforce-eager"})->ignored.size() == 1);
  // From a config file (keys with '_' too).
  const auto dir = oasis::testing::MakeTempDir("server_config_ignored");
  const auto file = dir / "c.json";
  std::ofstream(file) << R"({"sparse_budget": "fixed", "max-sparse-seqs": 8})";
  p = Parse({"--config", file.string()});
  REQUIRE(p.ok());
  REQUIRE(p->ignored.size() == 2);
  CHECK(p->ignored[0].find("--sparse-budget has no effect") == 0);
  CHECK(p->ignored[1].find("--max-sparse-seqs has no effect") == 0);
  // ... and turned on by a flag: nothing left to report.
  CHECK(Parse({"--config", file.string(), "--sparse", "on"})->ignored.empty());
}

TEST_CASE("lookahead settings: draft model, dummy heads, modes") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.lookahead == "auto");
  CHECK_FALSE(p->config.HasDraftModel());
  CHECK(p->config.ResolvedLookahead() == "off");
  CHECK(p->config.draft_vocab_size == 32000);

  p = Parse({"--draft-model", "/heads/h"});
  REQUIRE(p.ok());
  CHECK(p->config.draft_model == "/heads/h");
  CHECK(p->config.ResolvedLookahead() == "reject");  // a draft model turns it on
  p = Parse({"--draft-load-format", "dummy", "--lookahead", "speculate", "--draft-vocab-size", "100"});
  REQUIRE(p.ok());
  CHECK(p->config.HasDraftModel());
  CHECK(p->config.ResolvedLookahead() == "speculate");
  CHECK(p->config.draft_vocab_size == 100);
  p = Parse({"--draft-model", "/heads/h", "--lookahead", "off"});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedLookahead() == "off");

  for (const char* mode : {"reject", "speculate"}) {
    p = Parse({"--lookahead", mode});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    CHECK(p.status().message().find("needs an EAGLE-3 draft head") != std::string::npos);
  }
  p = Parse({"--lookahead", "maybe"});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("--lookahead must be one of") != std::string::npos);
  CHECK(Parse({"--draft-load-format", "gguf"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--draft-vocab-size", "0"}).status().code() == StatusCode::kInvalidArgument);

  const auto dir = oasis::testing::MakeTempDir("server_config_lookahead");
  const auto file = dir / "l.json";
  std::ofstream(file) << R"({"draft_model": "/heads/h", "lookahead": "speculate", "draft-vocab-size": 7})";
  p = Parse({"--config", file.string()});
  REQUIRE(p.ok());
  CHECK(p->config.draft_model == "/heads/h");
  CHECK(p->config.ResolvedLookahead() == "speculate");
  CHECK(p->config.ToJson()["lookahead"] == "speculate");
}

TEST_CASE("num-speculative-tokens flag: 1..4, needs speculate, auto resolves to it") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.num_speculative_tokens == 1);
  p = Parse({"--draft-load-format", "dummy", "--num-speculative-tokens", "3"});
  REQUIRE(p.ok());
  CHECK(p->config.num_speculative_tokens == 3);
  CHECK(p->config.ResolvedLookahead() == "speculate");  // auto with a chain: speculate
  CHECK(p->config.ToJson()["num-speculative-tokens"] == 3);
  p = Parse({"--draft-load-format", "dummy", "--lookahead", "speculate", "--num-speculative-tokens", "4"});
  REQUIRE(p.ok());
  p = Parse({"--draft-load-format", "dummy", "--num-speculative-tokens", "1"});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedLookahead() == "reject");
  for (const char* v : {"0", "5", "-2"}) {
    p = Parse({"--draft-load-format", "dummy", "--lookahead", "speculate", "--num-speculative-tokens", v});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    CHECK(p.status().message().find("--num-speculative-tokens must be 1 to 4") != std::string::npos);
  }
  p = Parse({"--num-speculative-tokens", "three"});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("num-speculative-tokens") != std::string::npos);
  for (const char* mode : {"reject", "off"}) {
    p = Parse({"--draft-load-format", "dummy", "--lookahead", mode, "--num-speculative-tokens", "2"});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().message().find("needs --lookahead speculate") != std::string::npos);
  }
  p = Parse({"--num-speculative-tokens", "2"});  // no head: auto resolves to off
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("needs --lookahead speculate") != std::string::npos);
  // QA round 5: each case gives its own reason (all of them said "--lookahead reject stacks one
  // draft", which describes neither off nor a missing head).
  auto reason = [](std::vector<std::string> args) {
    auto r = Parse(std::move(args));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("reject stacks one draft") == std::string::npos);
    return std::string(r.status().message());
  };
  CHECK_THAT(reason({"--draft-load-format", "dummy", "--lookahead", "off", "--num-speculative-tokens", "2"}),
             Catch::Contains("--lookahead off runs no drafts") && !Catch::Contains("draft head"));
  CHECK_THAT(reason({"--lookahead", "off", "--num-speculative-tokens", "2"}),
             Catch::Contains("--lookahead off runs no drafts") && Catch::Contains("EAGLE-3 draft head"));
  CHECK_THAT(reason({"--draft-load-format", "dummy", "--lookahead", "reject", "--num-speculative-tokens", "3"}),
             Catch::Contains("--lookahead reject verifies one draft per step"));
  CHECK_THAT(reason({"--num-speculative-tokens", "2"}),
             Catch::Contains("EAGLE-3 draft head") && Catch::Contains("there is none") &&
                 Catch::Contains("--lookahead auto resolves to off"));
}

TEST_CASE("speculative-depth flag: fixed by default, adaptive needs a chain to choose from") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.speculative_depth == "fixed");
  CHECK(p->config.ToJson()["speculative-depth"] == "fixed");
  p = Parse({"--draft-load-format", "dummy", "--num-speculative-tokens", "3", "--speculative-depth", "adaptive"});
  REQUIRE(p.ok());
  CHECK(p->config.speculative_depth == "adaptive");
  CHECK(p->config.ResolvedLookahead() == "speculate");
  CHECK(p->config.ToJson()["speculative-depth"] == "adaptive");
  p = Parse({"--draft-load-format", "dummy", "--lookahead", "speculate", "--num-speculative-tokens", "4",
             "--speculative-depth", "fixed"});
  REQUIRE(p.ok());
  // Unknown values, in any case or spelling, are refused naming the choices.
  for (const char* v : {"auto", "Adaptive", "", "3", "dynamic"}) {
    p = Parse({"--draft-load-format", "dummy", "--num-speculative-tokens", "3", "--speculative-depth", v});
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidArgument);
    CHECK(p.status().message() ==
          std::string("--speculative-depth must be one of fixed, adaptive, got '") + v + "'");
  }
  // Adaptive picks the depth in 1..k: k = 1 leaves nothing to pick, and k > 1 needs speculate.
  p = Parse({"--draft-load-format", "dummy", "--lookahead", "speculate", "--speculative-depth", "adaptive"});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("--speculative-depth adaptive") != std::string::npos);
  CHECK(p.status().message().find("--num-speculative-tokens 2 to 4") != std::string::npos);
  p = Parse({"--speculative-depth", "adaptive"});  // no head at all
  REQUIRE_FALSE(p.ok());
  p = Parse({"--draft-load-format", "dummy", "--lookahead", "reject", "--num-speculative-tokens", "3",
             "--speculative-depth", "adaptive"});
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("needs --lookahead speculate") != std::string::npos);
  p = Parse({"--draft-load-format", "dummy", "--num-speculative-tokens", "3", "--speculative-depth"});
  REQUIRE_FALSE(p.ok());  // a value is required
}

TEST_CASE("sparse KV settings: on/off, defaults, resolved predictor and threshold, errors") {
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK_FALSE(p->config.SparseEnabled());
  CHECK(p->config.topk_blocks == 128);
  CHECK(p->config.fetch_ratio == 0.05);
  CHECK(p->config.sparse_group_reduce == "sum");
  p = Parse({"--sparse-threshold", "4096"});  // auto: a threshold turns it on
  REQUIRE(p.ok());
  CHECK(p->config.SparseEnabled());
  CHECK(p->config.ResolvedSparseThreshold() == 4096);
  CHECK(p->config.ResolvedSparsePredictor() == "previous-query");  // no draft head
  p = Parse({"--sparse", "on", "--topk-blocks", "64"});
  REQUIRE(p.ok());
  CHECK(p->config.SparseEnabled());
  CHECK(p->config.ResolvedSparseThreshold() == 65 * 16);  // one working set
  CHECK(p->config.ResolvedSparseSwitch() == "pressure");  // the default with every layer sparse
  p = Parse({"--sparse", "off", "--sparse-threshold", "100"});
  REQUIRE(p.ok());
  CHECK_FALSE(p->config.SparseEnabled());
  p = Parse({"--sparse", "on", "--draft-load-format", "dummy", "--host-kv-gib", "2.5", "--dense-layers", "2",
             "--sparse-group-reduce", "max", "--max-sparse-seqs", "16", "--fetch-ratio", "0.1",
             "--sparse-agreement-interval", "4"});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedSparsePredictor() == "draft");  // lookahead reject with the head
  CHECK(p->config.host_kv_gib == 2.5);
  CHECK(p->config.dense_layers == 2);
  CHECK(p->config.ResolvedSparseSwitch() == "threshold");  // dense layers: whole tables cannot move
  CHECK(p->config.sparse_group_reduce == "max");
  CHECK(p->config.max_sparse_seqs == 16);
  CHECK(p->config.fetch_ratio == 0.1);
  CHECK(p->config.sparse_agreement_interval == 4);
  CHECK(p->config.sparse_transfers == "on");
  CHECK(p->config.sparse_budget == "adaptive");  // the default
  p = Parse({"--sparse", "on", "--sparse-budget", "adaptive", "--fetch-ratio", "1"});
  REQUIRE(p.ok());
  CHECK(p->config.sparse_budget == "adaptive");
  CHECK(p->config.fetch_ratio == 1.0);  // the adaptive caps' bound
  p = Parse({"--sparse", "on", "--sparse-transfers", "off"});
  REQUIRE(p.ok());
  CHECK(p->config.sparse_transfers == "off");
  p = Parse({"--sparse", "on", "--sparse-predictor", "oracle"});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedSparsePredictor() == "oracle");

  auto error = [](std::vector<std::string> args) {
    auto r = Parse(std::move(args));
    return r.ok() ? std::string("OK") : r.status().message();
  };
  CHECK(error({"--sparse", "yes"}).find("--sparse must be one of") != std::string::npos);
  CHECK(error({"--sparse", "on", "--sparse-predictor", "draft"}).find("needs lookahead") != std::string::npos);
  CHECK(error({"--sparse-threshold", "64", "--sparse-predictor", "draft", "--draft-load-format", "dummy",
               "--lookahead", "off"})
            .find("needs lookahead") != std::string::npos);
  CHECK(error({"--sparse-predictor", "draft"}) == "OK");  // sparse off: not used
  CHECK(error({"--sparse-predictor", "next"}).find("--sparse-predictor") != std::string::npos);
  CHECK(error({"--sparse-switch", "sometimes"}).find("--sparse-switch must be one of auto, threshold, pressure") !=
        std::string::npos);
  CHECK(error({"--sparse", "on", "--dense-layers", "1", "--sparse-switch", "pressure"})
            .find("--sparse-switch pressure needs --dense-layers 0") != std::string::npos);
  CHECK(error({"--sparse", "on", "--dense-layers", "1", "--sparse-switch", "threshold"}) == "OK");
  CHECK(error({"--sparse", "on", "--sparse-switch", "threshold"}) == "OK");
  CHECK(error({"--sparse-budget", "dynamic"}).find("--sparse-budget must be one of fixed, adaptive") !=
        std::string::npos);
  CHECK(error({"--sparse-budget", ""}).find("--sparse-budget must be one of fixed, adaptive") !=
        std::string::npos);
  CHECK(error({"--sparse-budget", "Adaptive"}).find("--sparse-budget") != std::string::npos);  // exact
  CHECK(error({"--sparse-budget", "fixed"}) == "OK");
  CHECK(error({"--sparse-group-reduce", "mean"}).find("--sparse-group-reduce") != std::string::npos);
  CHECK(error({"--fetch-ratio", "1.5"}).find("--fetch-ratio") != std::string::npos);
  CHECK(error({"--topk-blocks", "0"}).find("--topk-blocks") != std::string::npos);
  CHECK(error({"--host-kv-gib", "-1"}).find("--host-kv-gib") != std::string::npos);
  CHECK(error({"--remote-kv-gib", "-2"}).find("--remote-kv-gib must be >= 0 or -1") != std::string::npos);
  CHECK(error({"--remote-kv-gib", "-1"}) == "OK");  // as much as --host-kv-gib
  CHECK(error({"--remote-kv-gib", "0"}) == "OK");
  CHECK(error({"--remote-kv-gib", "12.5"}) == "OK");
  CHECK(error({"--sparse-threshold", "-5"}).find("--sparse-threshold") != std::string::npos);
  // QA round 5: the threshold's own range, checked without the model (exit 2): at least one block
  // with sparse KV on (15 was refused as the model loaded, exit 1), at most 2^31 - 1 (2^31 was
  // refused blaming --host-kv-gib).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--sparse-threshold", "15"}, {"--sparse-threshold", "1"},
        {"--sparse", "on", "--sparse-threshold", "8"}, {"--role", "prefill", "--sparse-threshold", "15"}}) {
    auto r = Parse(args);
    INFO(args[0] << " " << args[1]);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()),
               Catch::StartsWith("--sparse-threshold must be at least one block (16 tokens)"));
  }
  CHECK(error({"--sparse-threshold", "16"}) == "OK");
  CHECK(error({"--sparse", "off", "--sparse-threshold", "15"}) == "OK");  // not read
  CHECK(error({"--sparse-threshold", "2147483648"}) == "--sparse-threshold must be at most 2147483647, got 2147483648");
  CHECK(error({"--sparse", "off", "--sparse-threshold", "2147483648"}).find("at most 2147483647") != std::string::npos);
  CHECK(error({"--sparse-threshold", "2147483647"}) == "OK");  // the context is checked as the model loads
  // --max-sparse-seqs: at most kMaxSparseSeqs (2^31 was cut to 65536 without a word).
  CHECK(error({"--sparse", "on", "--max-sparse-seqs", "2147483648"}) ==
        "--max-sparse-seqs must be at most 65536, got 2147483648");
  CHECK(error({"--sparse", "on", "--max-sparse-seqs", "65537"}).find("at most 65536") != std::string::npos);
  CHECK(error({"--sparse", "on", "--max-sparse-seqs", "65536"}) == "OK");
  CHECK(error({"--sparse", "on", "--max-sparse-seqs", "1000"}) == "OK");  // past --max-num-seqs: logged
  CHECK(error({"--dense-layers", "-1"}).find("--dense-layers") != std::string::npos);
  CHECK(error({"--sparse-transfers", "maybe"}).find("--sparse-transfers must be on or off") != std::string::npos);

  // The config file keys.
  ServerConfig c;
  REQUIRE(ApplyConfigJson(nlohmann::json::parse(R"({"sparse": "on", "host_kv_gib": 8, "topk-blocks": 32,
      "sparse_threshold": 1000, "sparse_predictor": "previous-query", "sparse_budget": "fixed"})"), "test", &c).ok());
  CHECK(c.sparse_budget == "fixed");  // not the default (adaptive)
  CHECK(c.SparseEnabled());
  CHECK(c.host_kv_gib == 8.0);
  CHECK(c.topk_blocks == 32);
  CHECK(c.ResolvedSparseThreshold() == 1000);
  CHECK_FALSE(ApplyConfigJson(nlohmann::json::parse(R"({"host_kv_gib": "8"})"), "test", &c).ok());
  // An integer past int64 is refused, not wrapped (18446744073709551615 read as -1).
  const Status big =
      ApplyConfigJson(nlohmann::json::parse(R"({"max_num_seqs": 18446744073709551615})"), "test", &c);
  CHECK_FALSE(big.ok());
  CHECK(big.message().find("too large") != std::string::npos);
  CHECK(big.message().find("18446744073709551615") != std::string::npos);
}

TEST_CASE("the served model name: the model directory's name, never its path") {
  CHECK(ModelNameFromPath("/models/Qwen3-8B") == "Qwen3-8B");
  CHECK(ModelNameFromPath("/models/Qwen3-8B/") == "Qwen3-8B");
  CHECK(ModelNameFromPath("/models/Qwen3-8B//") == "Qwen3-8B");
  CHECK(ModelNameFromPath("models/./Qwen3-8B") == "Qwen3-8B");
  CHECK(ModelNameFromPath("/data/hub/Qwen/../meta-llama/Llama-3.1-8B") == "Llama-3.1-8B");
  CHECK(ModelNameFromPath("Qwen3-8B") == "Qwen3-8B");
  // "." and "..": the directory they name (here: the current directory's own name).
  const std::string cwd = std::filesystem::current_path().filename().string();
  CHECK(ModelNameFromPath(".") == cwd);
  CHECK(ModelNameFromPath("./") == cwd);
  CHECK(ModelNameFromPath("..") == std::filesystem::current_path().parent_path().filename().string());
  CHECK(ModelNameFromPath("/") == "model");  // no name at all
  CHECK(ModelNameFromPath("/..") == "model");

  auto p = Parse({"--model", "/srv/secret-mount/models/Qwen3-8B/"});
  REQUIRE(p.ok());
  const ServerConfig& c = p->config;
  CHECK(c.ResolvedModelName() == "Qwen3-8B");
  CHECK(c.ResolvedModelName().find('/') == std::string::npos);
  // Requests may name the served model, or the --model path as given (vLLM clients send it),
  // also without its trailing '/' or with "." segments; nothing else.
  CHECK(c.ServesModelName(""));
  CHECK(c.ServesModelName("Qwen3-8B"));
  CHECK(c.ServesModelName("/srv/secret-mount/models/Qwen3-8B/"));
  CHECK(c.ServesModelName("/srv/secret-mount/models/Qwen3-8B"));
  CHECK(c.ServesModelName("/srv/secret-mount/./models/Qwen3-8B"));
  CHECK_FALSE(c.ServesModelName("/other/Qwen3-8B"));
  CHECK_FALSE(c.ServesModelName("Qwen3-8B/"));
  CHECK_FALSE(c.ServesModelName("qwen3-8b"));
  CHECK_FALSE(c.ServesModelName("models/Qwen3-8B"));
  CHECK_FALSE(c.ServesModelName("gpt-4"));

  // --served-model-name wins; the path is then no name of the model (as in vLLM).
  p = Parse({"--model", "/srv/models/Qwen3-8B", "--served-model-name", "qwen"});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedModelName() == "qwen");
  CHECK(p->config.ServesModelName("qwen"));
  CHECK_FALSE(p->config.ServesModelName("Qwen3-8B"));
  CHECK_FALSE(p->config.ServesModelName("/srv/models/Qwen3-8B"));
  // The embedded default model.
  p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.ResolvedModelName() == "oasis-embedded");
  CHECK(p->config.ServesModelName("oasis-embedded"));
  CHECK_FALSE(p->config.ServesModelName(EmbeddedModelDir()));
}

namespace {
// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};
}  // namespace

TEST_CASE("staging listener: follows --host, and needs a secret beyond loopback") {
  ScopedEnv no_env(kStagingSecretEnv, nullptr);
  auto p = Parse({});
  REQUIRE(p.ok());
  CHECK(p->config.staging_listen.empty());
  CHECK(p->config.ResolvedStagingListen() == "127.0.0.1:0");
  CHECK(Parse({"--host", "0.0.0.0"})->config.ResolvedStagingListen() == "0.0.0.0:0");
  CHECK(Parse({"--host", "::1"})->config.ResolvedStagingListen() == "[::1]:0");
  CHECK(Parse({"--host", "[::1]"})->config.ResolvedStagingListen() == "[::1]:0");
  CHECK(Parse({"--host", "0.0.0.0", "--staging-listen", "127.0.0.1:7000"})
            ->config.ResolvedStagingListen() == "127.0.0.1:7000");

  const auto check = [](std::vector<std::string> args) {
    auto parsed = Parse(std::move(args));
    REQUIRE(parsed.ok());
    return CheckStagingSecurity(parsed->config);
  };
  // Loopback (the default, from --host 127.0.0.1): no secret needed.
  CHECK(check({"--role", "prefill"}).ok());
  CHECK(check({"--role", "prefill", "--host", "localhost"}).ok());
  CHECK(check({"--role", "prefill", "--host", "0.0.0.0", "--staging-listen", "127.0.0.1:0"}).ok());
  // Beyond loopback without a secret: refused, naming the address and the ways to give one.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--role", "prefill", "--host", "0.0.0.0"},
           {"--role", "prefill", "--staging-listen", "0.0.0.0:5555"},
           {"--role", "prefill", "--host", "::"}}) {
    const Status st = check(args);
    INFO(args[args.size() - 1] << ": " << st.ToString());
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains("without a secret"));
    CHECK_THAT(st.message(), Catch::Contains("--staging-secret-file"));
    CHECK_THAT(st.message(), Catch::Contains(kStagingSecretEnv));
  }
  CHECK_THAT(check({"--role", "prefill", "--host", "0.0.0.0"}).message(),
             Catch::Contains("0.0.0.0:0 (0.0.0.0:0, from --host)"));
  // ... with one (flag, file or environment): fine.
  CHECK(check({"--role", "prefill", "--host", "0.0.0.0", "--staging-secret", "s"}).ok());
  const auto dir = oasis::testing::MakeTempDir("staging_secret");
  std::ofstream(dir / "secret") << "from-a-file\n";
  CHECK(check({"--role", "prefill", "--host", "0.0.0.0", "--staging-secret-file",
               (dir / "secret").string()})
            .ok());
  {
    ScopedEnv env(kStagingSecretEnv, "from-the-environment");
    CHECK(check({"--role", "prefill", "--host", "0.0.0.0"}).ok());
  }
  {
    ScopedEnv empty_env(kStagingSecretEnv, "");  // set but empty: no secret
    CHECK_FALSE(check({"--role", "prefill", "--host", "0.0.0.0"}).ok());
  }
  // Other roles listen on nothing: no check (decode sends a secret when it has one).
  CHECK(check({"--role", "decode", "--host", "0.0.0.0"}).ok());
  CHECK(check({"--host", "0.0.0.0"}).ok());
  // An address that does not resolve is an error, not a pass.
  CHECK(check({"--role", "prefill", "--staging-listen", "no-port"}).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("staging secret: flag, file or environment, and their errors") {
  ScopedEnv no_env(kStagingSecretEnv, nullptr);
  const auto dir = oasis::testing::MakeTempDir("staging_secret_sources");
  const auto secret_of = [](std::vector<std::string> args) {
    auto parsed = Parse(std::move(args));
    REQUIRE(parsed.ok());
    return ResolveStagingSecret(parsed->config);
  };
  CHECK(secret_of({}).value().empty());
  CHECK(secret_of({"--staging-secret", "flag"}).value() == "flag");
  // A file: trailing newlines (LF or CRLF) dropped, everything else kept.
  std::ofstream(dir / "lf") << "  file secret  \n";
  std::ofstream(dir / "crlf") << "crlf\r\n\r\n";
  std::ofstream(dir / "bare", std::ios::binary) << "bare";
  CHECK(secret_of({"--staging-secret-file", (dir / "lf").string()}).value() == "  file secret  ");
  CHECK(secret_of({"--staging-secret-file", (dir / "crlf").string()}).value() == "crlf");
  CHECK(secret_of({"--staging-secret-file", (dir / "bare").string()}).value() == "bare");
  {
    ScopedEnv env(kStagingSecretEnv, "env");
    CHECK(secret_of({}).value() == "env");
    // Explicit settings win over the environment.
    CHECK(secret_of({"--staging-secret", "flag"}).value() == "flag");
    CHECK(secret_of({"--staging-secret-file", (dir / "bare").string()}).value() == "bare");
  }
  const auto fails = [&](std::vector<std::string> args, const std::string& needle) {
    auto parsed = Parse(args);
    Status st = parsed.ok() ? ResolveStagingSecret(parsed->config).status() : parsed.status();
    INFO(st.ToString());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(st.message(), Catch::Contains(needle));
  };
  fails({"--staging-secret", "a", "--staging-secret-file", (dir / "bare").string()},
        "exclude each other");
  std::ofstream(dir / "empty");
  fails({"--staging-secret-file", (dir / "empty").string()}, "is empty");
  std::ofstream(dir / "newline") << "\n";
  fails({"--staging-secret-file", (dir / "newline").string()}, "is empty");
  fails({"--staging-secret-file", (dir / "missing").string()}, "cannot be read");
  fails({"--staging-secret-file", dir.string()}, "is a directory");
  fails({"--staging-secret", std::string(4097, 'k')}, "at most 4096 bytes");
  std::ofstream(dir / "long") << std::string(4097, 'k');
  fails({"--staging-secret-file", (dir / "long").string()}, "at most 4096 bytes, got 4097");
  CHECK(secret_of({"--staging-secret", std::string(4096, 'k')}).value().size() == 4096);
  {
    ScopedEnv env(kStagingSecretEnv, std::string(5000, 'e').c_str());
    fails({}, "$OASIS_STAGING_SECRET: the staging secret must be at most 4096 bytes");
  }
  // The secret never shows in the printed settings; the file's name may.
  auto parsed = Parse({"--staging-secret", "hunter2"});
  REQUIRE(parsed.ok());
  const std::string json = parsed->config.ToJson().dump();
  CHECK(json.find("hunter2") == std::string::npos);
  CHECK(parsed->config.ToJson()["staging-secret"] == "<set>");
  CHECK(Parse({})->config.ToJson()["staging-secret"] == "");
}

TEST_CASE("tool-call and reasoning parser settings (flags and config file)") {
  auto p = Parse({"--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser",
                  "qwen3"});
  REQUIRE(p.ok());
  CHECK(p->config.enable_auto_tool_choice);
  CHECK(p->config.tool_call_parser == "hermes");
  CHECK(p->config.reasoning_parser == "qwen3");
  CHECK_FALSE(Parse({})->config.enable_auto_tool_choice);
  CHECK(Parse({"--tool-call-parser", "llama3_json"}).ok());
  CHECK(Parse({"--reasoning-parser", "deepseek_r1"}).ok());
  auto needs_parser = Parse({"--enable-auto-tool-choice"});
  REQUIRE_FALSE(needs_parser.ok());
  CHECK(needs_parser.status().message().find("--tool-call-parser") != std::string::npos);
  auto bad = Parse({"--tool-call-parser", "mistral"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("hermes") != std::string::npos);
  CHECK_FALSE(Parse({"--reasoning-parser", "granite"}).ok());
  const auto dir = oasis::testing::MakeTempDir("server_config_tools");
  std::ofstream(dir / "t.json") << R"({"enable_auto_tool_choice": true, "tool-call-parser": "hermes"})";
  p = Parse({"--config", (dir / "t.json").string()});
  REQUIRE(p.ok());
  CHECK(p->config.enable_auto_tool_choice);
  CHECK(p->config.ToJson()["enable-auto-tool-choice"] == true);
  std::ofstream(dir / "bad.json") << R"({"enable_auto_tool_choice": "yes", "tool-call-parser": "hermes"})";
  CHECK(Parse({"--config", (dir / "bad.json").string()}).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("prefix caching flags: --enable-prefix-caching / --no-enable-prefix-caching (on by default where it reaches)") {
  auto resolved = [](std::vector<std::string> args) {
    auto p = Parse(std::move(args));
    REQUIRE(p.ok());
    return p->config.ResolvedPrefixCaching();
  };
  CHECK(Parse({})->config.enable_prefix_caching);
  CHECK(resolved({}));
  CHECK(resolved({"--enable-prefix-caching"}));
  CHECK_FALSE(resolved({"--no-enable-prefix-caching"}));
  CHECK(resolved({"--lookahead", "reject", "--draft-load-format", "dummy"}));
  CHECK(resolved({"--tensor-parallel-size", "2"}));
  CHECK(resolved({"--sparse", "on"}));
  CHECK(resolved({"--sparse-threshold", "4096", "--enable-prefix-caching"}));
  CHECK_FALSE(resolved({"--sparse", "on", "--no-enable-prefix-caching"}));
  // Both roles of disaggregation reuse: a prefill instance its GPU cache, a decode instance
  // the prompt blocks earlier imports left in its host store.
  CHECK(resolved({"--role", "prefill"}));
  CHECK(resolved({"--role", "prefill", "--enable-prefix-caching"}));
  CHECK(resolved({"--role", "decode"}));
  CHECK(resolved({"--role", "decode", "--enable-prefix-caching"}));
  CHECK_FALSE(resolved({"--role", "decode", "--no-enable-prefix-caching"}));
  // A config file key works as the flag does; the flag wins.
  const auto dir = oasis::testing::MakeTempDir("server_config_prefix");
  std::ofstream(dir / "on.json") << R"({"enable_prefix_caching": true, "role": "decode"})";
  std::ofstream(dir / "off.json") << R"({"enable-prefix-caching": false, "role": "decode"})";
  CHECK(resolved({"--config", (dir / "on.json").string()}));
  CHECK_FALSE(resolved({"--config", (dir / "off.json").string()}));
  CHECK_FALSE(resolved({"--config", (dir / "on.json").string(), "--no-enable-prefix-caching"}));
  CHECK(resolved({"--config", (dir / "off.json").string(), "--enable-prefix-caching"}));
}

TEST_CASE("prefix cache host tier flag: edges, prefix caching required, host memory counted") {
  auto parse = [](std::vector<std::string> args) { return Parse(std::move(args)); };
  CHECK(parse({})->config.prefix_cache_host_gib == 0);
  auto p = parse({"--prefix-cache-host-gib", "1.5"});
  REQUIRE(p.ok());
  CHECK(p->config.prefix_cache_host_gib == 1.5);
  CHECK(parse({"--prefix-cache-host-gib", "0"}).ok());
  CHECK(parse({"--prefix-cache-host-gib", "1", "--tensor-parallel-size", "2"}).ok());
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--prefix-cache-host-gib", "-1"},
        {"--prefix-cache-host-gib", "nan"},
        {"--prefix-cache-host-gib", "inf"},
        {"--prefix-cache-host-gib", "x"},
        {"--prefix-cache-host-gib", "1", "--no-enable-prefix-caching"},
        {"--prefix-cache-host-gib", "1", "--role", "decode"}}) {
    INFO(bad[1] << (bad.size() > 2 ? " " + bad[2] : ""));
    auto q = parse(bad);
    REQUIRE_FALSE(q.ok());
    CHECK(q.status().code() == StatusCode::kInvalidArgument);
  }
  CHECK_THAT(std::string(parse({"--prefix-cache-host-gib", "1", "--role", "decode"}).status().message()),
             Catch::Contains("--host-kv-gib"));
  // A config file key works as the flag does.
  const auto dir = oasis::testing::MakeTempDir("server_config_host_tier");
  std::ofstream(dir / "tier.json") << R"({"prefix-cache-host-gib": 2})";
  auto f = parse({"--config", (dir / "tier.json").string()});
  REQUIRE(f.ok());
  CHECK(f->config.prefix_cache_host_gib == 2);
  // More than the machine can hold is refused at start, the tier counted with the sparse store.
  ServerConfig c;
  c.prefix_cache_host_gib = 1e9;
  const Status st = CheckHostMemory(c);
  if (AvailableHostMemoryGiB()) {
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(st.message()), Catch::Contains("--prefix-cache-host-gib"));
  }
  c.prefix_cache_host_gib = 0.001;
  CHECK(CheckHostMemory(c).ok());
  if (const auto avail = AvailableHostMemoryGiB()) {
    c.sparse = "on";
    c.host_kv_gib = *avail * 0.6;
    c.prefix_cache_host_gib = *avail * 0.6;  // each fits alone, not both
    const Status both = CheckHostMemory(c);
    CHECK(both.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(both.message()), Catch::Contains("--host-kv-gib"));
    CHECK_THAT(std::string(both.message()), Catch::Contains("--prefix-cache-host-gib"));
  }
}

// QA round 5: with the default --host-kv-gib the store shrank by the tier only down to a quarter
// of its default, and the sum was never checked: --prefix-cache-host-gib 19 on 22 GiB available
// started with 2.83 + 19 GiB (99% of it).
TEST_CASE("the default host store and the prefix tier: sized together, their sum at most 90%") {
  ServerConfig c;
  c.sparse = "on";
  const std::optional<double> avail = 22.0;
  CHECK(ResolvedHostKvGib(c, avail, 24.0) == 11.0);  // half the memory available
  CHECK(ResolvedHostKvGib(c, std::nullopt, 24.0) == 6.0);  // unknown: a quarter of RAM
  c.prefix_cache_host_gib = 5;
  CHECK(ResolvedHostKvGib(c, avail, 24.0) == 6.0);  // shrunk by the tier
  CHECK(CheckHostKvFits(c, 6.0, avail, 24.0).ok());
  c.prefix_cache_host_gib = 19;
  const double floor = ResolvedHostKvGib(c, avail, 24.0);
  CHECK(floor == 2.75);  // a quarter of the default
  const Status over = CheckHostKvFits(c, floor, avail, 24.0);
  REQUIRE_FALSE(over.ok());
  CHECK(over.code() == StatusCode::kInvalidArgument);
  const std::string m(over.message());
  CHECK_THAT(m, Catch::StartsWith("--host-kv-gib 0 (the default store: 2.75 GiB"));
  CHECK_THAT(m, Catch::Contains("--prefix-cache-host-gib 19.00 = 21.75 GiB"));
  CHECK_THAT(m, Catch::Contains("22.00 GiB of memory available"));
  CHECK_THAT(m, Catch::Contains("at most 90% of it, 19.80 GiB"));
  CHECK_THAT(m, Catch::Contains("lower --prefix-cache-host-gib to at most 17.05 GiB"));  // 19.8 - 2.75
  c.prefix_cache_host_gib = 17.0;  // within what the floor leaves room for
  CHECK(CheckHostKvFits(c, ResolvedHostKvGib(c, avail, 24.0), avail, 24.0).ok());
  c.prefix_cache_host_gib = 17.1;
  CHECK_FALSE(CheckHostKvFits(c, ResolvedHostKvGib(c, avail, 24.0), avail, 24.0).ok());
  // Given sizes are counted as given: the message names both flags.
  c.host_kv_gib = 10;
  c.prefix_cache_host_gib = 10;
  CHECK(ResolvedHostKvGib(c, avail, 24.0) == 10.0);
  const Status given = CheckHostKvFits(c, 10.0, avail, 24.0);
  REQUIRE_FALSE(given.ok());
  CHECK_THAT(std::string(given.message()),
             Catch::StartsWith("--host-kv-gib 10.00 + --prefix-cache-host-gib 10.00 = 20.00 GiB: this machine"));
  CHECK(CheckHostKvFits(c, 10.0, std::nullopt, 24.0).ok());  // unknown: not refused
  c.prefix_cache_host_gib = 0;
  CHECK(CheckHostKvFits(c, 19.8, avail, 24.0).ok());
  CHECK_THAT(std::string(CheckHostKvFits(c, 20.0, avail, 24.0).message()),
             Catch::StartsWith("--host-kv-gib 20.00: this machine has 22.00 GiB"));
}

// QA round 3: a --config file is read strictly and its errors name it.
TEST_CASE("config files: empty path, duplicate keys, both spellings, errors naming the file") {
  const auto dir = oasis::testing::MakeTempDir("server_config_strict");
  auto write = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  // --config "" was silently ignored (--config= was refused).
  auto empty = Parse({"--config", ""});
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().message().find("--config needs a value") != std::string::npos);
  CHECK_FALSE(Parse({"--config="}).ok());
  // A key given twice kept the last value.
  const std::string dup = write("dup.json", R"({"port": 70000, "port": 18105})");
  auto d = Parse({"--config", dup});
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == StatusCode::kInvalidArgument);
  CHECK(d.status().message().find(dup + ": 'port' appears twice") != std::string::npos);
  // Both spellings of one flag.
  const std::string both = write("both.json", R"({"max_num_seqs": 3, "max-num-seqs": 0})");
  auto b = Parse({"--config", both});
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("'max_num_seqs' and 'max-num-seqs' both set --max-num-seqs") !=
        std::string::npos);
  // Duplicates in nested objects are refused too; "_comment" keys are not settings.
  CHECK_FALSE(Parse({"--config", write("nested.json", R"({"_x": {"a": 1, "a": 2}})")}).ok());
  CHECK(Parse({"--config", write("comments.json", R"({"_comment": 1, "port": 9000})")}).ok());
  // A value from the file that Validate refuses names the file and its key, not "--port".
  const std::string neg = write("neg.json", R"({"port": -5})");
  auto n = Parse({"--config", neg});
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().message() == neg + ": port must be in [0, 65535], got -5");
  const std::string seqs = write("seqs.json", R"({"max_num_seqs": 0})");
  auto s = Parse({"--config", seqs});
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().message() == seqs + ": max_num_seqs must be >= 1, got 0");
  // ... unless the command line gave the flag: then it names the flag.
  auto flag = Parse({"--config", neg, "--port", "-7"});
  REQUIRE_FALSE(flag.ok());
  CHECK(flag.status().message() == "--port must be in [0, 65535], got -7");
  CHECK(Parse({"--config", neg, "--port", "5"}).ok());
  // Only a regular file is read (/dev/zero was an endless read).
  auto zero = Parse({"--config", "/dev/zero"});
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.status().message().find("is not a regular file") != std::string::npos);
}

TEST_CASE("GiB settings are bounded (1 PiB) before they become byte or block counts") {
  // --staging-pool-gib 1e30 overflowed its block count and "held no head-block".
  for (const char* flag :
       {"--host-kv-gib", "--staging-pool-gib", "--remote-kv-gib", "--prefix-cache-host-gib"}) {
    ExpectBadFlag({flag, "1e30"});
    ExpectBadFlag({flag, "1048577"});
  }
  auto r = Parse({"--staging-pool-gib", "1e30", "--role", "prefill"});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("--staging-pool-gib must be at most 1048576 (1 PiB)") !=
        std::string::npos);
  CHECK(Parse({"--staging-pool-gib", "1048576"}).ok());
}
