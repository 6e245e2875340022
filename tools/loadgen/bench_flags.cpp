// oasis-bench's command line: see bench_flags.h.
#include "tools/loadgen/bench_flags.h"

#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>

#include "tools/loadgen/workload.h"

namespace oasis::loadgen {

namespace {

// vllm bench serve flags oasis-bench does not implement (dashes, without "--").
constexpr const char* kUnsupportedVllmFlags[] = {
    "header",
    "tokenizer",
    "tokenizer-mode",
    "use-beam-search",
    "logprobs",
    "probe-request-rate",
    "profile",
    "append-result",
    "metadata",
    "self-timed",
    "no-self-timed",
    "request-id-prefix",
    "lora-modules",
    "lora-assignment",
    "ramp-up-strategy",
    "ramp-up-start-rps",
    "ramp-up-end-rps",
    "ready-check-timeout-sec",
    "chat-template-kwargs",
    "skip-tokenizer-init",
    "insecure",
    "plot-timeline",
    "timeline-itl-thresholds",
    "trust-remote-code",
    "no-stream",
    "random-batch-size",
    "enable-multimodal-chat",
    "disable-ignore-eos",
    "plot-dataset-stats",
};
// ... and every flag of these vLLM dataset families.
constexpr const char* kUnsupportedVllmPrefixes[] = {
    "hf-",  "random-mm-", "random-rerank-", "prefix-repetition-", "blazedit-", "spec-bench-",
    "asr-", "burstgpt-",  "mmlu-",          "speed-bench-",
};
// Flags that take several values (argparse nargs="+").
constexpr const char* kMultiValueFlags[] = {"goodput"};

bool Contains(const auto& list, const std::string& name) {
  return std::find(std::begin(list), std::end(list), name) != std::end(list);
}

}  // namespace

void DeclareBenchFlags(FlagParser& p, BenchFlags& f) {
  p.AddString("base-url", &f.base_url,
              "server URL, e.g. http://127.0.0.1:8000 (overrides --host/--port)");
  p.AddString("host", &f.host, "server host when --base-url is not given");
  p.AddInt("port", &f.port, "server port when --base-url is not given");
  p.AddString("endpoint", &f.endpoint, "request path (default /v1/chat/completions for chat)");
  p.AddString("endpoint-type", &f.endpoint_type, "completions or chat");
  p.AddString("backend", &f.backend,
              "vLLM's name: openai or vllm (= --endpoint-type completions), openai-chat (= chat)");
  p.AddString("model", &f.model, "model name to send (default: the first of GET /v1/models)");
  p.AddString("served-model-name", &f.served_model_name,
              "vLLM's: the model name sent in requests, when it differs from --model");
  p.AddString("api-key", &f.api_key,
              "sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)");
  p.AddString("dataset", &f.dataset, "random, multi-turn, jsonl, sharegpt, sonnet or custom");
  p.AddString("dataset-name", &f.dataset_name, "vLLM's name for --dataset");
  p.AddString("dataset-path", &f.dataset_path,
              "the dataset file (jsonl/custom: {\"prompt\": text|[ids], \"output_len\"?: n} a "
              "line; sharegpt: a JSON list; sonnet: poem lines)");
  p.AddString("token-count", &f.token_count,
              "token lengths of text datasets: server (POST /tokenize), approx (4 bytes a "
              "token) or auto (the server's when it answers)");
  p.AddInt("num-prompts", &f.num_prompts,
           "requests to measure (jsonl, custom, sharegpt: 0 = every usable entry once)");
  p.AddInt("random-input-len", &f.random_input_len,
           "random: prompt tokens after the shared prefix");
  p.AddInt("random-output-len", &f.random_output_len,
           "random, multi-turn: output tokens (max_tokens)");
  p.AddDouble("random-range-ratio", &f.random_range_ratio,
              "random: lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1");
  p.AddInt("random-prefix-len", &f.random_prefix_len,
           "random: tokens of a prefix shared by every prompt");
  p.AddInt("random-vocab-size", &f.random_vocab_size,
           "random: token ids drawn from [0, N) (0: the server's vocab_size from /v1/models, else "
           "32000)");
  p.AddInt("input-len", &f.input_len,
           "vLLM's general input length: --random-input-len, --sonnet-input-len when not given");
  p.AddInt("output-len", &f.output_len,
           "general output length: --random-, --sonnet-, --sharegpt-, --custom-output-len when "
           "not given; jsonl: max_tokens for lines without output_len (default 128)");
  p.AddInt("sharegpt-output-len", &f.sharegpt_output_len,
           "sharegpt: fixed output length (0: each conversation's second turn's length)");
  p.AddInt("sonnet-input-len", &f.sonnet_input_len, "sonnet: most prompt tokens");
  p.AddInt("sonnet-output-len", &f.sonnet_output_len, "sonnet: output tokens");
  p.AddInt("sonnet-prefix-len", &f.sonnet_prefix_len, "sonnet: tokens of the shared prefix");
  p.AddInt("prefix-len", &f.prefix_len,
           "general shared-prefix length: --random-, --sonnet-, --multi-turn-prefix-len when not "
           "given");
  p.AddInt("multi-turn-conversations", &f.multi_turn_conversations,
           "multi-turn: conversations, run concurrently (at most "
           "--max-concurrency at once)");
  p.AddInt("multi-turn-turns", &f.multi_turn_turns,
           "multi-turn: turns of each conversation; a turn is sent when the previous "
           "one's response has ended");
  p.AddInt("multi-turn-first-len", &f.multi_turn_first_len,
           "multi-turn: tokens of turn 1's prompt, the shared system prompt included");
  p.AddInt("multi-turn-increment-len", &f.multi_turn_increment_len,
           "multi-turn: tokens each later turn appends to the previous prompt: the previous "
           "reply (output length) + a new user message (>= the output length)");
  p.AddInt("multi-turn-prefix-len", &f.multi_turn_prefix_len,
           "multi-turn: tokens of a system prompt shared by all conversations, part of "
           "--multi-turn-first-len (--prefix-len sets it too)");
  p.AddDouble("multi-turn-think-ms", &f.multi_turn_think_ms,
              "multi-turn: pause between a turn's response and the next turn");
  p.AddInt("custom-output-len", &f.custom_output_len,
           "custom: output tokens for lines without output_len");
  p.AddBool("skip-chat-template", &f.skip_chat_template,
            "custom: send prompts to completions endpoints without the chat template");
  p.AddBool("disable-shuffle", &f.disable_shuffle, "sharegpt, custom: keep the file's order");
  p.AddBool("no-oversample", &f.no_oversample,
            "sharegpt, custom: never repeat entries to reach --num-prompts");
  p.AddInt("seed", &f.seed, "seed of the workload and the arrival times");
  p.AddInt("num-warmups", &f.num_warmups, "warm-up requests before the measured run (not counted)");
  p.AddInt("max-concurrency", &f.max_concurrency, "most requests in flight (0 = unlimited)");
  p.AddDouble("request-rate", &f.request_rate,
              "requests per second, Poisson arrivals (inf = all at once)");
  p.AddDouble("burstiness", &f.burstiness, "gamma shape of the arrival gaps (1 = Poisson)");
  p.AddDouble("request-timeout", &f.request_timeout, "seconds a request may take in all");
  p.AddDouble("temperature", &f.temperature,
              "sampling temperature to send (negative: server default)");
  p.AddDouble("top-p", &f.top_p, "top_p to send (when given)");
  p.AddInt("top-k", &f.top_k, "top_k to send (when given)");
  p.AddDouble("min-p", &f.min_p, "min_p to send (when given)");
  p.AddDouble("frequency-penalty", &f.frequency_penalty, "frequency_penalty to send (when given)");
  p.AddDouble("presence-penalty", &f.presence_penalty, "presence_penalty to send (when given)");
  p.AddDouble("repetition-penalty", &f.repetition_penalty,
              "repetition_penalty to send (when given)");
  p.AddBool("ignore-eos", &f.ignore_eos,
            "send ignore_eos: true (default true for random, false for the other datasets)");
  p.AddBool("min-tokens", &f.min_tokens,
            "send min_tokens = max_tokens along with ignore_eos (--min-tokens=false to omit)");
  p.AddString("extra-body", &f.extra_body, "a JSON object merged into every request body");
  p.AddString("percentiles", &f.percentiles,
              "comma-separated percentiles to report, e.g. 50,90,99");
  p.AddString("metric-percentiles", &f.metric_percentiles, "vLLM's name for --percentiles");
  p.AddString("percentile-metrics", &f.percentile_metrics,
              "metrics to report, of ttft,tpot,itl,e2el (default all four)");
  p.AddString("goodput", &f.goodput,
              "SLOs in ms, e.g. --goodput ttft:100 tpot:50 e2el:1000: reports the requests "
              "meeting all of them per second");
  p.AddString("result-file", &f.result_file, "write the JSON result here");
  p.AddBool("save-result", &f.save_result,
            "vLLM's way: write the JSON result to --result-dir/--result-filename");
  p.AddString("result-dir", &f.result_dir, "with --save-result: the directory (default .)");
  p.AddString("result-filename", &f.result_filename,
              "with --save-result: the file name (default vLLM's "
              "LABEL-RATEqps[-concurrencyN]-MODEL-DATETIME.json)");
  p.AddBool("save-detailed", &f.save_detailed,
            "vLLM's: per-request details in the result (oasis-bench always writes them)");
  p.AddString("label", &f.label, "a name for this run in the result (plots use it)");
  p.AddBool("save-text", &f.save_text, "keep each request's generated text in the result");
  p.AddBool("no-progress", &f.no_progress, "no progress output on stderr");
  p.AddBool("disable-tqdm", &f.disable_tqdm, "vLLM's name for --no-progress");
}

StatusOr<std::vector<std::string>> NormalizeVllmArgs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      out.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    std::replace(name.begin(), name.end(), '_', '-');
    arg = "--" + name + (eq == std::string::npos ? "" : arg.substr(eq));
    const bool unsupported_prefix =
        std::any_of(std::begin(kUnsupportedVllmPrefixes), std::end(kUnsupportedVllmPrefixes),
                    [&](const char* p) { return name.rfind(p, 0) == 0; });
    if (Contains(kUnsupportedVllmFlags, name) || unsupported_prefix) {
      return InvalidArgument("--" + name +
                             " is a vllm bench serve flag that oasis-bench does not implement "
                             "(docs/loadgen.md lists the vLLM flags it accepts)");
    }
    if (Contains(kMultiValueFlags, name) && eq == std::string::npos) {
      std::string values;
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        values += (values.empty() ? "" : " ") + args[++i];
      }
      if (values.empty()) return InvalidArgument("--" + name + " needs a value");
      arg += "=" + values;
    }
    out.push_back(arg);
  }
  return out;
}

namespace {

// `ours` takes `theirs`'s value when only `theirs` was given; both given and different: an error.
Status Alias(const FlagParser& parser, const char* ours, std::string* ours_value,
             const char* theirs, const std::string& theirs_value) {
  if (!parser.WasSet(theirs)) return Status::Ok();
  if (parser.WasSet(ours) && *ours_value != theirs_value) {
    return InvalidArgument(std::string("--") + ours + " and --" + theirs +
                           " (vLLM's name for it) disagree: '" + *ours_value + "' vs '" +
                           theirs_value + "'");
  }
  *ours_value = theirs_value;
  return Status::Ok();
}

}  // namespace

Status ResolveVllmAliases(const FlagParser& parser, BenchFlags* f, nlohmann::json* extra_body) {
  OASIS_RETURN_IF_ERROR(Alias(parser, "dataset", &f->dataset, "dataset-name", f->dataset_name));
  OASIS_RETURN_IF_ERROR(
      Alias(parser, "percentiles", &f->percentiles, "metric-percentiles", f->metric_percentiles));
  if (parser.WasSet("backend")) {
    std::string type;
    if (f->backend == "openai" || f->backend == "vllm") {
      type = "completions";
    } else if (f->backend == "openai-chat") {
      type = "chat";
    } else {
      return InvalidArgument("--backend " + f->backend +
                             " is not implemented (openai and vllm: /v1/completions; "
                             "openai-chat: /v1/chat/completions)");
    }
    OASIS_RETURN_IF_ERROR(Alias(parser, "endpoint-type", &f->endpoint_type, "backend", type));
  }
  if (f->disable_tqdm) f->no_progress = true;
  if (!f->served_model_name.empty()) f->model = f->served_model_name;
  // The general lengths fill each dataset's own flag unless that was given.
  if (parser.WasSet("input-len")) {
    if (f->input_len <= 0) return InvalidArgument("--input-len must be positive");
    if (!parser.WasSet("random-input-len")) f->random_input_len = f->input_len;
    if (!parser.WasSet("sonnet-input-len")) f->sonnet_input_len = f->input_len;
  }
  if (parser.WasSet("output-len")) {
    if (f->output_len <= 0) return InvalidArgument("--output-len must be positive");
    if (!parser.WasSet("random-output-len")) f->random_output_len = f->output_len;
    if (!parser.WasSet("sonnet-output-len")) f->sonnet_output_len = f->output_len;
    if (!parser.WasSet("sharegpt-output-len")) f->sharegpt_output_len = f->output_len;
    if (!parser.WasSet("custom-output-len")) f->custom_output_len = f->output_len;
  }
  if (parser.WasSet("prefix-len")) {
    if (f->prefix_len < 0) return InvalidArgument("--prefix-len must be >= 0");
    if (!parser.WasSet("random-prefix-len")) f->random_prefix_len = f->prefix_len;
    if (!parser.WasSet("sonnet-prefix-len")) f->sonnet_prefix_len = f->prefix_len;
    if (!parser.WasSet("multi-turn-prefix-len")) f->multi_turn_prefix_len = f->prefix_len;
  }
  // A value the client would not send as given is refused here, not replaced: nan (no JSON
  // number) or a negative vocabulary.
  if (parser.WasSet("random-vocab-size") && f->random_vocab_size < 0)
    return InvalidArgument("--random-vocab-size must be >= 0 (0: the server's vocabulary)");
  // vLLM's sampling flags go into the body (before --extra-body, which is merged last); a
  // value that is no finite number (nan passed before, and the server default was used) is
  // refused.
  const auto number = [f](std::string_view name) {
    return name == "top-p"               ? f->top_p
           : name == "min-p"             ? f->min_p
           : name == "frequency-penalty" ? f->frequency_penalty
           : name == "presence-penalty"  ? f->presence_penalty
           : name == "temperature"       ? f->temperature
                                         : f->repetition_penalty;
  };
  for (const char* name : {"top-p", "min-p", "frequency-penalty", "presence-penalty",
                           "repetition-penalty", "top-k", "temperature"}) {
    if (!parser.WasSet(name)) continue;
    std::string key = name;
    std::replace(key.begin(), key.end(), '-', '_');
    if (key == "top_k") {
      (*extra_body)[key] = f->top_k;
      continue;
    }
    const double v = number(name);
    if (!std::isfinite(v))
      return InvalidArgument(std::string("--") + name + " must be a finite number");
    if (key != "temperature") (*extra_body)[key] = v;  // temperature: RequestOptions
  }
  if (!f->save_result && (parser.WasSet("result-dir") || parser.WasSet("result-filename"))) {
    return InvalidArgument(
        "--result-dir and --result-filename place the result of --save-result: add it (or use "
        "--result-file PATH)");
  }
  if (f->save_result && !f->result_file.empty()) {
    return InvalidArgument("--save-result and --result-file both name the result file: use one");
  }
  return Status::Ok();
}

Status CheckDatasetFlags(const FlagParser& parser, const BenchFlags& f) {
  constexpr const char* kMultiTurnFlags[] = {"multi-turn-conversations", "multi-turn-turns",
                                             "multi-turn-first-len",     "multi-turn-increment-len",
                                             "multi-turn-prefix-len",    "multi-turn-think-ms"};
  if (f.dataset != "multi-turn") {
    for (const char* name : kMultiTurnFlags) {
      if (parser.WasSet(name)) {
        return InvalidArgument(std::string("--") + name +
                               " applies to --dataset-name multi-turn only (the dataset is " +
                               f.dataset + ")");
      }
    }
    return Status::Ok();
  }
  // Another dataset's flag with multi-turn: name what takes its place.
  const std::pair<const char*, const char*> kInstead[] = {
      {"num-prompts", "--multi-turn-conversations x --multi-turn-turns requests are sent"},
      {"input-len", "use --multi-turn-first-len and --multi-turn-increment-len"},
      {"random-input-len", "use --multi-turn-first-len and --multi-turn-increment-len"},
      {"random-prefix-len", "use --multi-turn-prefix-len (or --prefix-len)"},
      {"random-range-ratio", "every turn has exactly its lengths"},
      {"dataset-path", "multi-turn prompts are generated from --seed"},
  };
  for (const auto& [name, instead] : kInstead) {
    if (parser.WasSet(name)) {
      return InvalidArgument(std::string("--") + name +
                             " does not apply to --dataset-name multi-turn: " + instead);
    }
  }
  if (!(f.multi_turn_think_ms >= 0) || !std::isfinite(f.multi_turn_think_ms)) {
    return InvalidArgument("--multi-turn-think-ms must be a finite number >= 0");
  }
  if (f.multi_turn_think_ms > kMaxThinkMs) {  // 1e300 overflowed the pause into none at all
    return InvalidArgument("--multi-turn-think-ms must be at most 3600000 (one hour), got " +
                           PythonFloat(f.multi_turn_think_ms));
  }
  if (f.multi_turn_prefix_len < 0) return InvalidArgument("--multi-turn-prefix-len must be >= 0");
  return Status::Ok();
}

Status CheckLoadFlags(const BenchFlags& f) {
  if (!(f.request_rate >= kMinRequestRate)) {  // 1e-30 overflowed the arrival times
    return InvalidArgument(
        "--request-rate must be at least 1e-06 requests per second (or inf), "
        "got " +
        PythonFloat(f.request_rate));
  }
  const auto count = [](const char* name, int64_t v, int64_t least) -> Status {
    if (v >= least && v <= kMaxPrompts) return Status::Ok();
    return InvalidArgument(std::string("--") + name + " must be in [" + std::to_string(least) +
                           ", " + std::to_string(kMaxPrompts) + "], got " + std::to_string(v));
  };
  OASIS_RETURN_IF_ERROR(count("num-prompts", f.num_prompts, 0));
  OASIS_RETURN_IF_ERROR(count("num-warmups", f.num_warmups, 0));
  return Status::Ok();
}

Status CheckResultWritable(const std::string& path) {
  if (path.empty()) return Status::Ok();
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(file, ec))
    return InvalidArgument("the result file " + path + " is a directory");
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgument("cannot write the result to " + path + ": no directory " + dir.string());
  }
  const bool exists = fs::exists(file, ec);
  if (access(exists ? file.c_str() : dir.c_str(), exists ? W_OK : (W_OK | X_OK)) != 0) {
    return InvalidArgument("cannot write the result to " + path + ": " +
                           (exists ? path : dir.string()) + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

std::string PythonFloat(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 4 -> "4.0"
  return s;
}

StatusOr<std::string> ResultPath(const BenchFlags& f, const std::string& model_id,
                                 const std::string& datetime) {
  if (!f.result_file.empty()) return f.result_file;
  if (!f.save_result) return std::string();
  std::string name = f.result_filename;
  if (name.empty()) {
    const std::string label = !f.label.empty()            ? f.label
                              : !f.backend.empty()        ? f.backend
                              : f.endpoint_type == "chat" ? "openai-chat"
                                                          : "openai";
    const std::string model = model_id.substr(model_id.find_last_of('/') + 1);
    name = label + "-" + PythonFloat(f.request_rate) + "qps" +
           (f.max_concurrency > 0 ? "-concurrency" + std::to_string(f.max_concurrency) : "") + "-" +
           model + "-" + datetime + ".json";
  }
  if (f.result_dir.empty()) return name;
  std::error_code ec;
  std::filesystem::create_directories(f.result_dir, ec);
  if (ec)
    return InvalidArgument("cannot create --result-dir " + f.result_dir + ": " + ec.message());
  return (std::filesystem::path(f.result_dir) / name).string();
}

}  // namespace oasis::loadgen
