// oasis-server settings: config files, flags overriding them, range checks, and every
// committed configs/*.json parsing with known keys.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

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

}  // namespace

TEST_CASE("server settings: defaults") {
  auto p = Parse({});
  REQUIRE(p.ok());
  const ServerConfig& c = p->config;
  CHECK(c.host == "127.0.0.1");
  CHECK(c.port == 8000);
  CHECK(c.grpc_port == 0);
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
  CHECK(Parse({"--load-format", "gguf"}).status().code() == StatusCode::kInvalidArgument);
  CHECK(Parse({"--no-such-flag"}).status().code() == StatusCode::kInvalidArgument);
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
    ++n;
  }
  CHECK(n >= 2);
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
  CHECK(p->config.sparse_group_reduce == "max");
  CHECK(p->config.max_sparse_seqs == 16);
  CHECK(p->config.fetch_ratio == 0.1);
  CHECK(p->config.sparse_agreement_interval == 4);
  CHECK(p->config.sparse_transfers == "on");
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
  CHECK(error({"--sparse-group-reduce", "mean"}).find("--sparse-group-reduce") != std::string::npos);
  CHECK(error({"--fetch-ratio", "1.5"}).find("--fetch-ratio") != std::string::npos);
  CHECK(error({"--topk-blocks", "0"}).find("--topk-blocks") != std::string::npos);
  CHECK(error({"--host-kv-gib", "-1"}).find("--host-kv-gib") != std::string::npos);
  CHECK(error({"--remote-kv-gib", "-2"}).find("--remote-kv-gib must be >= 0 or -1") != std::string::npos);
  CHECK(error({"--remote-kv-gib", "-1"}) == "OK");  // as much as --host-kv-gib
  CHECK(error({"--remote-kv-gib", "0"}) == "OK");
  CHECK(error({"--remote-kv-gib", "12.5"}) == "OK");
  CHECK(error({"--sparse-threshold", "-5"}).find("--sparse-threshold") != std::string::npos);
  CHECK(error({"--dense-layers", "-1"}).find("--dense-layers") != std::string::npos);
  CHECK(error({"--sparse-transfers", "maybe"}).find("--sparse-transfers must be on or off") != std::string::npos);

  // The config file keys.
  ServerConfig c;
  REQUIRE(ApplyConfigJson(nlohmann::json::parse(R"({"sparse": "on", "host_kv_gib": 8, "topk-blocks": 32,
      "sparse_threshold": 1000, "sparse_predictor": "previous-query"})"), "test", &c).ok());
  CHECK(c.SparseEnabled());
  CHECK(c.host_kv_gib == 8.0);
  CHECK(c.topk_blocks == 32);
  CHECK(c.ResolvedSparseThreshold() == 1000);
  CHECK_FALSE(ApplyConfigJson(nlohmann::json::parse(R"({"host_kv_gib": "8"})"), "test", &c).ok());
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
