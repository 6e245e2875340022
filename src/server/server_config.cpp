#include "server/server_config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <variant>
#include <vector>

#include "common/flags.h"
#include "common/host_memory.h"
#include "common/http_util.h"
#include "common/settings.h"
#include "disagg/net_address.h"
#include "disagg/wire.h"
#include "loader/small_file.h"
#include "server/reasoning_parser.h"
#include "server/tool_parser.h"

namespace oasis::server {
namespace {

using Setting = SettingField<ServerConfig>;

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> settings = [] {
    std::vector<Setting> table = {
        {"model", &ServerConfig::model,
         "model directory (config.json + *.safetensors); default: the embedded model (a small "
         "trained Qwen3, docs/trained_model.md)"},
        {"tokenizer", &ServerConfig::tokenizer,
         "tokenizer.json or its directory (default: the model directory)"},
        {"chat-template", &ServerConfig::chat_template,
         "Jinja chat template file (default: tokenizer_config.json's)"},
        {"load-format", &ServerConfig::load_format,
         "auto, safetensors, or dummy (random weights at the config's shapes)"},
        {"served-model-name", &ServerConfig::served_model_name,
         "the model name clients use (default: the last component of --model's path; requests "
         "naming the --model path are accepted too)"},
        {"max-model-len", &ServerConfig::max_model_len,
         "context length (0 = the model's max_position_embeddings, scaled by its RoPE scaling "
         "factor for yarn, linear and dynamic as vLLM does)"},
        {"generation-config", &ServerConfig::generation_config,
         "request defaults as vLLM takes them: auto (the model directory's "
         "generation_config.json: temperature, top_p, top_k, min_p, max_new_tokens, EOS ids), "
         "vllm (neutral defaults; the file's EOS ids still stop), or a directory holding a "
         "generation_config.json"},
        {"enable-auto-tool-choice", &ServerConfig::enable_auto_tool_choice,
         "parse tool calls out of chat answers for tool_choice \"auto\" (the default with "
         "tools); needs --tool-call-parser"},
        {"tool-call-parser", &ServerConfig::tool_call_parser,
         "how tool calls look in the model's output: hermes (Qwen3: <tool_call>{json}"
         "</tool_call>) or llama3_json (Llama 3.x: JSON objects at the start, ';'-separated)"},
        {"reasoning-parser", &ServerConfig::reasoning_parser,
         "split <think>...</think> out of chat answers into reasoning_content: qwen3 or "
         "deepseek_r1"},
        {"draft-model", &ServerConfig::draft_model,
         "EAGLE-3 draft head directory for lookahead decoding"},
        {"draft-load-format", &ServerConfig::draft_load_format,
         "auto, or dummy (a random head at real shapes; --draft-model's config.json or one shaped "
         "like the model)"},
        {"draft-vocab-size", &ServerConfig::draft_vocab_size,
         "draft vocabulary of a dummy head without --draft-model (capped at the model's)"},
        {"lookahead", &ServerConfig::lookahead,
         "auto (reject with a draft model, else off), off, reject (lossless, drafts discarded), "
         "speculate (accept matching drafts: up to 1 + --num-speculative-tokens tokens per "
         "step)"},
        {"num-speculative-tokens", &ServerConfig::num_speculative_tokens,
         "speculate: draft tokens per step, a chain of 1 to 4 from the EAGLE-3 head, verified in "
         "one stacked target step (> 1 needs --lookahead speculate; auto resolves to it)"},
        {"speculative-depth", &ServerConfig::speculative_depth,
         "speculate: fixed (chains of --num-speculative-tokens drafts at every step) or adaptive "
         "(per step the chain length in 1..--num-speculative-tokens with the most tokens per "
         "second of step time, from the measured acceptance by position and step times; needs "
         "--num-speculative-tokens >= 2); outputs are the same either way"},
        {"kv-cache-dtype", &ServerConfig::kv_cache_dtype,
         "KV cache element type: auto (the activation dtype: bf16 on CUDA, f32 on the CPU "
         "reference) or fp8 (= fp8_e4m3: e4m3 with per-KV-head scales calibrated at start-up; "
         "half the bytes of bf16 in the KV pool, the host KV store, every sparse fetch and the "
         "prefix cache's host tier; docs/fp8.md)"},
        {"sparse", &ServerConfig::sparse,
         "lookahead sparse KV for long requests: auto (on when --sparse-threshold > 0), on, off"},
        {"host-kv-gib", &ServerConfig::host_kv_gib,
         "host KV store of sparse requests, GiB (0 = half the memory available at start; at most "
         "90% of it); requests that can never fit get 413"},
        {"topk-blocks", &ServerConfig::topk_blocks,
         "sparse: K blocks of 16 tokens per (request, layer, KV head)"},
        {"fetch-ratio", &ServerConfig::fetch_ratio,
         "sparse: at most ceil(ratio x K) blocks fetched per head per step"},
        {"sparse-threshold", &ServerConfig::sparse_threshold,
         "sparse: requests switch once their context exceeds this many tokens (0 with --sparse on: "
         "(K + 1) x 16)"},
        {"dense-layers", &ServerConfig::dense_layers, "sparse: the first N layers stay dense"},
        {"sparse-predictor", &ServerConfig::sparse_predictor,
         "auto (draft with lookahead, else previous-query), draft (the EAGLE-3 draft query), "
         "previous-query, "
         "oracle (measurement only)"},
        {"sparse-switch", &ServerConfig::sparse_switch,
         "sparse: when a request past --sparse-threshold goes sparse: pressure (it stays dense "
         "while the GPU pool has room and the dense decodes' KV stays within the weights' bytes: "
         "past that the longest switch in place (HBM home); when the pool runs short the longest "
         "switches to the host store instead of anyone being preempted), threshold (at once), "
         "auto (the default: pressure, or threshold with --dense-layers > 0)"},
        {"kv-home", &ServerConfig::kv_home,
         "sparse: where a sparse request's full KV lives: host (the host KV store, working sets "
         "fetched over PCIe), hbm (the GPU pool: selected blocks read in place), auto (the "
         "default: hbm while the GPU pool has room for the whole request, else host; under "
         "pressure in-place requests move to the host store)"},
        {"sparse-budget", &ServerConfig::sparse_budget,
         "sparse: fetch caps per head and step: adaptive (the default: per layer in [1, C], "
         "following the measured misses and the fetched blocks' use, backing off when transfers "
         "stall the steps), fixed (C = ceil(--fetch-ratio x K) in every layer)"},
        {"sparse-group-reduce", &ServerConfig::sparse_group_reduce,
         "sparse: GQA reduction of block scores: sum or max"},
        {"max-sparse-seqs", &ServerConfig::max_sparse_seqs,
         "sparse requests at once (0 = --max-num-seqs)"},
        {"sparse-transfers", &ServerConfig::sparse_transfers,
         "sparse: on, or off (measurement only: blocks are selected but never copied, outputs are "
         "wrong; "
         "the same run with and without transfers shows what they cost)"},
        {"sparse-agreement-interval", &ServerConfig::sparse_agreement_interval,
         "sparse: sample the predicted top-K's agreement with the real query's every N steps (0 = "
         "never)"},
        {"role", &ServerConfig::role,
         "both (a single instance), prefill (runs prompts, hands the KV to a decode instance) or "
         "decode (decodes "
         "handed-off requests); prefill and decode serve oasis-router (docs/disaggregation.md)"},
        {"staging-pool-gib", &ServerConfig::staging_pool_gib,
         "prefill: host staging pool of handed-off KV, GiB (0 = a quarter of the machine's RAM)"},
        {"staging-listen", &ServerConfig::staging_listen,
         "prefill: UCX listen address host:port of the staging pool (default: --host, any port); "
         "an address beyond loopback needs a staging secret"},
        {"staging-advertise", &ServerConfig::staging_advertise,
         "prefill: host name decode instances reach the staging pool at (default: the listen host, "
         "or this machine's name)"},
        {"staging-lease-ttl-ms", &ServerConfig::staging_lease_ttl_ms,
         "prefill: staged KV is freed after this long without a renewal from its decode instance"},
        {"staging-secret", &ServerConfig::staging_secret,
         "shared secret of the staging pool: prefill asks it of decode instances (required "
         "when --staging-listen is not loopback), decode sends it; visible in ps: prefer "
         "--staging-secret-file or $OASIS_STAGING_SECRET"},
        {"staging-secret-file", &ServerConfig::staging_secret_file,
         "file holding the staging secret (trailing newlines ignored)"},
        {"rpf", &ServerConfig::rpf,
         "decode: on = remote partial fetch (only the blocks decode attends to, drift fetched "
         "later), off = the whole "
         "KV at admission (the baseline)"},
        {"remote-fetch-cap", &ServerConfig::remote_fetch_cap,
         "decode: remote blocks fetched per (request, layer, KV head) per step (0 = "
         "ceil(fetch-ratio "
         "x K))"},
        {"remote-kv-gib", &ServerConfig::remote_kv_gib,
         "decode with --rpf on: GiB of remote KV (blocks still on the prefill instance) tracked "
         "without host memory; "
         "each GiB costs 1/16 GiB of device memory for its block summaries (-1 = as much as "
         "--host-kv-gib, "
         "0 = none: remote blocks reserve host KV)"},
        {"ucx-tls", &ServerConfig::ucx_tls, "UCX transports (as UCX_TLS; empty: UCX's choice)"},
        {"backend", &ServerConfig::backend,
         "auto (cuda when built with CUDA and a GPU is present), cpu or cuda"},
        {"threads", &ServerConfig::threads, "CPU backend threads (0 = auto)"},
        {"max-num-seqs", &ServerConfig::max_num_seqs, "running requests at most"},
        {"max-num-batched-tokens", &ServerConfig::max_num_batched_tokens,
         "tokens per engine step (decode + prefill chunks); 0 = auto: 8192 on GPUs with at "
         "least 70 GiB, else 2048"},
        {"enforce-eager", &ServerConfig::enforce_eager,
         "CUDA: run every step eagerly, without CUDA graphs (slower decode steps; for "
         "comparisons; the CPU backend has no graphs)"},
        {"enable-prefix-caching", &ServerConfig::enable_prefix_caching,
         "automatic prefix caching: prompts reuse the KV of cached full blocks (on by default; "
         "on a --role decode instance imported prompt blocks stay in the host KV store); "
         "--no-enable-prefix-caching turns it off"},
        {"prefix-cache-host-gib", &ServerConfig::prefix_cache_host_gib,
         "the prefix cache's host tier: GiB of pinned host memory that cached blocks evicted "
         "from the GPU pool spill to, reloaded when a later prompt hits them (0 = none; split "
         "over the tensor-parallel ranks; at most 90% of the memory available with "
         "--host-kv-gib)"},
        {"max-waiting", &ServerConfig::max_waiting, "queued requests at most (more get HTTP 429)"},
        {"gpu-memory-utilization", &ServerConfig::gpu_memory_utilization,
         "fraction of GPU memory for weights + KV cache"},
        {"num-kv-slots", &ServerConfig::num_kv_slots,
         "CPU backend KV head-blocks per layer (0 = auto)"},
        {"tensor-parallel-size", &ServerConfig::tensor_parallel_size,
         "split every layer over N ranks: GPUs 0..N-1 in one process over NCCL (or N CPU-reference "
         "threads with "
         "--backend cpu); the heads and intermediate size must divide by N (docs/parallel.md)"},
        {"seed", &ServerConfig::seed, "engine seed for requests without one"},
        {"host", &ServerConfig::host, "HTTP listen address"},
        {"port", &ServerConfig::port, "HTTP port (0 = any free port, printed at start)"},
        {"grpc-port", &ServerConfig::grpc_port, "gRPC port (0 = gRPC off)"},
        {"grpc-max-concurrent-calls", &ServerConfig::grpc_max_concurrent_calls,
         "live gRPC Generate streams at most (more finish at once with RESOURCE_EXHAUSTED)"},
        {"api-key", &ServerConfig::api_key, "require 'Authorization: Bearer KEY' (empty = open)"},
        {"max-body-bytes", &ServerConfig::max_body_bytes,
         "largest accepted request body (larger: HTTP 413)"},
        {"http-threads", &ServerConfig::http_threads,
         "threads that parse HTTP requests and format responses (0 = 4); open connections and "
         "streams hold none"},
        {"max-n", &ServerConfig::max_n, "largest accepted n (choices per request)"},
        {"log-level", &ServerConfig::log_level, "trace, debug, info, warn, error or off"},
    };
    for (Setting& s : HttpFrontSettingFields<ServerConfig>()) table.push_back(s);
    return table;
  }();
  return settings;
}

}  // namespace

namespace {

std::string FormatGib(double gib) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", gib);
  return b;
}

// A --config file's JSON as ReadConfigJson reads it, and more: only a regular file of at most
// 16 MiB (a FIFO blocked, /dev/zero read forever), no key twice in one object (the last one
// silently won) and no setting under both spellings ("max_num_seqs" and "max-num-seqs").
StatusOr<nlohmann::json> ReadServerConfigJson(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !std::filesystem::is_symlink(path, ec))
    return NotFound("cannot open --config " + path);
  OASIS_ASSIGN_OR_RETURN(const std::string text,
                         ReadSmallFile(path, "--config file", kMaxConfigJsonBytes));
  std::vector<std::set<std::string>> objects;   // the keys of each object being parsed
  std::map<std::string, std::string> settings;  // top level: flag name -> the key naming it
  std::string duplicate;
  const auto seen = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) objects.emplace_back();
    if (event == E::object_end && !objects.empty()) objects.pop_back();
    if (event == E::key && !objects.empty() && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!objects.back().insert(key).second) {
        duplicate = "'" + key + "' appears twice";
      } else if (objects.size() == 1 && !key.empty() && key[0] != '_') {
        // Top level: settings, whose '-' and '_' spellings are one flag.
        const auto [it, fresh] = settings.emplace(FlagName(key), key);
        if (!fresh) {
          duplicate = "'" + it->second + "' and '" + key + "' both set --" + it->first;
        }
      }
    }
    return true;
  };
  OASIS_ASSIGN_OR_RETURN(nlohmann::json json, ParseConfigJson(text, path, seen));
  if (!duplicate.empty()) {
    return InvalidArgument(path + ": " + duplicate +
                           " (each setting may be given once in a config file)");
  }
  return json;
}

// A Validate error about a flag ("--port must be ...") set by a config file and not on the
// command line names the file and its key instead ("configs/x.json: port must be ...").
Status NameConfigFileInError(const Status& error,
                             const std::map<std::string, std::string>& from_file,
                             const FlagParser& flags) {
  const std::string& m = error.message();
  if (m.rfind("--", 0) != 0) return error;
  const size_t end = m.find_first_of(" ,:=)", 2);
  const std::string name = m.substr(2, end == std::string::npos ? std::string::npos : end - 2);
  const auto it = from_file.find(name);
  if (it == from_file.end() || flags.WasSet(name)) return error;
  return Status(error.code(), it->second + m.substr(2 + name.size()));
}

// `path` lexically normalised, without a trailing separator ("a/./b/" -> "a/b").
std::filesystem::path NormalPath(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p;
}
}  // namespace

std::string ModelNameFromPath(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = NormalPath(path);
  if (p.filename() == "." || p.filename() == "..") {  // ".", "..", "../..": name the directory
    std::error_code ec;
    const fs::path full = fs::weakly_canonical(fs::absolute(p, ec), ec);
    p = ec ? fs::path() : NormalPath(full.string());
  }
  std::string name = p.filename().string();
  return name.empty() || name == "." || name == ".." ? "model" : name;
}

std::string ServerConfig::ResolvedModelName() const {
  if (!served_model_name.empty()) return served_model_name;
  if (model.empty()) return "oasis-embedded";
  return ModelNameFromPath(model);
}

bool ServerConfig::ServesModelName(const std::string& requested) const {
  if (requested.empty() || requested == ResolvedModelName()) return true;
  if (!served_model_name.empty() || model.empty()) return false;
  return requested == model || NormalPath(requested) == NormalPath(model);
}

int64_t ServerConfig::ResolvedMaxNumBatchedTokens(const std::string& resolved_backend,
                                                  size_t min_device_bytes) const {
  if (max_num_batched_tokens > 0) return max_num_batched_tokens;
  constexpr size_t kLargeGpuBytes = size_t{70} << 30;
  return resolved_backend == "cuda" && min_device_bytes >= kLargeGpuBytes ? 8192 : 2048;
}

std::string ServerConfig::ResolvedStagingListen() const {
  if (!staging_listen.empty()) return staging_listen;
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":0";
}

std::string ServerConfig::ResolvedLookahead() const {
  if (lookahead != "auto") return lookahead;
  if (!HasDraftModel()) return "off";
  return num_speculative_tokens > 1 ? "speculate" : "reject";
}

std::string ServerConfig::ResolvedSparseSwitch() const {
  if (sparse_switch != "auto") return sparse_switch;
  return dense_layers > 0 ? "threshold" : "pressure";
}

std::string ServerConfig::ResolvedSparsePredictor() const {
  if (sparse_predictor != "auto") return sparse_predictor;
  return ResolvedLookahead() == "off" ? "previous-query" : "draft";
}

Status ServerConfig::Validate() const {
  auto one_of = [](const std::string& name, const std::string& v,
                   std::initializer_list<const char*> allowed) {
    std::string list;
    for (const char* a : allowed) {
      if (v == a) return Status::Ok();
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    return InvalidArgument("--" + name + " must be one of " + list + ", got '" + v + "'");
  };
  OASIS_RETURN_IF_ERROR(one_of("load-format", load_format, {"auto", "safetensors", "dummy"}));
  OASIS_RETURN_IF_ERROR(one_of("backend", backend, {"auto", "cpu", "cuda"}));
  OASIS_RETURN_IF_ERROR(
      one_of("log-level", log_level, {"trace", "debug", "info", "warn", "error", "off"}));
  OASIS_RETURN_IF_ERROR(one_of("draft-load-format", draft_load_format, {"auto", "dummy"}));
  OASIS_RETURN_IF_ERROR(one_of("lookahead", lookahead, {"auto", "off", "reject", "speculate"}));
  if ((lookahead == "reject" || lookahead == "speculate") && !HasDraftModel()) {
    return InvalidArgument(
        "--lookahead " + lookahead +
        " needs an EAGLE-3 draft head: --draft-model DIR or --draft-load-format dummy");
  }
  if (num_speculative_tokens < 1 || num_speculative_tokens > 4) {
    return InvalidArgument("--num-speculative-tokens must be 1 to 4, got " +
                           std::to_string(num_speculative_tokens));
  }
  if (num_speculative_tokens > 1 && ResolvedLookahead() != "speculate") {
    // The reason for each way of not speculating: lookahead off, reject, or no draft head.
    const std::string k = "--num-speculative-tokens " + std::to_string(num_speculative_tokens);
    const std::string head =
        "an EAGLE-3 draft head (--draft-model DIR or --draft-load-format dummy)";
    if (lookahead == "reject") {
      return InvalidArgument(k +
                             " needs --lookahead speculate: --lookahead reject verifies one draft "
                             "per step and emits none (give speculate, or auto, which resolves "
                             "to it with a draft head)");
    }
    if (lookahead == "off") {
      return InvalidArgument(k + " needs --lookahead speculate: --lookahead off runs no drafts" +
                             (HasDraftModel() ? "" : "; speculate also needs " + head));
    }
    return InvalidArgument(k + " needs --lookahead speculate, which needs " + head +
                           ": there is none, so --lookahead auto resolves to off");
  }
  OASIS_RETURN_IF_ERROR(one_of("speculative-depth", speculative_depth, {"fixed", "adaptive"}));
  if (kv_cache_dtype == "fp8_e5m2") {
    return InvalidArgument(
        "--kv-cache-dtype fp8_e5m2 is not supported: use fp8 (= fp8_e4m3, with per-KV-head "
        "scales)");
  }
  OASIS_RETURN_IF_ERROR(one_of("kv-cache-dtype", kv_cache_dtype, {"auto", "fp8", "fp8_e4m3"}));
  if (speculative_depth == "adaptive" && num_speculative_tokens < 2) {
    return InvalidArgument(
        "--speculative-depth adaptive picks the chain length in 1..--num-speculative-tokens: it "
        "needs --num-speculative-tokens 2 to 4 (and --lookahead speculate), got " +
        std::to_string(num_speculative_tokens));
  }
  OASIS_RETURN_IF_ERROR(one_of("sparse", sparse, {"auto", "on", "off"}));
  OASIS_RETURN_IF_ERROR(ParseToolParserKind(tool_call_parser).status());
  OASIS_RETURN_IF_ERROR(ParseReasoningParserKind(reasoning_parser).status());
  if (generation_config.empty()) {
    return InvalidArgument(
        "--generation-config must be auto, vllm or a directory holding generation_config.json");
  }
  if (enable_auto_tool_choice && tool_call_parser.empty()) {
    return InvalidArgument(
        "--enable-auto-tool-choice needs --tool-call-parser (hermes or llama3_json)");
  }
  OASIS_RETURN_IF_ERROR(
      one_of("sparse-predictor", sparse_predictor, {"auto", "draft", "previous-query", "oracle"}));
  OASIS_RETURN_IF_ERROR(one_of("sparse-group-reduce", sparse_group_reduce, {"sum", "max"}));
  OASIS_RETURN_IF_ERROR(one_of("kv-home", kv_home, {"host", "hbm", "auto"}));
  OASIS_RETURN_IF_ERROR(one_of("sparse-budget", sparse_budget, {"fixed", "adaptive"}));
  OASIS_RETURN_IF_ERROR(one_of("sparse-switch", sparse_switch, {"auto", "threshold", "pressure"}));
  if (sparse_switch == "pressure" && dense_layers > 0) {
    return InvalidArgument("--sparse-switch pressure needs --dense-layers 0, got " +
                           std::to_string(dense_layers) +
                           " (the pressure policy moves whole tables to the host store; "
                           "use --sparse-switch threshold)");
  }
  if (SparseEnabled() && ResolvedSparsePredictor() == "draft" && ResolvedLookahead() == "off") {
    return InvalidArgument(
        "--sparse-predictor draft needs lookahead decoding with an EAGLE-3 draft head "
        "(--draft-model DIR or "
        "--draft-load-format dummy, and --lookahead reject or speculate)");
  }
  if (!(fetch_ratio > 0.0 && fetch_ratio <= 1.0)) {
    return InvalidArgument("--fetch-ratio must be in (0, 1], got " + std::to_string(fetch_ratio));
  }
  if (!(host_kv_gib >= 0) || !std::isfinite(host_kv_gib))
    return InvalidArgument("--host-kv-gib must be >= 0, got " + std::to_string(host_kv_gib));
  // GiB sizes become byte and block counts (uint64, size_t): past kMaxGib they overflowed (a
  // staging pool of 1e30 GiB "held no head-block").
  for (const auto& [name, gib] : {std::pair{"host-kv-gib", host_kv_gib},
                                  std::pair{"prefix-cache-host-gib", prefix_cache_host_gib},
                                  std::pair{"staging-pool-gib", staging_pool_gib},
                                  std::pair{"remote-kv-gib", remote_kv_gib}}) {
    if (gib > kMaxGib) {
      return InvalidArgument(std::string("--") + name + " must be at most " +
                             std::to_string(static_cast<int64_t>(kMaxGib)) + " (1 PiB), got " +
                             FormatGib(gib));
    }
  }
  auto positive = [](const char* name, int64_t v) {
    return v >= 1 ? Status::Ok()
                  : InvalidArgument(std::string("--") + name + " must be >= 1, got " +
                                    std::to_string(v));
  };
  auto non_negative = [](const char* name, int64_t v) {
    return v >= 0 ? Status::Ok()
                  : InvalidArgument(std::string("--") + name + " must be >= 0, got " +
                                    std::to_string(v));
  };
  // Upper bounds: past them a count overflows what sizes are computed from, or asks for more
  // threads than any machine runs (a value is refused, never cut to 32 bits).
  auto at_most = [](const char* name, int64_t v, int64_t most) {
    return v <= most ? Status::Ok()
                     : InvalidArgument(std::string("--") + name + " must be at most " +
                                       std::to_string(most) + ", got " + std::to_string(v));
  };
  OASIS_RETURN_IF_ERROR(positive("max-num-seqs", max_num_seqs));
  OASIS_RETURN_IF_ERROR(at_most("max-num-seqs", max_num_seqs, int64_t{1} << 20));
  OASIS_RETURN_IF_ERROR(at_most("threads", threads, 1024));
  OASIS_RETURN_IF_ERROR(at_most("num-kv-slots", num_kv_slots, std::numeric_limits<int32_t>::max()));
  OASIS_RETURN_IF_ERROR(
      at_most("max-model-len", max_model_len, std::numeric_limits<int32_t>::max()));
  OASIS_RETURN_IF_ERROR(non_negative("max-num-batched-tokens", max_num_batched_tokens));
  OASIS_RETURN_IF_ERROR(positive("max-waiting", max_waiting));
  OASIS_RETURN_IF_ERROR(positive("max-body-bytes", max_body_bytes));
  OASIS_RETURN_IF_ERROR(positive("max-n", max_n));
  OASIS_RETURN_IF_ERROR(positive("draft-vocab-size", draft_vocab_size));
  OASIS_RETURN_IF_ERROR(positive("tensor-parallel-size", tensor_parallel_size));
  if (tensor_parallel_size > 1024) {
    return InvalidArgument("--tensor-parallel-size must be at most 1024, got " +
                           std::to_string(tensor_parallel_size));
  }
  OASIS_RETURN_IF_ERROR(non_negative("max-model-len", max_model_len));
  OASIS_RETURN_IF_ERROR(non_negative("threads", threads));
  OASIS_RETURN_IF_ERROR(non_negative("num-kv-slots", num_kv_slots));
  OASIS_RETURN_IF_ERROR(non_negative("http-threads", http_threads));
  if (http_threads > 1024) {
    return InvalidArgument("--http-threads must be at most 1024, got " +
                           std::to_string(http_threads));
  }
  OASIS_RETURN_IF_ERROR(CheckHttpFront());
  OASIS_RETURN_IF_ERROR(non_negative("seed", seed));
  OASIS_RETURN_IF_ERROR(positive("topk-blocks", topk_blocks));
  OASIS_RETURN_IF_ERROR(non_negative("sparse-threshold", sparse_threshold));
  OASIS_RETURN_IF_ERROR(at_most("sparse-threshold", sparse_threshold, kMaxSparseThreshold));
  // A request switches once its context exceeds the threshold, in blocks of 16 tokens: below
  // one block (but 0, the default) nothing is left dense. (A threshold at or past the model's
  // context is checked as the model loads: ResolveSparseConfig.)
  if (SparseEnabled() && sparse_threshold > 0 && sparse_threshold < 16) {
    return InvalidArgument(
        "--sparse-threshold must be at least one block (16 tokens) when sparse KV is on, got " +
        std::to_string(sparse_threshold) + " (0 with --sparse on: (--topk-blocks + 1) x 16)");
  }
  OASIS_RETURN_IF_ERROR(non_negative("dense-layers", dense_layers));
  OASIS_RETURN_IF_ERROR(non_negative("max-sparse-seqs", max_sparse_seqs));
  OASIS_RETURN_IF_ERROR(at_most("max-sparse-seqs", max_sparse_seqs, kMaxSparseSeqs));
  OASIS_RETURN_IF_ERROR(non_negative("sparse-agreement-interval", sparse_agreement_interval));
  if (sparse_transfers != "on" && sparse_transfers != "off") {
    return InvalidArgument("--sparse-transfers must be on or off, got '" + sparse_transfers + "'");
  }
  if (port < 0 || port > 65535)
    return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(port));
  if (grpc_port < 0 || grpc_port > 65535) {
    return InvalidArgument("--grpc-port must be in [0, 65535], got " + std::to_string(grpc_port));
  }
  if (grpc_port != 0 && grpc_port == port)
    return InvalidArgument("--grpc-port must differ from --port");
  if (grpc_max_concurrent_calls < 1 || grpc_max_concurrent_calls > kMaxGrpcConcurrentCalls) {
    return InvalidArgument("--grpc-max-concurrent-calls must be in [1, " +
                           std::to_string(kMaxGrpcConcurrentCalls) + "], got " +
                           std::to_string(grpc_max_concurrent_calls));
  }
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0)) {
    return InvalidArgument("--gpu-memory-utilization must be in (0, 1], got " +
                           std::to_string(gpu_memory_utilization));
  }
  if (host.empty()) return InvalidArgument("--host must not be empty");
  if (!IsListenAddress(host)) {
    return InvalidArgument("--host must be an IP address (IPv4 or IPv6) or localhost, got '" +
                           host + "'");
  }
  OASIS_RETURN_IF_ERROR(one_of("role", role, {"both", "prefill", "decode"}));
  OASIS_RETURN_IF_ERROR(one_of("rpf", rpf, {"on", "off"}));
  if (!(prefix_cache_host_gib >= 0) || !std::isfinite(prefix_cache_host_gib))
    return InvalidArgument("--prefix-cache-host-gib must be >= 0, got " +
                           std::to_string(prefix_cache_host_gib));
  if (prefix_cache_host_gib > 0) {
    if (!ResolvedPrefixCaching())
      return InvalidArgument(
          "--prefix-cache-host-gib needs prefix caching (it is off: --no-enable-prefix-caching)");
    if (role == "decode")
      return InvalidArgument(
          "--prefix-cache-host-gib does not apply to --role decode: a decode instance caches "
          "imported prompt blocks in its host KV store (--host-kv-gib)");
  }
  if (role != "both") {
    if (sparse == "off")
      return InvalidArgument("--role " + role + " needs sparse KV (not --sparse off)");
    if (tensor_parallel_size != 1)
      return InvalidArgument("--role " + role + " runs on one GPU (--tensor-parallel-size 1)");
    if (dense_layers != 0) return InvalidArgument("--role " + role + " needs --dense-layers 0");
  }
  if (!(staging_pool_gib >= 0) || !std::isfinite(staging_pool_gib)) {
    return InvalidArgument("--staging-pool-gib must be >= 0 (0: a quarter of the memory), got " +
                           std::to_string(staging_pool_gib));
  }
  if (!staging_secret.empty() && !staging_secret_file.empty()) {
    return InvalidArgument("--staging-secret and --staging-secret-file exclude each other");
  }
  if (staging_secret.size() > disagg::kMaxSecretBytes) {
    return InvalidArgument("--staging-secret must be at most " +
                           std::to_string(disagg::kMaxSecretBytes) + " bytes");
  }
  OASIS_RETURN_IF_ERROR(positive("staging-lease-ttl-ms", staging_lease_ttl_ms));
  OASIS_RETURN_IF_ERROR(non_negative("remote-fetch-cap", remote_fetch_cap));
  if (!std::isfinite(remote_kv_gib) || (remote_kv_gib < 0 && remote_kv_gib != -1)) {
    return InvalidArgument("--remote-kv-gib must be >= 0 or -1 (as much as --host-kv-gib), got " +
                           std::to_string(remote_kv_gib));
  }
  // The decode instance keeps a summary row for every remote block: 1/16 of the remote KV's
  // size, which must fit this machine (in device memory on a GPU; host memory here at least).
  if (remote_kv_gib > 16.0 * PhysicalHostMemoryGiB()) {
    return InvalidArgument("--remote-kv-gib " + FormatGib(remote_kv_gib) +
                           " GiB needs block summaries larger than this machine's memory (" +
                           FormatGib(PhysicalHostMemoryGiB()) + " GiB): at most 16 times it");
  }
  return Status::Ok();
}

nlohmann::ordered_json ServerConfig::ToJson() const {
  nlohmann::ordered_json j;
  for (const Setting& s : Settings()) {
    std::visit([&](auto member) { j[s.name] = this->*member; }, s.field);
  }
  if (!api_key.empty()) j["api-key"] = "<set>";
  if (!staging_secret.empty()) j["staging-secret"] = "<set>";
  return j;
}

Status ApplyConfigJson(const nlohmann::json& json, const std::string& source,
                       ServerConfig* config) {
  return ApplySettingsJson(json, source, Settings(), config);
}

Status LoadConfigFile(const std::string& path, ServerConfig* config) {
  // Relative model paths in a config file are relative to the current directory (like flags).
  OASIS_ASSIGN_OR_RETURN(const nlohmann::json json, ReadServerConfigJson(path));
  return ApplyConfigJson(json, path, config);
}

std::vector<std::string> ServerConfig::IgnoredSettings(const std::set<std::string>& given) const {
  std::vector<std::string> out;
  auto ignored = [&](std::initializer_list<const char*> names, const std::string& why) {
    for (const char* name : names) {
      if (given.count(name) != 0)
        out.push_back("--" + std::string(name) + " has no effect: " + why);
    }
  };
  if (!SparseEnabled()) {
    ignored({"host-kv-gib", "topk-blocks", "fetch-ratio", "dense-layers", "sparse-predictor",
             "sparse-switch", "kv-home", "sparse-budget", "sparse-group-reduce", "max-sparse-seqs",
             "sparse-transfers", "sparse-agreement-interval"},
            sparse == "off" ? "sparse KV is off (--sparse off)"
                            : "sparse KV is off (--sparse auto turns it on only with "
                              "--sparse-threshold > 0 or a prefill/decode --role; or pass "
                              "--sparse on)");
    if (sparse == "off") ignored({"sparse-threshold"}, "sparse KV is off (--sparse off)");
  }
  if (role != "prefill") {
    ignored({"staging-pool-gib", "staging-listen", "staging-advertise", "staging-lease-ttl-ms"},
            "it applies to a --role prefill instance (this is --role " + role + ")");
  }
  if (role != "decode") {
    ignored({"rpf", "remote-fetch-cap", "remote-kv-gib"},
            "it applies to a --role decode instance (this is --role " + role + ")");
  }
  if (role == "both") {
    ignored({"staging-secret", "staging-secret-file", "ucx-tls"},
            "it applies to prefill and decode instances (this is --role both)");
  }
  if (backend == "cuda") {
    ignored({"threads", "num-kv-slots"},
            "it applies to the CPU backend (this is --backend cuda: the GPU's KV cache is sized by "
            "--gpu-memory-utilization)");
  }
  if (backend == "cpu") ignored({"enforce-eager"}, "the CPU backend has no CUDA graphs");
  return out;
}

StatusOr<ParsedCommandLine> ParseCommandLine(int argc, char** argv) {
  ParsedCommandLine out;
  std::set<std::string> given;  // flag names set by a config file or the command line
  // Pass 1: the config file, so that flags given on the command line override it.
  for (int i = 1; i + 1 < argc; ++i) {  // "--config=" is refused by ConfigPaths
    if (std::string(argv[i]) == "--config" && argv[i + 1][0] == '\0')
      return InvalidArgument("--config needs a value (a JSON file), got an empty path");
  }
  OASIS_ASSIGN_OR_RETURN(const std::vector<std::string> paths, ConfigPaths(argc, argv));
  // Flag name -> where a config file set it ("FILE: KEY"), for errors about its value.
  std::map<std::string, std::string> from_file;
  for (const std::string& path : paths) {
    OASIS_ASSIGN_OR_RETURN(const nlohmann::json json, ReadServerConfigJson(path));
    OASIS_RETURN_IF_ERROR(ApplyConfigJson(json, path, &out.config));
    if (json.is_object()) {
      for (const auto& item : json.items()) {
        given.insert(FlagName(item.key()));
        from_file[FlagName(item.key())] = path + ": " + item.key();
      }
    }
  }
  // Pass 2: flags, bound to the fields (their defaults now being the file's values).
  FlagParser flags(
      "oasis-server: OpenAI-compatible HTTP (and gRPC) server for Qwen3 / Llama 3.x models.\n"
      "Settings come from --config FILE (JSON, keys = flag names) and flags, flags winning.");
  std::string config_path;
  flags.AddString("config", &config_path, "JSON file of settings (keys: the flag names)");
  flags.AddBool("check-config", &out.check_config,
                "load the model, validate the settings, print them and exit");
  ServerConfig& c = out.config;
  AddSettingFlags(flags, Settings(), &c);
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  out.help = flags.help_requested();
  out.usage = flags.Usage();
  if (!out.help) {
    Status valid = c.Validate();
    if (!valid.ok()) return NameConfigFileInError(valid, from_file, flags);
  }
  for (const Setting& setting : Settings()) {
    if (flags.WasSet(setting.name)) given.insert(setting.name);
  }
  c.prefix_caching_given = given.count("enable-prefix-caching") != 0;
  out.ignored = c.IgnoredSettings(given);
  return out;
}

std::string EmbeddedModelDir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("OASIS_EMBEDDED_MODEL"); env != nullptr && *env != '\0')
    return env;
#ifdef OASIS_EMBEDDED_MODEL_DIR
  if (fs::exists(fs::path(OASIS_EMBEDDED_MODEL_DIR) / "config.json"))
    return OASIS_EMBEDDED_MODEL_DIR;
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& candidate :
         {exe.parent_path() / "../share/oasiskv/embedded", exe.parent_path() / "embedded"}) {
      if (fs::exists(candidate / "config.json")) return fs::weakly_canonical(candidate).string();
    }
  }
#ifdef OASIS_EMBEDDED_MODEL_DIR
  return OASIS_EMBEDDED_MODEL_DIR;  // reported as missing by the loader
#else
  return "models/embedded";
#endif
}

StatusOr<std::string> ResolveStagingSecret(const ServerConfig& c) {
  std::string secret;
  std::string source;
  if (!c.staging_secret_file.empty()) {
    if (!c.staging_secret.empty()) {
      return InvalidArgument("--staging-secret and --staging-secret-file exclude each other");
    }
    std::error_code ec;
    if (std::filesystem::is_directory(c.staging_secret_file, ec)) {
      return InvalidArgument("--staging-secret-file " + c.staging_secret_file + " is a directory");
    }
    std::ifstream in(c.staging_secret_file, std::ios::binary);
    std::stringstream ss;
    if (in) ss << in.rdbuf();
    if (!in || in.bad()) {
      return InvalidArgument("--staging-secret-file " + c.staging_secret_file + ": cannot be read");
    }
    secret = ss.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty())
      return InvalidArgument("--staging-secret-file " + c.staging_secret_file + " is empty");
    source = "--staging-secret-file " + c.staging_secret_file;
  } else if (!c.staging_secret.empty()) {
    secret = c.staging_secret;
    source = "--staging-secret";
  } else if (const char* env = std::getenv(kStagingSecretEnv); env != nullptr) {
    secret = env;
    source = std::string("$") + kStagingSecretEnv;
  }
  if (secret.size() > disagg::kMaxSecretBytes) {
    return InvalidArgument(source + ": the staging secret must be at most " +
                           std::to_string(disagg::kMaxSecretBytes) + " bytes, got " +
                           std::to_string(secret.size()));
  }
  return secret;
}

Status CheckStagingSecurity(const ServerConfig& c) {
  OASIS_ASSIGN_OR_RETURN(const std::string secret, ResolveStagingSecret(c));
  if (c.role != "prefill") return Status::Ok();
  const std::string listen = c.ResolvedStagingListen();
  OASIS_ASSIGN_OR_RETURN(const disagg::SockAddr addr, disagg::ResolveHostPort(listen));
  if (!secret.empty() || disagg::IsLoopback(addr)) return Status::Ok();
  const std::string env = kStagingSecretEnv;
  return InvalidArgument("the staging listener would listen on " + listen + " (" +
                         disagg::FormatSockAddr(addr.get()) +
                         (c.staging_listen.empty() ? ", from --host" : "") +
                         "), which other machines can reach, without a secret: any of them "
                         "could read the staged KV. Give the prefill and decode instances the "
                         "same secret (--staging-secret-file FILE, $" +
                         env +
                         " or --staging-secret), or listen on loopback (--staging-listen "
                         "127.0.0.1:0)");
}

Status CheckHostMemory(const ServerConfig& c) {
  // A store the machine cannot hold is refused at start, not discovered under load (or as a
  // failed allocation): the sizes given, before the model loads (a default store is checked
  // once sized, CheckHostKvFits from ResolveSparseConfig).
  return CheckHostKvFits(c, c.SparseEnabled() ? c.host_kv_gib : 0.0, AvailableHostMemoryGiB(),
                         PhysicalHostMemoryGiB());
}

double ResolvedHostKvGib(const ServerConfig& c, std::optional<double> avail_gib,
                         double physical_gib) {
  if (c.host_kv_gib > 0) return c.host_kv_gib;
  const double by_default = avail_gib ? kHostKvDefaultShare * *avail_gib : physical_gib / 4.0;
  // The prefix cache's host tier comes out of the same memory.
  return std::max(kHostKvDefaultFloor * by_default, by_default - c.prefix_cache_host_gib);
}

Status CheckHostKvFits(const ServerConfig& c, double host_kv_gib, std::optional<double> avail_gib,
                       double physical_gib) {
  // At most kHostKvShareOfAvailable of the memory available, for the sparse host store and the
  // prefix cache's host tier together.
  const double total = host_kv_gib + c.prefix_cache_host_gib;
  if (total <= 0 || !avail_gib) return Status::Ok();
  const double cap = kHostKvShareOfAvailable * *avail_gib;
  if (total <= cap) return Status::Ok();
  const bool auto_store = host_kv_gib > 0 && c.host_kv_gib <= 0;
  std::string what;
  if (host_kv_gib > 0) {
    what = auto_store ? "--host-kv-gib 0 (the default store: " + FormatGib(host_kv_gib) +
                            " GiB, half the memory available less --prefix-cache-host-gib, at "
                            "least a quarter of that half)"
                      : "--host-kv-gib " + FormatGib(host_kv_gib);
  }
  if (c.prefix_cache_host_gib > 0)
    what += (what.empty() ? "" : " + ") +
            ("--prefix-cache-host-gib " + FormatGib(c.prefix_cache_host_gib));
  char msg[480];
  std::snprintf(msg, sizeof msg,
                ": this machine has %.2f GiB of memory available now "
                "(MemAvailable and the memory cgroup, of %.2f GiB); host KV memory may take at "
                "most %.0f%% of it, %.2f GiB",
                *avail_gib, physical_gib, kHostKvShareOfAvailable * 100, cap);
  std::string out =
      what +
      (host_kv_gib > 0 && c.prefix_cache_host_gib > 0 ? " = " + FormatGib(total) + " GiB"
                                                      : std::string()) +
      msg;
  if (auto_store && c.prefix_cache_host_gib > 0) {
    // With the default store at its floor, the tier may take what the floor leaves.
    const double most = cap - kHostKvDefaultFloor * kHostKvDefaultShare * *avail_gib;
    char fix[240];
    std::snprintf(fix, sizeof fix,
                  ": lower --prefix-cache-host-gib to at most %.2f GiB, or give --host-kv-gib so "
                  "that the two take at most %.2f GiB",
                  std::max(0.0, most), cap);
    out += fix;
  }
  return InvalidArgument(out);
}

}  // namespace oasis::server
