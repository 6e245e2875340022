// oasis-bench: a load generator for OpenAI-compatible servers (OasisKV's oasis-server,
// vLLM, SGLang, llama.cpp), modelled on `vllm bench serve`. Streams every request (SSE),
// measures TTFT, TPOT, ITL and end-to-end latency, prints a summary and writes a JSON result.
//
//   oasis-bench --base-url http://127.0.0.1:8000 --num-prompts 200 --random-input-len 1024
//       --random-output-len 128 --max-concurrency 16 --result-file out.json
//   oasis-bench --port 8000 --endpoint-type chat --dataset jsonl --dataset-path prompts.jsonl
//
// Exit status: 0 when at least one request succeeded, 1 when all failed, 2 for bad flags or
// an unreachable server before the run.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "tools/loadgen/http_client.h"
#include "tools/loadgen/openai_stream.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/report.h"
#include "tools/loadgen/runner.h"
#include "tools/loadgen/stats.h"
#include "tools/loadgen/workload.h"

using namespace oasis;
using namespace oasis::loadgen;
using nlohmann::ordered_json;

namespace {

struct Flags {
  std::string base_url, host = "127.0.0.1", endpoint = "/v1/completions";
  std::string endpoint_type = "completions", model, api_key;
  int64_t port = 8000;
  std::string dataset = "random", dataset_path;
  int64_t num_prompts = 1000, random_input_len = 1024, random_output_len = 128;
  int64_t random_prefix_len = 0, random_vocab_size = 0, output_len = 0;
  double random_range_ratio = 0.0;
  int64_t seed = 0, num_warmups = 0, max_concurrency = 0;
  double request_rate = INFINITY, burstiness = 1.0, request_timeout = 600, temperature = -1;
  bool ignore_eos = true, min_tokens = true, save_text = false, no_progress = false;
  std::string percentiles = "99", result_file, extra_body, label;
};

void Declare(FlagParser& p, Flags& f) {
  p.AddString("base-url", &f.base_url,
              "server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port)");
  p.AddString("host", &f.host, "server host when --base-url is not given");
  p.AddInt("port", &f.port, "server port when --base-url is not given");
  p.AddString("endpoint", &f.endpoint, "request path (default /v1/chat/completions for chat)");
  p.AddString("endpoint-type", &f.endpoint_type, "completions or chat");
  p.AddString("model", &f.model, "model name to send (default: the first of GET /v1/models)");
  p.AddString("api-key", &f.api_key,
              "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  p.AddString("dataset", &f.dataset, "random or jsonl");
  p.AddString("dataset-path", &f.dataset_path,
              "the JSONL file: {\"prompt\": text|[ids], \"output_len\"?: n} a line");
  p.AddInt("num-prompts", &f.num_prompts, "requests to measure (jsonl: 0 = every line once)");
  p.AddInt("random-input-len", &f.random_input_len,
           "random: prompt tokens after the shared prefix");
  p.AddInt("random-output-len", &f.random_output_len, "random: output tokens (max_tokens)");
  p.AddDouble("random-range-ratio", &f.random_range_ratio,
              "random: lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1");
  p.AddInt("random-prefix-len", &f.random_prefix_len,
           "random: tokens of a prefix shared by every prompt");
  p.AddInt("random-vocab-size", &f.random_vocab_size,
           "random: token ids drawn from [0, N) (0: the server's vocab_size from /v1/models, else "
           "32000)");
  p.AddInt("output-len", &f.output_len,
           "jsonl: max_tokens for lines without output_len (default 128)");
  p.AddInt("seed", &f.seed, "seed of the workload and the arrival times");
  p.AddInt("num-warmups", &f.num_warmups, "warm-up requests before the measured run (not counted)");
  p.AddInt("max-concurrency", &f.max_concurrency, "most requests in flight (0 = unlimited)");
  p.AddDouble("request-rate", &f.request_rate,
              "requests per second, Poisson arrivals (inf = all at once)");
  p.AddDouble("burstiness", &f.burstiness, "gamma shape of the arrival gaps (1 = Poisson)");
  p.AddDouble("request-timeout", &f.request_timeout, "seconds a request may take in all");
  p.AddDouble("temperature", &f.temperature,
              "sampling temperature to send (negative: server default)");
  p.AddBool("ignore-eos", &f.ignore_eos,
            "send ignore_eos: true (default true for random, false for jsonl)");
  p.AddBool("min-tokens", &f.min_tokens,
            "send min_tokens = max_tokens along with ignore_eos (--min-tokens=false to omit)");
  p.AddString("extra-body", &f.extra_body, "a JSON object merged into every request body");
  p.AddString("percentiles", &f.percentiles,
              "comma-separated percentiles to report, e.g. 50,90,99");
  p.AddString("result-file", &f.result_file, "write the JSON result here");
  p.AddString("label", &f.label, "a name for this run in the result (plots use it)");
  p.AddBool("save-text", &f.save_text, "keep each request's generated text in the result");
  p.AddBool("no-progress", &f.no_progress, "no progress output on stderr");
}

StatusOr<std::string> DiscoverModel(BenchClient& client, int64_t* vocab_size) {
  OASIS_ASSIGN_OR_RETURN(nlohmann::json models, client.GetJson("/v1/models"));
  const auto data = models.find("data");
  if (data == models.end() || !data->is_array() || data->empty() || !(*data)[0].is_object() ||
      !(*data)[0].contains("id") || !(*data)[0]["id"].is_string()) {
    return NotFound("GET /v1/models lists no model; pass --model");
  }
  const nlohmann::json& first = (*data)[0];
  if (const auto v = first.find("vocab_size"); v != first.end() && v->is_number_integer()) {
    *vocab_size = v->get<int64_t>();
  }
  return first["id"].get<std::string>();
}

std::string ConfigNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Every in-flight request holds a socket: lift the soft open-files limit to the hard one
// (1024 by default on Linux), as vllm bench serve does.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int Fail(const Status& status) {
  std::fprintf(stderr, "oasis-bench: %s\n", status.ToString().c_str());
  return 2;
}

std::string NowIso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  FlagParser parser(
      "oasis-bench: load generator for OpenAI-compatible servers (like vllm bench serve)");
  Declare(parser, f);
  if (Status s = parser.Parse(argc, argv); !s.ok()) return Fail(s);
  if (parser.help_requested()) {
    std::printf("%s", parser.Usage().c_str());
    return 0;
  }

  RaiseOpenFileLimit();

  // ---- validate flags --------------------------------------------------------------------
  if (f.endpoint_type != "completions" && f.endpoint_type != "chat") {
    return Fail(InvalidArgument("--endpoint-type must be completions or chat"));
  }
  const EndpointType type =
      f.endpoint_type == "chat" ? EndpointType::kChat : EndpointType::kCompletions;
  if (type == EndpointType::kChat && !parser.WasSet("endpoint"))
    f.endpoint = "/v1/chat/completions";
  if (f.endpoint.empty() || f.endpoint.front() != '/') f.endpoint = "/" + f.endpoint;
  if (f.dataset != "random" && f.dataset != "jsonl")
    return Fail(InvalidArgument("--dataset must be random or jsonl"));
  if (f.dataset == "jsonl" && f.dataset_path.empty())
    return Fail(InvalidArgument("--dataset jsonl needs --dataset-path"));
  if (f.dataset == "jsonl" && !parser.WasSet("ignore-eos")) f.ignore_eos = false;
  if (!(f.request_rate > 0))
    return Fail(InvalidArgument("--request-rate must be positive (or inf)"));
  if (!(f.burstiness > 0)) return Fail(InvalidArgument("--burstiness must be positive"));
  if (f.max_concurrency < 0 || f.num_warmups < 0) {
    return Fail(InvalidArgument("--max-concurrency and --num-warmups must be >= 0"));
  }
  if (!(f.request_timeout > 0)) return Fail(InvalidArgument("--request-timeout must be positive"));
  auto percentiles = ParsePercentiles(f.percentiles);
  if (!percentiles.ok()) return Fail(percentiles.status());
  nlohmann::json extra_body = nlohmann::json::object();
  if (!f.extra_body.empty()) {
    extra_body = nlohmann::json::parse(f.extra_body, nullptr, /*allow_exceptions=*/false);
    if (!extra_body.is_object()) return Fail(InvalidArgument("--extra-body must be a JSON object"));
  }
  if (f.api_key.empty()) {
    if (const char* key = std::getenv("OPENAI_API_KEY")) f.api_key = key;
  }
  if (f.base_url.empty()) f.base_url = "http://" + f.host + ":" + std::to_string(f.port);
  auto address = ParseBaseUrl(f.base_url);
  if (!address.ok()) return Fail(address.status());

  // ---- model and vocabulary ----------------------------------------------------------------
  int64_t server_vocab = 0;
  if (f.model.empty()) {
    BenchClient probe(*address, f.api_key, std::min(f.request_timeout, 30.0));
    auto model = DiscoverModel(probe, &server_vocab);
    if (!model.ok()) return Fail(model.status().WithContext("finding the model (pass --model)"));
    f.model = *model;
  }
  int64_t vocab = f.random_vocab_size > 0 ? f.random_vocab_size : server_vocab;
  if (vocab <= 0) {
    vocab = 32000;
    if (f.dataset == "random" && type == EndpointType::kCompletions) {
      std::fprintf(stderr,
                   "oasis-bench: the server does not report its vocab_size: random token ids from "
                   "[0, 32000); pass --random-vocab-size for a smaller vocabulary\n");
    }
  }

  // ---- workload ------------------------------------------------------------------------------
  RandomWorkloadOptions random;
  random.num_prompts = f.num_prompts;
  random.input_len = f.random_input_len;
  random.output_len = f.random_output_len;
  random.range_ratio = f.random_range_ratio;
  random.prefix_len = f.random_prefix_len;
  random.vocab_size = vocab;
  random.seed = static_cast<uint64_t>(f.seed);
  random.form = type == EndpointType::kChat ? PromptForm::kText : PromptForm::kTokenIds;
  const int64_t jsonl_output_len = f.output_len > 0 ? f.output_len : 128;
  StatusOr<std::vector<Prompt>> prompts =
      f.dataset == "random" ? MakeRandomWorkload(random)
                            : ReadJsonlWorkload(f.dataset_path, f.num_prompts, jsonl_output_len);
  if (!prompts.ok()) return Fail(prompts.status());
  std::vector<Prompt> warmups;
  if (f.num_warmups > 0) {
    if (f.dataset == "random") {
      RandomWorkloadOptions w = random;  // different prompts (a seed of its own), same shape
      w.num_prompts = f.num_warmups;
      w.seed = random.seed ^ 0x9E3779B97F4A7C15ull;
      auto made = MakeRandomWorkload(w);
      if (!made.ok()) return Fail(made.status());
      warmups = std::move(*made);
    } else {
      for (int64_t i = 0; i < f.num_warmups; ++i)
        warmups.push_back((*prompts)[i % prompts->size()]);
    }
  }
  if (type == EndpointType::kChat) {
    for (const Prompt& p : *prompts) {
      if (!p.token_ids.empty())
        return Fail(InvalidArgument("token-id prompts need --endpoint-type completions"));
    }
  }

  RunOptions run;
  run.address = *address;
  run.api_key = f.api_key;
  run.path = f.endpoint;
  run.request.type = type;
  run.request.model = f.model;
  run.request.ignore_eos = f.ignore_eos;
  run.request.force_min_tokens = f.ignore_eos && f.min_tokens;
  if (f.temperature >= 0) run.request.temperature = f.temperature;
  run.request.extra_body = extra_body;
  run.request_rate = f.request_rate;
  run.burstiness = f.burstiness;
  run.max_concurrency = f.max_concurrency;
  run.seed = static_cast<uint64_t>(f.seed);
  run.timeout_s = f.request_timeout;
  run.save_text = f.save_text;

  ordered_json config;
  config["date"] = NowIso8601();
  config["label"] = f.label;
  config["base_url"] = f.base_url;
  config["endpoint"] = f.endpoint;
  config["endpoint_type"] = f.endpoint_type;
  config["model_id"] = f.model;
  config["dataset"] = f.dataset;
  if (f.dataset == "jsonl") config["dataset_path"] = f.dataset_path;
  config["num_prompts"] = prompts->size();
  if (f.dataset == "random") {
    config["random_input_len"] = f.random_input_len;
    config["random_output_len"] = f.random_output_len;
    config["random_range_ratio"] = f.random_range_ratio;
    config["random_prefix_len"] = f.random_prefix_len;
    config["random_vocab_size"] = vocab;
  }
  config["seed"] = f.seed;
  config["num_warmups"] = f.num_warmups;
  if (std::isfinite(f.request_rate)) {
    config["request_rate"] = f.request_rate;
  } else {
    config["request_rate"] = "inf";
  }
  config["burstiness"] = f.burstiness;
  if (f.max_concurrency > 0) {
    config["max_concurrency"] = f.max_concurrency;
  } else {
    config["max_concurrency"] = nullptr;
  }
  config["ignore_eos"] = run.request.ignore_eos;
  config["min_tokens"] = run.request.force_min_tokens;
  config["request_timeout_s"] = f.request_timeout;
  config["percentiles"] = *percentiles;
  if (!extra_body.empty()) config["extra_body"] = extra_body;

  const ProgressStyle style = f.no_progress ? ProgressStyle::kOff : DefaultProgressStyle(stderr);
  std::fprintf(stderr, "oasis-bench: %s %s, model %s, %zu prompts, rate %s, max concurrency %s\n",
               f.base_url.c_str(), f.endpoint.c_str(), f.model.c_str(), prompts->size(),
               std::isfinite(f.request_rate) ? ConfigNumber(f.request_rate).c_str() : "inf",
               f.max_concurrency > 0 ? std::to_string(f.max_concurrency).c_str() : "unlimited");

  // ---- warm-up, then the measured run ------------------------------------------------------
  std::vector<RequestRecord> warmup_records;
  if (!warmups.empty()) {
    RunOptions w = run;
    w.request_rate = INFINITY;  // warm-ups are not paced
    Progress progress("warm-up", static_cast<int64_t>(warmups.size()), style);
    warmup_records = RunBenchmark(w, warmups, &progress).records;
    int64_t failed = 0;
    for (const RequestRecord& r : warmup_records) failed += r.success ? 0 : 1;
    if (failed > 0) {
      std::fprintf(stderr, "oasis-bench: %lld of %zu warm-up requests failed, e.g. %s\n",
                   static_cast<long long>(failed), warmup_records.size(),
                   FailureReason(*std::find_if(warmup_records.begin(), warmup_records.end(),
                                               [](const RequestRecord& r) { return !r.success; }))
                       .c_str());
    }
  }
  Progress progress("benchmark", static_cast<int64_t>(prompts->size()), style);
  const RunResult result = RunBenchmark(run, *prompts, &progress);
  const Summary summary = Summarize(result.records, result.duration_s, *percentiles);

  std::printf("%s", FormatSummary(summary, config).c_str());
  std::fflush(stdout);
  if (!f.result_file.empty()) {
    std::ofstream out(f.result_file);
    out << ResultJson(config, summary, result.records, warmup_records).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "oasis-bench: cannot write --result-file %s\n", f.result_file.c_str());
      return 2;
    }
    std::fprintf(stderr, "oasis-bench: result written to %s\n", f.result_file.c_str());
  }
  if (summary.completed == 0) {
    std::fprintf(stderr, "oasis-bench: all %lld requests failed\n",
                 static_cast<long long>(summary.failed));
    return 1;
  }
  return 0;
}
