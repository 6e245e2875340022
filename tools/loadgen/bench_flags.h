// oasis-bench's command line: its flags, and vllm bench serve's names for them.
//
// A vLLM user's command line works as it would with vLLM where oasis-bench implements the
// flag: NormalizeVllmArgs rewrites argv before FlagParser sees it (--result_dir is
// --result-dir, as vLLM's parser allows; `--goodput a b c` takes several values), and
// ResolveVllmAliases folds vLLM's names into ours after parsing (--dataset-name is --dataset,
// --metric-percentiles is --percentiles, --backend openai-chat is --endpoint-type chat, ...).
// A vLLM flag oasis-bench does not implement is an error that names it, never ignored
// (docs/loadgen.md lists the accepted ones). Plain functions; thread-compatible.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "oasis/status.h"

namespace oasis::loadgen {

struct BenchFlags {
  // Where and what.
  std::string base_url, host = "127.0.0.1", endpoint = "/v1/completions";
  std::string endpoint_type = "completions", model, api_key, served_model_name, backend;
  int64_t port = 8000;
  // The workload.
  std::string dataset = "random", dataset_name, dataset_path, token_count = "auto";
  int64_t num_prompts = 1000, random_input_len = 1024, random_output_len = 128;
  int64_t random_prefix_len = 0, random_vocab_size = 0, input_len = 0, output_len = 0;
  double random_range_ratio = 0.0;
  int64_t sharegpt_output_len = 0, custom_output_len = 256;
  int64_t sonnet_input_len = 550, sonnet_output_len = 150, sonnet_prefix_len = 200;
  int64_t prefix_len = 0;  // general: fills --random-, --sonnet-, --multi-turn-prefix-len
  int64_t multi_turn_conversations = 8, multi_turn_turns = 4, multi_turn_first_len = 1024;
  int64_t multi_turn_increment_len = 256, multi_turn_prefix_len = 0;
  double multi_turn_think_ms = 0;
  bool disable_shuffle = false, no_oversample = false, skip_chat_template = false;
  int64_t seed = 0, num_warmups = 0, max_concurrency = 0;
  // The load and the requests.
  double request_rate = INFINITY, burstiness = 1.0, request_timeout = 600, temperature = -1;
  double top_p = 0, min_p = 0, frequency_penalty = 0, presence_penalty = 0;
  double repetition_penalty = 0;
  int64_t top_k = 0;
  bool ignore_eos = true, min_tokens = true;
  std::string extra_body;
  // The report.
  std::string percentiles = "99", metric_percentiles, percentile_metrics, goodput;
  std::string result_file, result_dir, result_filename, label;
  bool save_result = false, save_detailed = false, save_text = false;
  bool no_progress = false, disable_tqdm = false;
};

void DeclareBenchFlags(FlagParser& p, BenchFlags& f);

// argv[1..] rewritten for FlagParser: "--name_x" -> "--name-x"; "--goodput a b" ->
// "--goodput=a b"; a vllm bench serve flag or --dataset-name oasis-bench does not implement ->
// InvalidArgument naming it.
StatusOr<std::vector<std::string>> NormalizeVllmArgs(const std::vector<std::string>& args);

// After parsing: vLLM's names into ours (both given and different: an error), the sampling
// flags (--top-p, --top-k, ...) into `*extra_body` (a JSON object), the general --input-len /
// --output-len / --prefix-len into each dataset's length unless that was given.
Status ResolveVllmAliases(const FlagParser& parser, BenchFlags* f, nlohmann::json* extra_body);

// After ResolveVllmAliases: flags that contradict the dataset are errors — another dataset's
// length flags with multi-turn (--num-prompts, --random-input-len, ...: it has its own), a
// --multi-turn-* flag with another dataset, a negative --multi-turn-think-ms. (The multi-turn
// counts and lengths themselves are checked by MakeMultiTurnWorkload.)
Status CheckDatasetFlags(const FlagParser& parser, const BenchFlags& f);

// The least --request-rate (requests per second; below it the arrival times overflow the
// clock) and the longest --multi-turn-think-ms (one hour).
inline constexpr double kMinRequestRate = 1e-6;
inline constexpr double kMaxThinkMs = 3600.0 * 1000.0;
// The load flags: --request-rate >= kMinRequestRate (or inf), --num-prompts and --num-warmups
// in [0, kMaxPrompts] (workload.h); InvalidArgument naming the flag.
Status CheckLoadFlags(const BenchFlags& f);

// The result file `path` (ResultPath's; "" for none) can be written: its directory exists and
// is writable, and it is no directory. Checked before the run, which otherwise ran to its end
// and then lost its result.
Status CheckResultWritable(const std::string& path);

// Where the result goes: --result-file, or with --save-result vLLM's
// "[--result-dir/]{--result-filename or LABEL-RATEqps[-concurrencyN]-MODEL-DATETIME.json}"
// (LABEL: --label, else the backend; MODEL: after the last '/'); "" for none.
// `datetime` is YYYYmmdd-HHMMSS. --result-dir is created.
StatusOr<std::string> ResultPath(const BenchFlags& f, const std::string& model_id,
                                 const std::string& datetime);

// `v` as Python's str(float) writes it ("4.0", "0.25", "inf"), for vLLM's file names.
std::string PythonFloat(double v);

}  // namespace oasis::loadgen
