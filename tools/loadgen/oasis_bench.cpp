// oasis-bench: a load generator for OpenAI-compatible servers (OasisKV's oasis-server,
// vLLM, SGLang, llama.cpp), modelled on `vllm bench serve`. Streams every request (SSE),
// measures TTFT, TPOT, ITL and end-to-end latency, prints a summary and writes a JSON result.
//
//   oasis-bench --base-url http://127.0.0.1:8000 --num-prompts 200 --random-input-len 1024
//       --random-output-len 128 --max-concurrency 16 --result-file out.json
//   oasis-bench --port 8000 --endpoint-type chat --dataset jsonl --dataset-path prompts.jsonl
//   oasis-bench --dataset-name sharegpt --dataset-path tests/fixtures/bench/sharegpt.json
//       --goodput ttft:100 tpot:50 --percentile-metrics ttft,tpot --metric-percentiles 50,99
//
// vllm bench serve's flags are accepted where implemented (bench_flags.h); the others are
// errors naming them.
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
#include "tools/loadgen/bench_flags.h"
#include "tools/loadgen/http_client.h"
#include "tools/loadgen/openai_stream.h"
#include "tools/loadgen/progress.h"
#include "tools/loadgen/prompt_tokenizer.h"
#include "tools/loadgen/report.h"
#include "tools/loadgen/runner.h"
#include "tools/loadgen/stats.h"
#include "tools/loadgen/text_datasets.h"
#include "tools/loadgen/workload.h"

using namespace oasis;
using namespace oasis::loadgen;
using nlohmann::ordered_json;

namespace {

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

std::string NowFormatted(const char* format, bool utc) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc) {
    gmtime_r(&t, &tm);
  } else {
    localtime_r(&t, &tm);
  }
  char buf[32];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

bool IsTextDataset(const std::string& d) {
  return d == "sharegpt" || d == "sonnet" || d == "custom";
}

// The measured prompts of a text dataset (sharegpt, sonnet, custom), with what the config
// records about them.
StatusOr<std::vector<Prompt>> MakeTextWorkload(const BenchFlags& f, EndpointType type,
                                               PromptTokenizer* tokenizer, ordered_json* config) {
  const auto seed = static_cast<uint64_t>(f.seed);
  if (f.dataset == "sharegpt") {
    ShareGptOptions o;
    o.num_prompts = f.num_prompts;
    if (f.sharegpt_output_len > 0) o.output_len = f.sharegpt_output_len;
    o.seed = seed;
    o.shuffle = !f.disable_shuffle;
    o.oversample = !f.no_oversample;
    ShareGptStats stats;
    auto prompts = ReadShareGptWorkload(f.dataset_path, o, tokenizer, &stats);
    if (prompts.ok()) {
      (*config)["sharegpt_output_len"] = o.output_len ? ordered_json(*o.output_len) : nullptr;
      (*config)["sharegpt_usable"] = stats.usable;
      (*config)["sharegpt_pruned"] = stats.pruned;
    }
    return prompts;
  }
  if (f.dataset == "sonnet") {
    auto lines = ReadPoemLines(f.dataset_path);
    if (!lines.ok()) return lines.status();
    SonnetOptions o;
    o.num_prompts = f.num_prompts;
    o.input_len = f.sonnet_input_len;
    o.prefix_len = f.sonnet_prefix_len;
    o.output_len = f.sonnet_output_len;
    o.seed = seed;
    o.render_chat = type == EndpointType::kCompletions;
    SonnetStats stats;
    auto prompts = MakeSonnetWorkload(*lines, o, tokenizer, &stats);
    if (prompts.ok()) {
      (*config)["sonnet_input_len"] = o.input_len;
      (*config)["sonnet_prefix_len"] = o.prefix_len;
      (*config)["sonnet_output_len"] = o.output_len;
      (*config)["sonnet_avg_line_tokens"] = stats.avg_line_tokens;
      (*config)["sonnet_base_offset"] = stats.base_offset;
      (*config)["sonnet_input_lines"] = stats.num_input_lines;
      (*config)["sonnet_prefix_lines"] = stats.num_prefix_lines;
      (*config)["sonnet_chat_rendered"] = stats.rendered;
    }
    return prompts;
  }
  auto lines = ReadJsonlWorkload(f.dataset_path, 0, f.custom_output_len);  // custom
  if (!lines.ok()) return lines.status();
  CustomOptions o;
  o.num_prompts = f.num_prompts;
  o.seed = seed;
  o.shuffle = !f.disable_shuffle;
  o.oversample = !f.no_oversample;
  o.render_chat = type == EndpointType::kCompletions && !f.skip_chat_template;
  (*config)["custom_output_len"] = f.custom_output_len;
  (*config)["skip_chat_template"] = !o.render_chat;
  return MakeCustomWorkload(std::move(*lines), o, tokenizer);
}

// The warm-ups' workload: `n` prompts of the measured run's shape, or turn 1 of `n`
// conversations, from a seed of their own (multi-turn: their system prompt differs too, so the
// measured run's turn 1 finds nothing of its own in the server's prefix cache).
constexpr uint64_t kWarmupSeedMix = 0x9E3779B97F4A7C15ull;
RandomWorkloadOptions WarmupOptions(RandomWorkloadOptions o, int64_t n) {
  o.num_prompts = n;
  o.seed ^= kWarmupSeedMix;
  return o;
}
MultiTurnWorkloadOptions WarmupOptions(MultiTurnWorkloadOptions o, int64_t n) {
  o.num_conversations = n;
  o.num_turns = 1;
  o.seed ^= kWarmupSeedMix;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  BenchFlags f;
  FlagParser parser(
      "oasis-bench: load generator for OpenAI-compatible servers (like vllm bench serve)");
  DeclareBenchFlags(parser, f);
  auto args = NormalizeVllmArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) return Fail(args.status());
  std::vector<char*> normalized_argv = {argv[0]};
  for (std::string& a : *args) normalized_argv.push_back(a.data());
  if (Status s = parser.Parse(static_cast<int>(normalized_argv.size()), normalized_argv.data());
      !s.ok()) {
    return Fail(s);
  }
  if (parser.help_requested()) {
    std::printf("%s", parser.Usage().c_str());
    return 0;
  }
  nlohmann::json extra_body = nlohmann::json::object();  // vLLM's sampling flags, then --extra-body
  if (Status s = ResolveVllmAliases(parser, &f, &extra_body); !s.ok()) return Fail(s);
  if (Status s = CheckDatasetFlags(parser, f); !s.ok()) return Fail(s);
  if (Status s = CheckLoadFlags(f); !s.ok()) return Fail(s);

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
  const bool multi_turn = f.dataset == "multi-turn";
  const bool synthetic = f.dataset == "random" || multi_turn;  // made from the seed, no file
  MultiTurnWorkloadOptions multi;  // checked before the server is asked anything
  multi.num_conversations = f.multi_turn_conversations;
  multi.num_turns = f.multi_turn_turns;
  multi.first_len = f.multi_turn_first_len;
  multi.increment_len = f.multi_turn_increment_len;
  multi.output_len = f.random_output_len;
  multi.prefix_len = f.multi_turn_prefix_len;
  multi.seed = static_cast<uint64_t>(f.seed);
  if (multi_turn) {
    if (Status s = CheckMultiTurnOptions(multi); !s.ok()) return Fail(s);
    if (f.num_warmups > 0) {
      if (Status s = CheckMultiTurnOptions(WarmupOptions(multi, f.num_warmups)); !s.ok())
        return Fail(s.WithContext("the --num-warmups warm-up conversations"));
    }
  }
  RandomWorkloadOptions random;  // checked here too (the vocabulary comes from the server)
  random.num_prompts = f.num_prompts;
  random.input_len = f.random_input_len;
  random.output_len = f.random_output_len;
  random.range_ratio = f.random_range_ratio;
  random.prefix_len = f.random_prefix_len;
  random.seed = static_cast<uint64_t>(f.seed);
  random.form = type == EndpointType::kChat ? PromptForm::kText : PromptForm::kTokenIds;
  if (f.dataset == "random") {
    RandomWorkloadOptions o = random;
    o.vocab_size = 1;  // (any: the server's comes later)
    if (Status s = CheckRandomWorkloadOptions(o); !s.ok()) return Fail(s);
    if (f.num_warmups > 0) {
      if (Status s = CheckRandomWorkloadOptions(WarmupOptions(o, f.num_warmups)); !s.ok())
        return Fail(s.WithContext("the --num-warmups warm-up prompts"));
    }
  }
  if (!synthetic && f.dataset != "jsonl" && !IsTextDataset(f.dataset)) {
    return Fail(InvalidArgument("dataset '" + f.dataset +
                                "' is not implemented: --dataset(-name) random, sharegpt, sonnet, "
                                "custom (vLLM's), multi-turn or jsonl (oasis-bench's)"));
  }
  if (!synthetic && f.dataset_path.empty())
    return Fail(InvalidArgument("--dataset-name " + f.dataset + " needs --dataset-path"));
  if (!synthetic && !parser.WasSet("ignore-eos")) f.ignore_eos = false;
  if (!(f.burstiness > 0)) return Fail(InvalidArgument("--burstiness must be positive"));
  if (f.max_concurrency < 0 || f.num_warmups < 0) {
    return Fail(InvalidArgument("--max-concurrency and --num-warmups must be >= 0"));
  }
  if (!(f.request_timeout > 0)) return Fail(InvalidArgument("--request-timeout must be positive"));
  auto percentiles =
      ParsePercentiles(f.percentiles, parser.WasSet("metric-percentiles") ? "--metric-percentiles"
                                                                          : "--percentiles");
  if (!percentiles.ok()) return Fail(percentiles.status());
  std::vector<std::string> reported_metrics = Summary().reported_metrics;
  if (parser.WasSet("percentile-metrics")) {
    auto metrics = ParsePercentileMetrics(f.percentile_metrics);
    if (!metrics.ok()) return Fail(metrics.status());
    reported_metrics = *metrics;
  }
  GoodputSlos goodput;
  if (parser.WasSet("goodput")) {
    auto slos = ParseGoodput(f.goodput);
    if (!slos.ok()) return Fail(slos.status());
    goodput = *slos;
  }
  auto token_counting = ParseTokenCounting(f.token_count);
  if (!token_counting.ok()) return Fail(token_counting.status());
  if (!f.extra_body.empty()) {
    const nlohmann::json extra =
        nlohmann::json::parse(f.extra_body, nullptr, /*allow_exceptions=*/false);
    if (!extra.is_object()) return Fail(InvalidArgument("--extra-body must be a JSON object"));
    extra_body.update(extra);
  }
  if (f.api_key.empty()) {
    if (const char* key = std::getenv("OPENAI_API_KEY")) f.api_key = key;
  }
  if (f.base_url.empty()) f.base_url = "http://" + f.host + ":" + std::to_string(f.port);
  auto address = ParseBaseUrl(f.base_url);
  if (!address.ok()) return Fail(address.status());

  // ---- model and vocabulary ----------------------------------------------------------------
  BenchClient probe(*address, f.api_key, std::min(f.request_timeout, 30.0));
  int64_t server_vocab = 0;
  if (f.model.empty()) {
    auto model = DiscoverModel(probe, &server_vocab);
    if (!model.ok()) return Fail(model.status().WithContext("finding the model (pass --model)"));
    f.model = *model;
  }
  int64_t vocab = f.random_vocab_size > 0 ? f.random_vocab_size : server_vocab;
  if (vocab <= 0) {
    vocab = 32000;
    if (synthetic && type == EndpointType::kCompletions) {
      std::fprintf(stderr,
                   "oasis-bench: the server does not report its vocab_size: random token ids from "
                   "[0, 32000); pass --random-vocab-size for a smaller vocabulary\n");
    }
  }
  auto result_path = ResultPath(f, f.model, NowFormatted("%Y%m%d-%H%M%S", /*utc=*/false));
  if (!result_path.ok()) return Fail(result_path.status());
  // Before the run, not after it: a result that cannot be written would be lost.
  if (Status s = CheckResultWritable(*result_path); !s.ok()) return Fail(s);

  // ---- workload ------------------------------------------------------------------------------
  ordered_json dataset_config = ordered_json::object();
  random.vocab_size = vocab;
  multi.vocab_size = vocab;
  multi.form = random.form;
  std::vector<MultiTurnConversation> conversations;
  StatusOr<std::vector<Prompt>> prompts = InvalidArgument("no workload");
  if (f.dataset == "random") {
    prompts = MakeRandomWorkload(random);
  } else if (multi_turn) {
    auto made = MakeMultiTurnWorkload(multi);
    if (!made.ok()) return Fail(made.status());
    conversations = std::move(*made);
    prompts = std::vector<Prompt>();  // each turn's prompt is made from its conversation when sent
  } else if (f.dataset == "jsonl") {
    prompts =
        ReadJsonlWorkload(f.dataset_path, f.num_prompts, f.output_len > 0 ? f.output_len : 128);
  } else {
    std::string note;
    auto tokenizer = MakePromptTokenizer(*token_counting, &probe, f.model, &note);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    if (!note.empty()) std::fprintf(stderr, "oasis-bench: %s\n", note.c_str());
    dataset_config["token_count"] = (*tokenizer)->Name();
    prompts = MakeTextWorkload(f, type, tokenizer->get(), &dataset_config);
  }
  if (!prompts.ok()) return Fail(prompts.status());
  std::vector<Prompt> warmups;
  if (f.num_warmups > 0) {
    if (f.dataset == "random") {
      auto made = MakeRandomWorkload(WarmupOptions(random, f.num_warmups));
      if (!made.ok()) return Fail(made.status());
      warmups = std::move(*made);
    } else if (multi_turn) {
      auto made = MakeMultiTurnWorkload(WarmupOptions(multi, f.num_warmups));
      if (!made.ok()) return Fail(made.status());
      for (const MultiTurnConversation& c : *made) warmups.push_back(TurnPrompt(c, 0));
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
  run.think_time_s = f.multi_turn_think_ms / 1e3;

  ordered_json config;
  config["date"] = NowFormatted("%Y-%m-%dT%H:%M:%SZ", /*utc=*/true);
  config["label"] = f.label;
  config["base_url"] = f.base_url;
  config["endpoint"] = f.endpoint;
  config["endpoint_type"] = f.endpoint_type;
  config["model_id"] = f.model;
  config["dataset"] = f.dataset;
  if (!synthetic) config["dataset_path"] = f.dataset_path;
  const size_t num_requests =
      multi_turn ? static_cast<size_t>(f.multi_turn_conversations * f.multi_turn_turns)
                 : prompts->size();
  config["num_prompts"] = num_requests;
  if (f.dataset == "random") {
    config["random_input_len"] = f.random_input_len;
    config["random_output_len"] = f.random_output_len;
    config["random_range_ratio"] = f.random_range_ratio;
    config["random_prefix_len"] = f.random_prefix_len;
    config["random_vocab_size"] = vocab;
  }
  if (multi_turn) {
    config["multi_turn_conversations"] = f.multi_turn_conversations;
    config["multi_turn_turns"] = f.multi_turn_turns;
    config["multi_turn_first_len"] = f.multi_turn_first_len;
    config["multi_turn_increment_len"] = f.multi_turn_increment_len;
    config["multi_turn_prefix_len"] = f.multi_turn_prefix_len;
    config["multi_turn_think_ms"] = f.multi_turn_think_ms;
    config["random_output_len"] = f.random_output_len;
    config["random_vocab_size"] = vocab;
  }
  config.update(dataset_config);
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
  config["percentile_metrics"] = reported_metrics;
  if (!goodput.empty()) {
    ordered_json slos = ordered_json::object();
    if (goodput.ttft_ms) slos["ttft"] = *goodput.ttft_ms;
    if (goodput.tpot_ms) slos["tpot"] = *goodput.tpot_ms;
    if (goodput.e2el_ms) slos["e2el"] = *goodput.e2el_ms;
    config["goodput"] = std::move(slos);
  }
  if (!extra_body.empty()) config["extra_body"] = extra_body;

  const ProgressStyle style = f.no_progress ? ProgressStyle::kOff : DefaultProgressStyle(stderr);
  const std::string what = multi_turn
                               ? std::to_string(f.multi_turn_conversations) + " conversations x " +
                                     std::to_string(f.multi_turn_turns) + " turns"
                               : std::to_string(num_requests) + " prompts";
  std::fprintf(stderr, "oasis-bench: %s %s, model %s, %s, rate %s, max concurrency %s\n",
               f.base_url.c_str(), f.endpoint.c_str(), f.model.c_str(), what.c_str(),
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
  Progress progress("benchmark", static_cast<int64_t>(num_requests), style);
  const RunResult result = multi_turn ? RunConversations(run, conversations, &progress)
                                      : RunBenchmark(run, *prompts, &progress);
  Summary summary = Summarize(result.records, result.duration_s, *percentiles);
  summary.reported_metrics = reported_metrics;
  if (!goodput.empty()) AddGoodput(result.records, goodput, &summary);

  std::printf("%s", FormatSummary(summary, config).c_str());
  std::fflush(stdout);
  if (!result_path->empty()) {
    std::ofstream out(*result_path);
    out << ResultJson(config, summary, result.records, warmup_records).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "oasis-bench: cannot write the result to %s\n", result_path->c_str());
      return 2;
    }
    std::fprintf(stderr, "oasis-bench: result written to %s\n", result_path->c_str());
  }
  if (summary.completed == 0) {
    std::fprintf(stderr, "oasis-bench: all %lld requests failed\n",
                 static_cast<long long>(summary.failed));
    return 1;
  }
  return 0;
}
