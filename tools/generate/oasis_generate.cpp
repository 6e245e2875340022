// oasis-generate: offline generation from a model directory (or dummy weights at a
// config's real shapes) on the CPU reference backend. Prints the generated token ids —
// and text, when the model has a tokenizer — plus timing.
//
//   oasis-generate --model tests/fixtures/models/qwen3-tiny --prompt-ids 1,17,42 --max-tokens 16
//   oasis-generate --model DIR --prompt "Hello" --temperature 0.7 --seed 1
//   oasis-generate --model DIR --chat "What is 2+2?"      (the model's chat template)
//   oasis-generate --model DIR --load-format dummy --prompt-ids 1,2,3
// Text needs DIR/tokenizer.json (or --tokenizer FILE or DIR); --chat also the tokenizer's
// directory's tokenizer_config.json chat_template (or --chat-template FILE). Prompt + --max-tokens
// must fit the model's context (OUT_OF_RANGE otherwise, before anything is allocated); weights
// this machine's available memory cannot hold are refused (RESOURCE_EXHAUSTED) before loading.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "common/flags.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "engine/generator.h"
#include "loader/small_file.h"
#include "loader/weights.h"
#include "models/decoder_lm.h"
#include "oasis/model_config.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace oasis;

namespace {

StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  if (text.empty()) return InvalidArgument("--prompt-ids is empty");
  size_t begin = 0;
  while (true) {  // every comma-separated item, empty ones ("1,2," or "1,,2") included
    const size_t comma = text.find(',', begin);
    const std::string item =
        text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (item.empty()) {
      return InvalidArgument("--prompt-ids '" + text +
                             "' has an empty item (a stray comma): give ids as 1,17,42");
    }
    size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != item.size() || v < 0 || v > INT32_MAX) {
      return InvalidArgument("--prompt-ids: '" + item + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return ids;
}

// Renders `user_message` as a one-turn chat with the model's template (the tokenizer's
// directory's tokenizer_config.json), or --chat-template FILE's, read as oasis-server reads it.
StatusOr<std::string> RenderChat(const std::filesystem::path& tokenizer_dir,
                                 const std::string& template_file,
                                 const std::string& user_message) {
  ChatTemplateFiles files;
  const auto config_path = tokenizer_dir / "tokenizer_config.json";
  std::error_code ec;
  const bool has_config = std::filesystem::exists(config_path, ec);
  if (has_config) {
    OASIS_RETURN_IF_ERROR(CheckSmallFile(config_path, "tokenizer config", kMaxConfigJsonBytes));
    OASIS_ASSIGN_OR_RETURN(files, ChatTemplate::LoadFromTokenizerConfig(config_path));
  }
  if (!template_file.empty()) {
    OASIS_ASSIGN_OR_RETURN(files.chat_template, ReadChatTemplateFile(template_file));
  }
  if (files.chat_template.empty()) {
    return NotFound("no chat template: " + config_path.string() +
                    (has_config ? " has none" : " does not exist") + "; pass --chat-template FILE");
  }
  OASIS_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Parse(files.chat_template));
  nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", user_message}}}},
                                {"add_generation_prompt", true}};
  if (files.bos_token) ctx["bos_token"] = *files.bos_token;
  if (files.eos_token) ctx["eos_token"] = *files.eos_token;
  return tmpl.Render(ctx);
}

Status Run(int argc, char** argv) {
  std::string model_dir, load_format = "safetensors", prompt_ids, log_level = "warn";
  std::string prompt_text, chat, tokenizer_path, chat_template;
  int64_t max_tokens = 16, top_k = -1, seed = -1, threads = 0, n = 1;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  bool ignore_eos = false;
  FlagParser flags("oasis-generate: offline generation with the CPU reference backend");
  flags.AddString("model", &model_dir, "model directory (config.json + *.safetensors)");
  flags.AddString("load-format", &load_format,
                  "safetensors, or dummy for random weights at real shapes");
  flags.AddString("prompt-ids", &prompt_ids, "comma-separated prompt token ids");
  flags.AddString("prompt", &prompt_text,
                  "prompt text (encoded with special tokens, as /v1/completions does)");
  flags.AddString("chat", &chat, "a user message, rendered with the model's chat template");
  flags.AddString("tokenizer", &tokenizer_path,
                  "tokenizer.json or its directory (default: MODEL/tokenizer.json)");
  flags.AddString("chat-template", &chat_template,
                  "Jinja chat template file overriding the model's");
  flags.AddInt("max-tokens", &max_tokens, "tokens to generate");
  flags.AddInt("n", &n, "independent samples of the same prompt, generated as one batch");
  flags.AddDouble("temperature", &temperature, "sampling temperature, 0 = greedy");
  flags.AddDouble("top-p", &top_p, "nucleus sampling mass");
  flags.AddInt("top-k", &top_k, "keep the k most likely tokens (-1 or 0 = all; at most 2^31 - 1)");
  flags.AddDouble("min-p", &min_p, "drop tokens below min_p x the top probability");
  flags.AddInt("seed", &seed,
               "sampling seed (-1 = unseeded); with --n, sample i uses seed + i (modulo 2^64)");
  flags.AddBool("ignore-eos", &ignore_eos, "keep generating after EOS");
  flags.AddInt("threads", &threads, "CPU threads for matrix products (0 = auto)");
  flags.AddString("log-level", &log_level, "trace, debug, info, warn, error or off");
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return Status::Ok();
  }
  OASIS_RETURN_IF_ERROR(InitLogging(log_level));
  if (model_dir.empty()) return InvalidArgument("--model is required (see --help)");
  const int prompt_kinds = !prompt_ids.empty() + !prompt_text.empty() + !chat.empty();
  if (prompt_kinds != 1)
    return InvalidArgument("give exactly one of --prompt-ids, --prompt and --chat");
  // Ranges first (a value is refused, never wrapped): n and max_tokens size the batch and
  // its KV pool.
  if (n < 1 || n > 1024)
    return InvalidArgument("--n must be in [1, 1024], got " + std::to_string(n));
  if (max_tokens < 1 || max_tokens > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("--max-tokens must be in [1, 2^31 - 1], got " +
                           std::to_string(max_tokens));
  }
  if (threads < 0 || threads > 1024) {
    return InvalidArgument("--threads must be in [0, 1024] (0: auto), got " +
                           std::to_string(threads));
  }

  if (top_k < -1 || top_k > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("--top-k must be in [-1, 2^31 - 1] (-1 or 0: every token), got " +
                           std::to_string(top_k));
  }

  if (std::filesystem::exists(model_dir) && !std::filesystem::is_directory(model_dir)) {
    return InvalidArgument("--model " + model_dir +
                           " is a file: give the model's directory (config.json, *.safetensors)");
  }
  if (load_format != "dummy" && load_format != "safetensors")
    return InvalidArgument("--load-format must be safetensors or dummy, got '" + load_format + "'");
  OASIS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));

  // The tokenizer and the prompt first: its length and --max-tokens are checked against the
  // context before anything is sized from them (the KV pool, the weights).
  std::unique_ptr<tokenizer::Tokenizer> tok;
  // --tokenizer FILE or DIR (its tokenizer.json), as oasis-server takes it; a given path must
  // exist even with --prompt-ids (where the tokenizer only decodes the output).
  OASIS_ASSIGN_OR_RETURN(const std::filesystem::path tok_path,
                         ResolveTokenizerFile(model_dir, tokenizer_path));
  if (!tok_path.empty()) {
    OASIS_ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::FromFile(tok_path));
  } else if (prompt_ids.empty()) {
    return NotFound(
        "no tokenizer: " + (std::filesystem::path(model_dir) / "tokenizer.json").string() +
        " does not exist; pass --tokenizer FILE (text prompts need one)");
  }
  GenerationRequest request;
  if (!prompt_ids.empty()) {
    OASIS_ASSIGN_OR_RETURN(request.prompt, ParseIds(prompt_ids));
  } else if (!prompt_text.empty()) {
    request.prompt = tok->Encode(prompt_text, tokenizer::AddSpecialTokens::kYes);
  } else {
    OASIS_ASSIGN_OR_RETURN(std::string rendered,
                           RenderChat(tok_path.parent_path(), chat_template, chat));
    request.prompt =
        tok->Encode(rendered, tokenizer::AddSpecialTokens::kNo);  // the template adds them
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  const int64_t ctx = config.max_position_embeddings;
  if (max_tokens > ctx - prompt_len) {  // as the engine words it (request_validation.cpp)
    return OutOfRange("prompt (" + std::to_string(prompt_len) + " tokens) + max_tokens (" +
                      std::to_string(max_tokens) + ") exceeds the context length " +
                      std::to_string(ctx));
  }

  // The weights live in host memory (the CPU backend: f32): refused up front when this machine
  // cannot hold them (a dummy config of vocab_size 2^31 - 1 aborted in an allocation).
  std::vector<WeightSpec> expected = DecoderLM::ExpectedWeights(config);
  OASIS_RETURN_IF_ERROR(
      CheckHostMemoryForWeights(WeightBytes(expected, sizeof(float)), "the model's weights"));
  std::unique_ptr<WeightSource> weights;
  if (load_format == "dummy") {
    weights = MakeDummyWeights(std::move(expected), 0);
  } else {
    OASIS_ASSIGN_OR_RETURN(weights, OpenSafetensorsWeights(model_dir));
  }
  CpuBackend backend(static_cast<int>(threads));
  auto t0 = std::chrono::steady_clock::now();
  StatusOr<std::unique_ptr<DecoderLM>> created = InvalidArgument("not loaded");
  try {
    created = DecoderLM::Create(config, *weights, backend);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of host memory while loading the model's weights from " +
                             weights->Describe());
  }
  OASIS_ASSIGN_OR_RETURN(std::unique_ptr<DecoderLM> model, std::move(created));
  auto t1 = std::chrono::steady_clock::now();

  request.max_tokens = max_tokens;
  request.ignore_eos = ignore_eos;
  request.sampling.temperature = static_cast<float>(temperature);
  request.sampling.top_p = static_cast<float>(top_p);
  request.sampling.top_k = static_cast<int32_t>(top_k);
  request.sampling.min_p = static_cast<float>(min_p);
  std::vector<GenerationRequest> requests(static_cast<size_t>(n), request);
  for (int64_t i = 0; i < n; ++i) {  // sequence i: seed + i, modulo 2^64 (never signed overflow)
    if (seed >= 0)
      requests[static_cast<size_t>(i)].sampling.seed =
          static_cast<uint64_t>(seed) + static_cast<uint64_t>(i);
  }
  const int64_t total = prompt_len + max_tokens;  // <= the context: no overflow below
  GeneratorOptions options;
  options.num_kv_slots = std::max<int64_t>(64, (total + 15) / 16 * config.num_key_value_heads * n);
  // The KV pool (f32 on the CPU backend) must fit the memory available too.
  const double kv_gib = static_cast<double>(options.num_kv_slots) * 2.0 * 16.0 *
                        static_cast<double>(config.head_dim * config.num_hidden_layers) *
                        sizeof(float) / (1024.0 * 1024.0 * 1024.0);
  if (const std::optional<double> avail = AvailableHostMemoryGiB(); avail && kv_gib > *avail) {
    char msg[300];
    std::snprintf(msg, sizeof msg,
                  "the KV cache of --n %lld x %lld tokens needs %.2f GiB, more than the %.2f GiB "
                  "this machine has available: lower --max-tokens or --n",
                  static_cast<long long>(n), static_cast<long long>(total), kv_gib, *avail);
    return ResourceExhausted(msg);
  }
  StatusOr<std::vector<GenerationResult>> generated_or = InvalidArgument("not run");
  try {
    Generator generator(*model, backend, options);
    generated_or = generator.Generate(requests);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of host memory for the KV cache of " + std::to_string(n) + " x " +
                             std::to_string(total) + " tokens: lower --max-tokens or --n");
  }
  OASIS_ASSIGN_OR_RETURN(std::vector<GenerationResult> results, std::move(generated_or));
  auto t2 = std::chrono::steady_clock::now();

  std::printf("model: %s (%s, %lld layers, hidden %lld)\n", model_dir.c_str(),
              config.architecture_name.c_str(), static_cast<long long>(config.num_hidden_layers),
              static_cast<long long>(config.hidden_size));
  std::string prompt_list;
  for (int32_t t : request.prompt)
    prompt_list += (prompt_list.empty() ? "" : ",") + std::to_string(t);
  std::printf("prompt ids: %s\n", prompt_list.c_str());
  int64_t generated = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    std::string ids;
    for (int32_t t : results[i].tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    generated += static_cast<int64_t>(results[i].tokens.size());
    std::printf("output %zu ids: %s\n", i, ids.c_str());
    if (tok) {
      tokenizer::IncrementalDetokenizer detok(*tok, tokenizer::SkipSpecialTokens::kYes);
      std::string text = detok.Push(results[i].tokens);
      text += detok.Finish();
      std::printf("output %zu text: %s\n", i, text.c_str());
    }
    std::printf("finish_reason: %s\n",
                results[i].finish_reason == FinishReason::kStop ? "stop" : "length");
  }
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("load %.3f s, generate %.3f s (%.1f tokens/s)\n", load_s, gen_s, generated / gen_s);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Status st = Status::Ok();
  try {  // out of memory anywhere else is an error exit too, never an abort
    st = Run(argc, argv);
  } catch (const std::bad_alloc&) {
    st = ResourceExhausted("out of host memory while loading or running the model");
  }
  if (!st.ok()) {
    std::fprintf(stderr, "oasis-generate: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
