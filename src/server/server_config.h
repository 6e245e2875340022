// ServerConfig: every setting of oasis-server, from an optional JSON config file
// (`--config FILE`) overridden by command-line flags. Keys in the file are the flag names
// with '-' or '_' ("max-num-seqs" or "max_num_seqs"); unknown keys and wrong types are
// InvalidArgument errors naming the key. Plain value type; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http_front_settings.h"
#include "oasis/status.h"

namespace oasis::server {

// The largest share of the memory available at start (/proc/meminfo MemAvailable) a host KV
// store may take; the default takes kHostKvDefaultShare of it.
inline constexpr double kHostKvShareOfAvailable = 0.9;
// The largest value of a --*-gib flag (1 PiB): their byte and block counts then fit 64 bits.
inline constexpr double kMaxGib = 1024.0 * 1024.0;
inline constexpr double kHostKvDefaultShare = 0.5;
// The default store shrinks by --prefix-cache-host-gib down to this share of its default size.
inline constexpr double kHostKvDefaultFloor = 0.25;
// The largest --max-sparse-seqs (rows of the sparse device state) and --sparse-threshold.
inline constexpr int64_t kMaxSparseSeqs = 65536;
inline constexpr int64_t kMaxSparseThreshold = 2147483647;
// The largest --grpc-max-concurrent-calls (each live stream holds a GenerationJob, no thread).
inline constexpr int64_t kMaxGrpcConcurrentCalls = 65536;

// The HTTP front's limits and timeouts (--max-connections, --*-timeout-s) are the base's.
struct ServerConfig : HttpFrontSettings {
  // Model.
  std::string model;                 // model directory; empty = the embedded default model
  std::string tokenizer;             // tokenizer.json or its directory; empty = the model directory
  std::string chat_template;         // Jinja file overriding tokenizer_config.json's template
  std::string load_format = "auto";  // auto (= safetensors), safetensors, dummy
  std::string served_model_name;     // empty: --model's last path component ("oasis-embedded" for
                                     // the default model), never the path itself
  int64_t max_model_len = 0;         // 0: the model's max_position_embeddings (RoPE-scaled)
  // Request defaults from generation_config.json (server/generation_defaults.h): auto, vllm or
  // a directory.
  std::string generation_config = "auto";

  // Chat output parsing (vLLM's flags; docs/server.md "Tool calls and reasoning").
  bool enable_auto_tool_choice = false;  // tool_choice "auto" parses tool calls
  // Automatic prefix caching (EngineOptions), on by default as vLLM's; off by itself where it
  // does not reach yet (a decode instance) unless given explicitly, which that refuses.
  // prefix_caching_given: set by the command line or a config file (not a setting).
  bool enable_prefix_caching = true;
  bool prefix_caching_given = false;
  // CUDA: run every step eagerly, no CUDA graphs (vLLM's --enforce-eager; for comparisons and
  // debugging: decode steps are slower). No effect on the CPU backend, which has no graphs.
  bool enforce_eager = false;
  // The prefix cache's host tier (docs/prefix_caching.md): GiB of page-locked host memory
  // that cached blocks evicted from the GPU pool spill to and reload from. 0 = none.
  double prefix_cache_host_gib = 0;
  std::string tool_call_parser;  // "", hermes, llama3_json
  std::string reasoning_parser;  // "", qwen3, deepseek_r1

  // Lookahead decoding with an EAGLE-3 draft head (docs/lookahead.md).
  std::string draft_model;  // EAGLE-3 head directory (config.json + *.safetensors)
  std::string draft_load_format =
      "auto";  // auto (= safetensors), dummy (random weights at real shapes)
  int64_t draft_vocab_size =
      32000;  // dummy heads without --draft-model: capped at the target vocab
  std::string lookahead =
      "auto";  // auto (reject with a draft model, else off), off, reject, speculate
  // Draft chain length under speculate (vLLM's name), 1..4; > 1 needs speculate (auto
  // resolves to it).
  int64_t num_speculative_tokens = 1;
  // Chain depth under speculate: fixed (num_speculative_tokens every step) or adaptive (the
  // engine picks 1..num_speculative_tokens per step; needs speculate and k >= 2).
  std::string speculative_depth = "fixed";

  // KV cache element type (vLLM's --kv-cache-dtype): auto (the activation dtype: bf16 on
  // CUDA, f32 on the CPU reference) or fp8 / fp8_e4m3 (e4m3 with per-KV-head scales
  // calibrated at start-up; docs/fp8.md).
  std::string kv_cache_dtype = "auto";
  bool KvCacheFp8() const { return kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3"; }

  // Lookahead sparse KV (docs/sparse.md): long requests decode over a per-head working set
  // of top-K blocks; their full KV lives in a host store.
  std::string sparse = "auto";   // auto (on when sparse_threshold > 0), on, off
  double host_kv_gib = 0;        // host KV store; 0 = half the memory available at start (at most
                                 // kHostKvShareOfAvailable of it when set)
  int64_t topk_blocks = 128;     // K: blocks per (request, layer, KV head)
  double fetch_ratio = 0.05;     // C = ceil(ratio * K) blocks fetched per head per step
  int64_t sparse_threshold = 0;  // switch past this context; 0 with --sparse on: (K + 1) * 16
  int64_t dense_layers = 0;      // the first N layers stay dense
  std::string kv_home = "auto";  // sparse KV home: host | hbm | auto
  std::string sparse_switch = "auto";      // auto | threshold | pressure
  std::string sparse_budget = "adaptive";  // fetch caps: adaptive (per layer, [1, C]) | fixed
  std::string sparse_predictor =
      "auto";  // auto (draft with lookahead, else previous-query), draft, previous-query, oracle
  std::string sparse_group_reduce = "sum";  // GQA reduction of block scores: sum, max
  int64_t max_sparse_seqs = 0;              // sparse requests at once; 0 = max_num_seqs
  int64_t sparse_agreement_interval = 32;   // sample top-K agreement every N steps; 0 = never
  std::string sparse_transfers = "on";  // off: measurement mode, nothing copied into working sets

  // Disaggregated prefill/decode (docs/disaggregation.md): a prefill instance runs prompts and
  // hands each request's KV to a decode instance through its UCX staging pool; a decode
  // instance takes requests with a handoff ticket (from oasis-router) and reads their KV.
  std::string role = "both";      // both (a single instance), prefill, decode
  double staging_pool_gib = 0;    // prefill: the staging pool (0 = a quarter of the machine's RAM)
  std::string staging_listen;     // prefill: the staging server's UCX listener host:port (port 0 =
                                  // any; empty: --host, any port)
  std::string staging_advertise;  // prefill: the host written into tickets (empty: the listen host,
                                  // or this machine's name when listening on 0.0.0.0)
  int64_t staging_lease_ttl_ms = 30000;  // prefill: staged KV lives this long without a renewal
  // The staging pool's shared secret (prefill: asked of every decode instance, required when
  // the listener is not on loopback; decode: sent). The flag shows in `ps`: prefer the file or
  // $OASIS_STAGING_SECRET (ResolveStagingSecret).
  std::string staging_secret;
  std::string staging_secret_file;  // a file holding the secret (trailing newlines ignored)
  std::string rpf = "on";           // decode: on = remote partial fetch, off = full KV at admission
  int64_t remote_fetch_cap = 0;     // decode: remote blocks fetched per head per step (0 = C)
  double remote_kv_gib = -1;  // decode: remote KV tracked on summary-only rows (-1 = host_kv_gib)
  std::string ucx_tls;        // UCX transports (UCX_TLS), empty: UCX's choice

  // Execution.
  std::string backend = "auto";  // auto (cuda when built with CUDA and a GPU is present), cpu, cuda
  int64_t threads = 0;           // CPU backend threads (0 = auto)
  int64_t max_num_seqs = 256;
  // Tokens per engine step (0 = auto: ResolvedMaxNumBatchedTokens).
  int64_t max_num_batched_tokens = 0;
  int64_t max_waiting = 4096;  // queued requests beyond this get 429
  double gpu_memory_utilization = 0.9;
  int64_t num_kv_slots = 0;  // CPU backend head-blocks per layer (0 = auto)
  int64_t tensor_parallel_size =
      1;             // ranks each layer is split over (GPUs 0..N-1; docs/parallel.md)
  int64_t seed = 0;  // engine seed for unseeded requests

  // Serving.
  std::string host = "127.0.0.1";
  int64_t port = 8000;               // 0: any free port (printed at start)
  int64_t grpc_port = 0;             // 0: gRPC off
  std::string api_key;               // empty: no authentication
  int64_t max_body_bytes = 8 << 20;  // larger request bodies get 413
  int64_t http_threads = 0;          // handler threads (0: 4); streams and waits hold none
  int64_t max_n = 128;               // largest accepted `n`
  std::string log_level = "info";
  // gRPC Generate streams live at once; more finish at once with RESOURCE_EXHAUSTED.
  int64_t grpc_max_concurrent_calls = 256;

  // The model name clients see and use: --served-model-name, else ModelNameFromPath(--model)
  // (so that /v1/models does not reveal the server's filesystem layout).
  std::string ResolvedModelName() const;
  // Whether a request's "model" names the served model: empty, ResolvedModelName(), or,
  // without --served-model-name, the --model path as given (vLLM clients send the path;
  // compared lexically, ignoring "." segments and a trailing '/').
  bool ServesModelName(const std::string& requested) const;
  // --staging-listen, or --host with port 0 ("[host]:0" for an IPv6 literal).
  std::string ResolvedStagingListen() const;
  // Whether a draft head is to be loaded (--draft-model, or --draft-load-format dummy).
  bool HasDraftModel() const { return !draft_model.empty() || draft_load_format == "dummy"; }
  // --lookahead with "auto" resolved: "reject" with a draft model ("speculate" with
  // --num-speculative-tokens > 1), else "off".
  std::string ResolvedLookahead() const;
  // Sparse KV: --sparse on, or auto with --sparse-threshold > 0 or a prefill/decode role.
  bool SparseEnabled() const {
    return sparse == "on" || (sparse == "auto" && (sparse_threshold > 0 || role != "both"));
  }
  // Whether prefix caching runs: --enable-prefix-caching (default on). On a decode instance it
  // keeps imported prompt blocks in the host KV store for later imports of the same prefix
  // (docs/prefix_caching.md "The decode side").
  bool ResolvedPrefixCaching() const { return enable_prefix_caching; }
  // --sparse-predictor with "auto" resolved: "draft" when lookahead is on, else "previous-query".
  std::string ResolvedSparsePredictor() const;
  // auto: pressure, or threshold with --dense-layers > 0 (the pressure policy switches whole
  // tables and needs every layer sparse).
  std::string ResolvedSparseSwitch() const;
  // --sparse-threshold, or (K + 1) * 16 (one working set) when 0.
  int64_t ResolvedSparseThreshold() const {
    return sparse_threshold > 0 ? sparse_threshold : (topk_blocks + 1) * 16;
  }

  // --max-num-batched-tokens with 0 (auto) resolved as vLLM does for its API server: 8192
  // on the CUDA backend when every GPU it uses has at least 70 GiB (H100, H200: the
  // prefill chunks of long prompts run near the GEMM peak, at the cost of longer steps for
  // the decodes that share them), else 2048. `backend` is the resolved backend ("cpu" or
  // "cuda"); `min_device_bytes` the smallest total memory of the GPUs used (0: unknown).
  int64_t ResolvedMaxNumBatchedTokens(const std::string& backend, size_t min_device_bytes) const;

  // Range checks that need no model (ports, fractions, positive limits, enum values).
  Status Validate() const;
  // The settings in `given` (flag names, from the command line or the config file) that the
  // chosen mode never reads, one line each with the reason ("--sparse-budget has no effect:
  // sparse KV is off (--sparse off)"): sparse settings without sparse KV, a prefill or decode
  // instance's settings on another role, the CPU backend's with --backend cuda.
  std::vector<std::string> IgnoredSettings(const std::set<std::string>& given) const;
  nlohmann::ordered_json ToJson() const;
};

struct ParsedCommandLine {
  ServerConfig config;
  bool help = false;          // --help was given; `usage` holds the text
  bool check_config = false;  // --check-config: load the model, validate, exit
  std::string usage;
  // Settings given that the chosen mode ignores (ServerConfig::IgnoredSettings): logged as
  // warnings at start.
  std::vector<std::string> ignored;
};

// Reads --config FILE (when given) then applies the other flags on top.
StatusOr<ParsedCommandLine> ParseCommandLine(int argc, char** argv);
// Applies a JSON object of settings to `config` (the config file's contents).
Status ApplyConfigJson(const nlohmann::json& json, const std::string& source, ServerConfig* config);
Status LoadConfigFile(const std::string& path, ServerConfig* config);

// The name a model directory is served under by default: its last path component
// ("/models/Qwen3-8B/" -> "Qwen3-8B"; "." -> the current directory's name), "model" when the
// path has none (e.g. "/").
std::string ModelNameFromPath(const std::string& path);

// The staging secret: --staging-secret, else the contents of --staging-secret-file (trailing
// newlines dropped), else $OASIS_STAGING_SECRET, else empty (none). InvalidArgument for both
// the flag and the file, a file that cannot be read or holds nothing, or a secret longer than
// disagg::kMaxSecretBytes.
inline constexpr char kStagingSecretEnv[] = "OASIS_STAGING_SECRET";
StatusOr<std::string> ResolveStagingSecret(const ServerConfig& c);
// Start-up check of a prefill instance's staging listener: the secret resolves, and a listen
// address other machines can reach (not loopback: e.g. 0.0.0.0 or a network interface's)
// has one; InvalidArgument naming the settings otherwise (the server exits 2). Ok for the
// other roles.
Status CheckStagingSecurity(const ServerConfig& c);

// The directory of the embedded default model: $OASIS_EMBEDDED_MODEL, the source tree's
// models/embedded (built-in path), or share/oasiskv/embedded beside the executable.
std::string EmbeddedModelDir();

// Whether this machine can hold what `c` asks of host memory now (--host-kv-gib against
// MemAvailable): InvalidArgument naming the numbers. Not part of Validate (a config written for
// another machine still validates); the server checks it at start (exit 2). It counts the sizes
// given; a default (0) --host-kv-gib is sized and checked with CheckHostKvFits as the model loads.
Status CheckHostMemory(const ServerConfig& c);

// The sparse host KV store's size in GiB: --host-kv-gib when given; when 0 (auto),
// kHostKvDefaultShare of `avail_gib` (a quarter of `physical_gib` when unknown) less
// --prefix-cache-host-gib, but at least kHostKvDefaultFloor of that default.
double ResolvedHostKvGib(const ServerConfig& c, std::optional<double> avail_gib,
                         double physical_gib);
// Whether `avail_gib` holds the host store at `host_kv_gib` (as resolved; 0 without sparse KV)
// and the prefix cache's host tier together: at most kHostKvShareOfAvailable of it (Ok when
// unknown). InvalidArgument naming both flags, the numbers and what would fit otherwise.
Status CheckHostKvFits(const ServerConfig& c, double host_kv_gib, std::optional<double> avail_gib,
                       double physical_gib);

}  // namespace oasis::server
