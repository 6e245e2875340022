// ModelHost: everything oasis-server loads for one model, in dependency order — the backend
// (CPU, or CUDA with the CUDA-graph runner and a KV pool sized by --gpu-memory-utilization),
// the weights, the DecoderLM, its ModelRunner, the optional EAGLE-3 draft head and its
// DraftRunner (lookahead decoding), the tokenizer, the chat template and the Engine
// (started; with sparse KV on, the engine owns the host KV store and attaches it to the
// runner, which builds its sparse pipelines). Members are destroyed in reverse: the engine stops
// first.
//
// Owns all of them. Immutable after LoadModelHost returns; the engine and tokenizer are
// thread-safe, so request threads share one ModelHost read-only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "disagg/kv_transfer.h"
#include "disagg/staging_server.h"
#include "engine/engine.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "models/eagle3.h"
#include "oasis/model_config.h"
#include "runner/draft_runner.h"
#include "runner/model_runner.h"
#include "server/generation_defaults.h"
#include "server/server_config.h"
#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/structured/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace oasis::server {

struct ModelHost {
  // The model's directory: `model_path` is where it is loaded from (the resolved --model, or
  // the embedded model's directory), for loading and local logs only; `model_dir` is what
  // clients may see (/v1/models "root"): the directory's name (ModelNameFromPath), never the
  // path, which would reveal the server's filesystem layout.
  std::string model_path;
  std::string model_dir;
  std::string backend_name;            // "cpu" or "cuda"
  int64_t max_num_batched_tokens = 0;  // the resolved --max-num-batched-tokens
  ModelConfig config;  // max_position_embeddings = the served context length; eos_token_ids
                       // = config.json's and generation_config.json's
  GenerationDefaults
      generation;  // request defaults from generation_config.json (--generation-config)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Eagle3Head> draft_head;     // null: no draft model
  std::unique_ptr<DraftRunner> draft_runner;  // the head's KV pool and step
  LookaheadMode lookahead = LookaheadMode::kOff;
  std::optional<SparseConfig> sparse;               // null: sparse KV off (as given to the engine)
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null: token ids only
  // The tokenizer's tokens as bytes for structured output's masks (null without a tokenizer).
  std::shared_ptr<const structured::TokenVocabulary> grammar_vocab;
  std::optional<ChatTemplate> chat_template;  // null: /v1/chat/completions answers 400
  ChatTemplateFiles template_files;
  // Disaggregation (--role prefill / decode; null otherwise). Declared before the engine:
  // the engine stops first, then the staging server and pool go.
  std::string role = "both";
  std::shared_ptr<disagg::UcxContext> ucx;
  std::unique_ptr<disagg::StagingPool> staging_pool;      // prefill
  std::unique_ptr<disagg::StagingServer> staging_server;  // prefill
  std::unique_ptr<disagg::StagingExporter> exporter;      // prefill
  std::shared_ptr<disagg::RemoteKvImporter> importer;     // decode
  bool full_transfer = false;                             // decode: --rpf off
  std::unique_ptr<Engine> engine;

  ~ModelHost();
  int64_t max_model_len() const { return config.max_position_embeddings; }
};

// Loads and starts everything `config` names. Errors name the file or setting at fault.
StatusOr<std::unique_ptr<ModelHost>> LoadModelHost(const ServerConfig& config);

// "cuda" when built with CUDA and a device is present, else "cpu".
std::string AutoBackend();

// The engine's sparse KV settings from the server's (nullopt when off); InvalidArgument
// naming the flag for values out of range. `model` is the served model's config.
StatusOr<std::optional<SparseConfig>> ResolveSparseConfig(const ServerConfig& config,
                                                          const ModelConfig& model);

// The request lengths whose capacity the start-up log and --check-config state: 16K and 32K
// tokens where the context allows, else the context.
std::vector<int64_t> CapacityLengths(const ModelHost& host);

}  // namespace oasis::server
