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
  CHECK(p->config.ResolvedModelName() == "/m");
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
