// oasis-bench's command line with vllm bench serve's names: argv rewriting (underscores,
// multi-value --goodput), unimplemented vLLM flags as errors naming them, aliases and their
// conflicts, the general lengths, sampling flags into the body, vLLM's result file name.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "test_support.h"
#include "tools/loadgen/bench_flags.h"
#include "tools/loadgen/runner.h"

using namespace oasis;
using namespace oasis::loadgen;

namespace {

using Args = std::vector<std::string>;

// Parses `args` as oasis-bench would; `*error` gets the first error's message.
bool Parse(const Args& args, BenchFlags* f, nlohmann::json* body, std::string* error) {
  auto normalized = NormalizeVllmArgs(args);
  if (!normalized.ok()) {
    *error = normalized.status().message();
    return false;
  }
  FlagParser parser("test");
  DeclareBenchFlags(parser, *f);
  std::vector<char*> argv = {const_cast<char*>("oasis-bench")};
  for (std::string& a : *normalized) argv.push_back(a.data());
  Status s = parser.Parse(static_cast<int>(argv.size()), argv.data());
  if (s.ok()) s = ResolveVllmAliases(parser, f, body);
  if (s.ok()) s = CheckDatasetFlags(parser, *f);
  if (s.ok()) s = CheckLoadFlags(*f);
  *error = s.message();
  return s.ok();
}

BenchFlags ParseOk(const Args& args, nlohmann::json* body = nullptr) {
  BenchFlags f;
  nlohmann::json local = nlohmann::json::object();
  std::string error;
  INFO("args: " << nlohmann::json(args).dump());
  CHECK(Parse(args, &f, body != nullptr ? body : &local, &error));
  CHECK(error.empty());
  return f;
}

std::string ParseError(const Args& args) {
  BenchFlags f;
  nlohmann::json body = nlohmann::json::object();
  std::string error;
  INFO("args: " << nlohmann::json(args).dump());
  CHECK_FALSE(Parse(args, &f, &body, &error));
  return error;
}

}  // namespace

TEST_CASE("vLLM argv: underscores, several --goodput values, = forms kept") {
  auto a = NormalizeVllmArgs({"--dataset_name", "sharegpt", "--goodput", "ttft:100", "tpot:50",
                              "--seed=3", "--result_dir=/tmp/x_y", "--goodput=e2el:5", "pos"});
  REQUIRE(a.ok());
  CHECK(*a == Args{"--dataset-name", "sharegpt", "--goodput=ttft:100 tpot:50", "--seed=3",
                   "--result-dir=/tmp/x_y", "--goodput=e2el:5", "pos"});
  auto last = NormalizeVllmArgs({"--goodput", "e2el:1000"});
  REQUIRE(last.ok());
  CHECK(*last == Args{"--goodput=e2el:1000"});
  auto none = NormalizeVllmArgs({"--goodput", "--seed", "1"});
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() == "--goodput needs a value");
}

TEST_CASE("vLLM flags oasis-bench does not implement are errors naming them") {
  for (const std::string flag :
       {"--header", "--tokenizer", "--use-beam-search", "--logprobs", "--profile",
        "--ramp_up_strategy", "--lora-modules", "--append-result", "--metadata", "--insecure",
        "--hf-split", "--random-mm-base-items-per-request", "--prefix-repetition-num-prefixes"}) {
    auto a = NormalizeVllmArgs({flag, "x"});
    REQUIRE_FALSE(a.ok());
    std::string name = flag;
    std::replace(name.begin(), name.end(), '_', '-');
    CHECK(a.status().message() ==
          name +
              " is a vllm bench serve flag that oasis-bench does not "
              "implement (docs/loadgen.md lists the vLLM flags it accepts)");
  }
  // Anything else unknown is still an error naming it (FlagParser's).
  CHECK(ParseError({"--no-such-flag", "1"}) == "unknown flag --no-such-flag (see --help)");
}

TEST_CASE("vLLM aliases: --dataset-name, --metric-percentiles, --backend, --disable-tqdm") {
  BenchFlags f = ParseOk({"--dataset-name", "sonnet", "--metric-percentiles", "25,50,99",
                          "--backend", "openai-chat", "--disable-tqdm", "--served-model-name",
                          "served", "--model", "org/model"});
  CHECK(f.dataset == "sonnet");
  CHECK(f.percentiles == "25,50,99");
  CHECK(f.endpoint_type == "chat");
  CHECK(f.no_progress);
  CHECK(f.model == "served");
  CHECK(ParseOk({"--backend", "vllm"}).endpoint_type == "completions");
  CHECK(ParseOk({"--dataset", "jsonl", "--dataset-name", "jsonl"}).dataset == "jsonl");
  CHECK(ParseError({"--dataset", "random", "--dataset-name", "sharegpt"}) ==
        "--dataset and --dataset-name (vLLM's name for it) disagree: 'random' vs 'sharegpt'");
  CHECK(ParseError({"--percentiles", "50", "--metric_percentiles", "99"}).find("disagree") !=
        std::string::npos);
  CHECK(
      ParseError({"--endpoint-type", "completions", "--backend", "openai-chat"}).find("disagree") !=
      std::string::npos);
  CHECK(ParseError({"--backend", "tgi"}).rfind("--backend tgi is not implemented", 0) == 0);
}

TEST_CASE("vLLM's general --input-len / --output-len fill each dataset's own length") {
  BenchFlags f = ParseOk({"--input-len", "300", "--output-len", "40", "--sonnet-output-len", "9"});
  CHECK(f.random_input_len == 300);
  CHECK(f.sonnet_input_len == 300);
  CHECK(f.random_output_len == 40);
  CHECK(f.sharegpt_output_len == 40);
  CHECK(f.custom_output_len == 40);
  CHECK(f.sonnet_output_len == 9);  // given: kept
  BenchFlags d = ParseOk({});
  CHECK(d.sonnet_input_len == 550);  // vLLM's defaults
  CHECK(d.sonnet_prefix_len == 200);
  CHECK(d.sonnet_output_len == 150);
  CHECK(d.custom_output_len == 256);
  CHECK(d.sharegpt_output_len == 0);
  CHECK(ParseError({"--output-len", "0"}) == "--output-len must be positive");
  CHECK(ParseError({"--input-len", "-3"}) == "--input-len must be positive");
}

TEST_CASE("multi-turn flags: defaults, --prefix-len, --output-len, contradictions refused") {
  BenchFlags d = ParseOk({"--dataset-name", "multi-turn"});
  CHECK(d.multi_turn_conversations == 8);
  CHECK(d.multi_turn_turns == 4);
  CHECK(d.multi_turn_first_len == 1024);
  CHECK(d.multi_turn_increment_len == 256);
  CHECK(d.multi_turn_prefix_len == 0);
  CHECK(d.multi_turn_think_ms == 0);
  BenchFlags f = ParseOk({"--dataset-name",
                          "multi-turn",
                          "--multi-turn-conversations",
                          "3",
                          "--multi_turn_turns",
                          "5",
                          "--multi-turn-first-len",
                          "800",
                          "--multi-turn-increment-len",
                          "90",
                          "--prefix-len",
                          "100",
                          "--output-len",
                          "60",
                          "--multi-turn-think-ms",
                          "250",
                          "--request-rate",
                          "2",
                          "--max-concurrency",
                          "2"});
  CHECK(f.multi_turn_conversations == 3);
  CHECK(f.multi_turn_turns == 5);
  CHECK(f.multi_turn_first_len == 800);
  CHECK(f.multi_turn_increment_len == 90);
  CHECK(f.multi_turn_prefix_len == 100);  // from --prefix-len
  CHECK(f.random_output_len == 60);       // the output length multi-turn uses
  CHECK(f.multi_turn_think_ms == 250);
  // --prefix-len is general: it fills the random and sonnet prefixes too, unless given.
  BenchFlags g = ParseOk({"--prefix-len", "30", "--sonnet-prefix-len", "70"});
  CHECK(g.random_prefix_len == 30);
  CHECK(g.sonnet_prefix_len == 70);
  CHECK(
      ParseOk({"--dataset-name", "multi-turn", "--prefix-len", "5", "--multi-turn-prefix-len", "9"})
          .multi_turn_prefix_len == 9);
  CHECK(ParseError({"--prefix-len", "-1"}) == "--prefix-len must be >= 0");

  // Another dataset's flags with multi-turn, and multi-turn flags with another dataset.
  const std::string mt = "multi-turn";
  CHECK(ParseError({"--dataset-name", mt, "--num-prompts", "10"})
            .rfind("--num-prompts does not apply to --dataset-name multi-turn", 0) == 0);
  CHECK(ParseError({"--dataset-name", mt, "--random-input-len", "10"})
            .find("use --multi-turn-first-len") != std::string::npos);
  CHECK(ParseError({"--dataset-name", mt, "--input-len", "10"})
            .rfind("--input-len does not apply", 0) == 0);
  CHECK(ParseError({"--dataset-name", mt, "--random-prefix-len", "10"})
            .find("use --multi-turn-prefix-len") != std::string::npos);
  CHECK(ParseError({"--dataset-name", mt, "--random-range-ratio", "0.5"})
            .rfind("--random-range-ratio does not apply", 0) == 0);
  CHECK(ParseError({"--dataset-name", mt, "--dataset-path", "x.json"})
            .rfind("--dataset-path does not apply", 0) == 0);
  CHECK(ParseError({"--dataset-name", mt, "--multi-turn-think-ms", "-1"}) ==
        "--multi-turn-think-ms must be a finite number >= 0");
  CHECK(ParseError({"--dataset-name", mt, "--multi-turn-prefix-len", "-2"}) ==
        "--multi-turn-prefix-len must be >= 0");
  CHECK(ParseError({"--multi-turn-turns", "3"}) ==
        "--multi-turn-turns applies to --dataset-name multi-turn only (the dataset is random)");
  CHECK(ParseError({"--dataset-name", "sharegpt", "--multi-turn-think-ms", "5"})
            .rfind("--multi-turn-think-ms applies to --dataset-name multi-turn only", 0) == 0);
}

TEST_CASE("vLLM's sampling flags go into the request body") {
  nlohmann::json body = nlohmann::json::object();
  ParseOk({"--top-p", "0.9", "--top_k", "5", "--min-p", "0.1", "--repetition-penalty", "1.1",
           "--temperature", "0.5"},
          &body);
  CHECK(body == nlohmann::json{{"top_p", 0.9},
                               {"top_k", 5},
                               {"min_p", 0.1},
                               {"repetition_penalty", 1.1}});  // temperature has its own field
  nlohmann::json none = nlohmann::json::object();
  ParseOk({"--seed", "1"}, &none);
  CHECK(none.empty());
  // Values that cannot be sent as given are refused (nan was dropped, and the server's default
  // used; a negative vocabulary became the server's).
  for (const char* flag : {"--temperature", "--top-p", "--min-p", "--frequency-penalty",
                           "--presence-penalty", "--repetition-penalty"}) {
    INFO(flag);
    CHECK(ParseError({flag, "nan"}) == std::string(flag) + " must be a finite number");
    CHECK(ParseError({flag, "inf"}) == std::string(flag) + " must be a finite number");
  }
  CHECK(ParseError({"--random-vocab-size", "-1"}).find("--random-vocab-size must be >= 0") == 0);
}

TEST_CASE("result file: --result-file, or vLLM's --save-result naming") {
  CHECK(ParseError({"--result-dir", "d"}).find("--save-result") != std::string::npos);
  CHECK(ParseError({"--result-filename", "x.json"}).find("--save-result") != std::string::npos);
  CHECK(ParseError({"--save-result", "--result-file", "x.json"}) ==
        "--save-result and --result-file both name the result file: use one");

  BenchFlags plain = ParseOk({"--result-file", "out.json"});
  CHECK(*ResultPath(plain, "m", "20261202-071500") == "out.json");
  CHECK(ResultPath(ParseOk({}), "m", "20261202-071500")->empty());

  BenchFlags vllm = ParseOk({"--save-result", "--max-concurrency", "4"});
  CHECK(*ResultPath(vllm, "Qwen/Qwen3-8B", "20261202-071500") ==
        "openai-infqps-concurrency4-Qwen3-8B-20261202-071500.json");
  BenchFlags chat = ParseOk({"--save-result", "--endpoint-type", "chat", "--request-rate", "4"});
  CHECK(*ResultPath(chat, "m", "20261202-071500") == "openai-chat-4.0qps-m-20261202-071500.json");
  BenchFlags labelled = ParseOk({"--save-result", "--label", "run1", "--request-rate", "0.25"});
  CHECK(*ResultPath(labelled, "m", "D") == "run1-0.25qps-m-D.json");

  const auto dir = oasis::testing::MakeTempDir("bench_flags_result") / "a" / "b";
  BenchFlags placed =
      ParseOk({"--save_result", "--result_dir", dir.string(), "--result-filename", "r.json"});
  CHECK(*ResultPath(placed, "m", "D") == (dir / "r.json").string());
  CHECK(std::filesystem::is_directory(dir));  // created, as vLLM does
}

// QA round 3: values whose sizes or durations overflow are refused with the flag's name.
TEST_CASE("load flags: bounds on the rate, think time and counts") {
  CHECK(ParseError({"--request-rate", "1e-30"}) ==
        "--request-rate must be at least 1e-06 requests per second (or inf), got 1e-30");
  CHECK(ParseError({"--request-rate", "0"}).find("--request-rate") != std::string::npos);
  CHECK(ParseError({"--request-rate", "nan"}).find("--request-rate") != std::string::npos);
  CHECK(ParseOk({"--request-rate", "1e-6"}).request_rate == 1e-6);
  CHECK(std::isinf(ParseOk({"--request-rate", "inf"}).request_rate));
  CHECK(ParseError({"--dataset-name", "multi-turn", "--multi-turn-think-ms", "1e300"}) ==
        "--multi-turn-think-ms must be at most 3600000 (one hour), got 1e+300");
  CHECK(ParseOk({"--dataset-name", "multi-turn", "--multi-turn-think-ms", "3600000"})
            .multi_turn_think_ms == 3600000);
  CHECK(ParseError({"--num-prompts", "99999999999999"}) ==
        "--num-prompts must be in [0, 16777216], got 99999999999999");
  CHECK(ParseError({"--num-warmups", "99999999999"}) ==
        "--num-warmups must be in [0, 16777216], got 99999999999");
  CHECK(ParseError({"--num-warmups", "-1"}).find("--num-warmups") != std::string::npos);
}

TEST_CASE("the result file is checked before the run") {
  CHECK(CheckResultWritable("").ok());
  const auto dir = oasis::testing::MakeTempDir("bench_flags_writable");
  CHECK(CheckResultWritable((dir / "r.json").string()).ok());
  CHECK(CheckResultWritable("r.json").ok());  // the current directory
  const Status missing = CheckResultWritable((dir / "no" / "r.json").string());
  CHECK(missing.code() == StatusCode::kInvalidArgument);
  CHECK(missing.message().find("no directory") != std::string::npos);
  const Status is_dir = CheckResultWritable(dir.string());
  CHECK(is_dir.message().find("is a directory") != std::string::npos);
  std::ofstream(dir / "file") << "x";  // a file where its directory should be
  CHECK(CheckResultWritable((dir / "file" / "r.json").string()).message().find("no directory") !=
        std::string::npos);
}

// Durations past int64 nanoseconds saturate (--request-rate 1e-30 finished at once).
TEST_CASE("seconds to clock durations saturate") {
  CHECK(SecondsToDuration(0) == BenchClock::duration::zero());
  CHECK(SecondsToDuration(-5) == BenchClock::duration::zero());
  CHECK(SecondsToDuration(std::nan("")) == BenchClock::duration::zero());
  CHECK(SecondsToDuration(1.5) == std::chrono::milliseconds(1500));
  const auto most = SecondsToDuration(kMaxBenchSeconds);
  CHECK(most > std::chrono::hours(24 * 365 * 99));
  CHECK(SecondsToDuration(1e30) == most);
  CHECK(SecondsToDuration(INFINITY) == most);
}

TEST_CASE("Python's str(float) for vLLM's file names") {
  CHECK(PythonFloat(4) == "4.0");
  CHECK(PythonFloat(0.25) == "0.25");
  CHECK(PythonFloat(0.1) == "0.1");
  CHECK(PythonFloat(12.5) == "12.5");
  CHECK(PythonFloat(INFINITY) == "inf");
  CHECK(PythonFloat(1e16) == "1e+16");
}
