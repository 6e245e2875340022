// oasis-server: the OpenAI-compatible HTTP server (and optional gRPC API) over the engine.
//
//   oasis-server                                  # the embedded default model on 127.0.0.1:8000
//   oasis-server --model /models/Qwen3-8B --served-model-name qwen3-8b --grpc-port 50051
//   oasis-server --config configs/qwen3-8b.json --port 9000     # flags override the file
//   oasis-server --config configs/qwen3-8b.json --check-config  # validate, print, exit
//
// Start-up: bind HTTP (and gRPC) first so /health answers 503 while the model loads, then
// load, then 200. SIGINT/SIGTERM: refuse new requests, abort live ones (streams end with
// finish_reason "abort" and [DONE]), give clients --shutdown-timeout-s to take that, cut the
// rest, release the model, exit 0. Prints "oasis-server: listening on http://HOST:PORT" (with the
// real port when --port 0) and "oasis-server: ready" to stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>

#include <spdlog/spdlog.h>

#include "common/program.h"
#include "server/grpc_service.h"
#include "server/http_server.h"
#include "server/model_host.h"
#include "server/serving.h"

using namespace oasis;
using namespace oasis::server;

namespace {

// The resolved sparse KV settings (null when off).
nlohmann::ordered_json SparseJson(ModelHost& host) {
  if (!host.sparse) return nullptr;
  const SparseConfig& s = *host.sparse;
  const EngineStats st = host.engine->Stats();
  return {{"threshold", s.sparse_threshold},
          {"topk_blocks", s.topk_blocks},
          {"max_fetch_per_head", s.max_fetch()},
          {"budget", SparseBudgetName(s.budget)},
          {"dense_layers", s.dense_layers},
          {"predictor", SparsePredictorName(s.predictor)},
          {"group_reduce", s.group_reduce == GroupReduce::kSum ? "sum" : "max"},
          {"max_sparse_seqs", s.max_sparse_seqs},
          {"kv_home", KvHomeName(s.home)},
          {"switch", s.switch_on_pressure ? "pressure" : "threshold"},
          {"host_kv_gib", s.host_kv_gib},
          {"host_kv_slots", st.sparse.num_host_kv_slots}};
}

// Requests the KV holds at once at 16K and 32K tokens each (Engine::CapacityAt).
nlohmann::ordered_json CapacityJson(const ModelHost& host) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int64_t tokens : CapacityLengths(host)) {
    const KvCapacity k = host.engine->CapacityAt(tokens);
    nlohmann::ordered_json row = {{"tokens", tokens}, {"dense", k.dense}};
    if (host.sparse) {
      row["sparse"] = k.sparse;
      row["sparse_hbm"] = k.hbm;
      row["sparse_host"] = k.host;
    }
    out.push_back(row);
  }
  return out;
}

Status CheckConfig(const ServerConfig& config) {
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<ModelHost> host, LoadModelHost(config));
  nlohmann::ordered_json out = config.ToJson();
  out["resolved"] = {
      {"model_dir", host->model_path},
      {"served_model_name", config.ResolvedModelName()},
      {"backend", host->backend_name},
      {"max_num_batched_tokens", host->max_num_batched_tokens},
      {"architecture", host->config.architecture_name},
      {"max_model_len", host->max_model_len()},
      {"rope_type", RopeTypeName(host->config.rope_scaling.type)},
      {"generation_config", host->generation.ToJson()},
      {"num_kv_slots", host->runner->num_kv_slots()},
      {"tensor_parallel_size", config.tensor_parallel_size},
      {"kv_heads_per_rank", host->runner->model().config().num_key_value_heads},
      {"lookahead", LookaheadModeName(host->lookahead)},
      {"num_speculative_tokens",
       host->lookahead == LookaheadMode::kSpeculate ? config.num_speculative_tokens : 1},
      {"speculative_depth",
       host->lookahead == LookaheadMode::kSpeculate ? config.speculative_depth : "fixed"},
      {"enable_prefix_caching", config.ResolvedPrefixCaching()},
      {"enforce_eager", config.enforce_eager},
      {"kv_cache_dtype", host->engine->Stats().kv.dtype},
      {"prefix_cache_host_blocks", host->engine->Stats().kv.prefix_cache_host_capacity_blocks},
      {"draft_head", host->draft_head != nullptr},
      {"draft_kv_slots", host->draft_runner ? host->draft_runner->num_kv_slots() : 0},
      {"sparse", SparseJson(*host)},
      {"capacity", CapacityJson(*host)},
      {"tokenizer", host->tokenizer != nullptr},
      {"chat_template", host->chat_template.has_value()}};
  std::printf("%s\nconfig ok\n", out.dump(2).c_str());
  return Status::Ok();
}

Status Serve(const ServerConfig& config, const ShutdownSignals& signals) {
  Service service(config);
  HttpFrontend http(service);
  OASIS_ASSIGN_OR_RETURN(int port, http.Bind(config.host, static_cast<int>(config.port)));
  http.Start();
  std::printf("oasis-server: listening on http://%s:%d\n", config.host.c_str(), port);
  std::fflush(stdout);
  GrpcFrontend grpc(service);
  Status status = Status::Ok();
  if (config.grpc_port != 0) {
    StatusOr<int> grpc_port = grpc.Start(config.host, static_cast<int>(config.grpc_port));
    if (grpc_port.ok()) {
      std::printf("oasis-server: gRPC on %s:%d\n", config.host.c_str(), *grpc_port);
      std::fflush(stdout);
    } else {
      status = grpc_port.status();
    }
  }
  if (status.ok()) {
    spdlog::info("loading {} ...",
                 config.model.empty() ? EmbeddedModelDir() + " (embedded default)" : config.model);
    StatusOr<std::unique_ptr<ModelHost>> host = [&] {
      const ExitOnShutdownSignal interruptible(signals, "loading the model");
      return LoadModelHost(config);
    }();
    if (host.ok()) {
      spdlog::info("serving '{}' on the {} backend, context {} tokens", service.model_name(),
                   (*host)->backend_name, (*host)->max_model_len());
      service.Publish(std::move(host).value());
      std::printf("oasis-server: ready (model '%s')\n", service.model_name().c_str());
      std::fflush(stdout);
      signals.Wait();
    } else {
      status = host.status().WithContext("loading the model");
    }
  }
  // Live requests finish with "abort" (HTTP streams write it and [DONE]; gRPC streams end with
  // UNAVAILABLE); both front ends share --shutdown-timeout-s to deliver that, then cut
  // whoever is still connected.
  const auto deadline = config.shutdown_deadline();
  const auto end = std::chrono::steady_clock::now() + deadline;
  service.StopEngine();
  grpc.Shutdown(deadline);
  http.Stop(
      std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 end - std::chrono::steady_clock::now())));
  service.TakeHost().reset();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const ShutdownSignals signals;
  StatusOr<ParsedCommandLine> cmd = ParseCommandLine(argc, argv);
  if (std::optional<int> exit_code = StartProgram(
          "oasis-server", cmd, [](const ParsedCommandLine& c) { return c.config.log_level; })) {
    return *exit_code;
  }
  spdlog::debug("open files: up to {}", RaiseOpenFileLimit());
  for (const std::string& ignored : cmd->ignored) spdlog::warn("{}", ignored);
  if (Status mem = CheckHostMemory(cmd->config); !mem.ok())
    return ExitWithError("oasis-server", mem, 2);
  // A staging listener other machines can reach needs a secret: refused before anything starts.
  if (Status staging = CheckStagingSecurity(cmd->config); !staging.ok())
    return ExitWithError("oasis-server", staging, 2);
  Status st = Status::Ok();
  try {  // out of host memory on this thread is an error exit, never an abort
    if (cmd->check_config) {
      const ExitOnShutdownSignal interruptible(signals, "checking the configuration");
      st = CheckConfig(cmd->config);
    } else {
      st = Serve(cmd->config, signals);
    }
  } catch (const std::bad_alloc&) {
    st = ResourceExhausted("out of host memory while loading or serving the model");
  }
  // More than this machine can hold (e.g. a host KV store it cannot pin) is a setting to
  // change, like the bad flags that exit 2; other failures exit 1.
  if (!st.ok())
    return ExitWithError("oasis-server", st, st.code() == StatusCode::kResourceExhausted ? 2 : 1);
  return 0;
}
