#include "server/openai_protocol.h"

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

#include "common/http_util.h"
#include "common/json_depth.h"
#include "tokenizer/structured/gbnf.h"
#include "tokenizer/structured/json_schema.h"
#include "tokenizer/structured/regex.h"

namespace oasis::server {
namespace {

// Parameters of vLLM's and OpenAI's APIs this server does not implement (a 400 says so).
constexpr std::string_view kKnownUnsupported[] = {"priority",
                                                  "use_beam_search",
                                                  "length_penalty",
                                                  "early_stopping",
                                                  "documents",
                                                  "mm_processor_kwargs",
                                                  "guided_decoding_backend",
                                                  "kv_transfer_params",
                                                  "cache_salt",
                                                  "vllm_xargs",
                                                  "request_id",
                                                  "return_token_ids",
                                                  "logits_processors",
                                                  "reasoning_effort",
                                                  "functions",
                                                  "function_call",
                                                  "store",
                                                  "metadata",
                                                  "service_tier",
                                                  "modalities",
                                                  "audio",
                                                  "prediction",
                                                  "web_search_options"};

// A float as its shortest round-trip text ("3.4028235e+38", not the double's digits).
std::string FloatText(float v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// Typed access to the request's fields; each failure records a 400 naming the parameter.
// Absent and null fields leave the output untouched.
class Reader {
 public:
  Reader(const Json& body, ApiError* error) : body_(body), error_(error) {}

  bool Fail(const std::string& param, const std::string& message) {
    *error_ = BadRequest(message, param);
    return false;
  }
  void MarkRead(const char* key) const { seen_.insert(key); }
  const Json* Get(const char* key) const {
    seen_.insert(key);
    auto it = body_.find(key);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Bool(const char* key, bool* out) {
    const Json* v = Get(key);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return Fail(key, std::string("'") + key + "' must be a boolean");
    *out = v->get<bool>();
    return true;
  }
  // Integers (or floats with an integral value) in [lo, hi].
  bool Int(const char* key, int64_t lo, int64_t hi, int64_t* out) {
    const Json* v = Get(key);
    if (v == nullptr) return true;
    return IntValue(*v, key, lo, hi, out);
  }
  bool IntValue(const Json& v, const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
    double d = 0;
    if (v.is_number_integer() && v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return OutOfBounds(key, lo, hi, /*above=*/true);
      *out = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      *out = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(d = v.get<double>()) && d == std::floor(d) &&
               std::fabs(d) < 9.0e18) {
      *out = static_cast<int64_t>(d);
    } else {
      return Fail(key, "'" + key + "' must be an integer");
    }
    if (*out < lo || *out > hi) return OutOfBounds(key, lo, hi, *out > hi);
    return true;
  }
  bool Number(const char* key, double* out) {
    const Json* v = Get(key);
    if (v == nullptr) return true;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return Fail(key, std::string("'") + key + "' must be a number");
    }
    *out = v->get<double>();
    return true;
  }
  // A value that passed its range check as a double, narrowed to the float the engine samples
  // with: one that overflows (1e39 -> inf), or a nonzero one that underflows to 0 or a denormal
  // when `zero_allowed` is false (top_p 1e-46 -> 0), is a 400 naming `key` with the value sent.
  bool Narrow(const std::string& key, double v, bool zero_allowed, float* out) {
    const float f = static_cast<float>(v);
    if (!std::isfinite(f)) {
      return Fail(key, "'" + key + "' is too large: got " + FormatNumber(v) +
                           ", the largest value is " + FloatText(FLT_MAX) + " (a 32-bit float)");
    }
    if (!zero_allowed && v != 0 && std::fabs(f) < FLT_MIN) {
      return Fail(key, "'" + key + "' is too small: got " + FormatNumber(v) +
                           ", the smallest value above 0 is " + FloatText(FLT_MIN) +
                           " (a 32-bit float)");
    }
    *out = f;
    return true;
  }
  bool String(const char* key, std::string* out) {
    const Json* v = Get(key);
    if (v == nullptr) return true;
    if (!v->is_string()) return Fail(key, std::string("'") + key + "' must be a string");
    *out = v->get<std::string>();
    return true;
  }

  // Every field of the body that no parser step read: a 400 naming it, never silently ignored
  // (null counts as absent). `user` (OpenAI's end-user id for abuse monitoring, with no
  // effect on a generation) is accepted when it is a string.
  bool RejectUnread() {
    for (const auto& [key, value] : body_.items()) {
      if (seen_.count(key) != 0 || value.is_null()) continue;
      if (key == "user") {
        if (!value.is_string()) return Fail(key, "'user' must be a string");
        continue;
      }
      for (std::string_view known : kKnownUnsupported) {
        if (key == known) {
          return Fail(key, "'" + key + "' is not supported by this server (docs/server.md)");
        }
      }
      return Fail(key, "unknown parameter '" + key + "' for this endpoint");
    }
    return true;
  }

 private:
  // `above`: the value was past hi (an open upper bound is then named too, not just ">= lo").
  bool OutOfBounds(const std::string& key, int64_t lo, int64_t hi, bool above) {
    const bool open_hi = hi == std::numeric_limits<int64_t>::max();
    std::string range = open_hi && !above
                            ? ">= " + std::to_string(lo)
                            : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return Fail(key, "'" + key + "' must be " + range);
  }
  const Json& body_;
  mutable std::set<std::string, std::less<>> seen_;
  ApiError* error_;
};

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kTokenIdMax = std::numeric_limits<int32_t>::max();

bool ParseTokenIds(Reader& r, const Json& list, const std::string& param,
                   std::vector<int32_t>* out) {
  for (const Json& id : list) {
    const std::optional<int32_t> v = JsonTokenId(id);
    if (!v) {
      return r.Fail(param, "'" + param + "' token ids must be integers in [0, " +
                               std::to_string(kTokenIdMax) + "], got " + Clip(id.dump(), 40));
    }
    out->push_back(*v);
  }
  return true;
}

// "Token id `id` ... outside the vocabulary" for `param` (limits.vocab_size > 0 only).
bool CheckVocab(Reader& r, const ProtocolLimits& limits, const std::string& param, int64_t id) {
  if (limits.vocab_size <= 0 || id < limits.vocab_size) return true;
  return r.Fail(param, "'" + param + "': token id " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) +
                           ")");
}

// Penalties, logit_bias, allowed_token_ids, bad_words (runner/logits_processing.h).
bool ParseLogitsProcessing(Reader& r, const ProtocolLimits& limits, GenerateSpec* spec) {
  SamplingParams& sp = spec->sampling;
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    double v = 0;
    if (!r.Number(name, &v)) return false;
    if (!(v >= -2.0 && v <= 2.0)) {
      return r.Fail(name, std::string("'") + name + "' must be in [-2, 2], got " + FormatNumber(v));
    }
    float* field =
        std::string_view(name) == "presence_penalty" ? &sp.presence_penalty : &sp.frequency_penalty;
    if (!r.Narrow(name, v, /*zero_allowed=*/true, field)) return false;
  }
  double repetition = limits.default_sampling.repetition_penalty;  // generation_config's
  if (!r.Number("repetition_penalty", &repetition)) return false;
  if (!(repetition > 0.0 && repetition <= 2.0)) {
    return r.Fail("repetition_penalty",
                  "'repetition_penalty' must be in (0, 2], got " + FormatNumber(repetition));
  }
  if (!r.Narrow("repetition_penalty", repetition, /*zero_allowed=*/false, &sp.repetition_penalty))
    return false;
  if (const Json* bias = r.Get("logit_bias")) {
    if (!bias->is_object()) {
      return r.Fail("logit_bias", "'logit_bias' must be an object of token ids to biases");
    }
    for (const auto& [key, value] : bias->items()) {
      // Keys are token ids written in decimal (JSON keys are strings).
      int64_t id = -1;
      if (!key.empty() && key.size() <= 10 &&
          key.find_first_not_of("0123456789") == std::string::npos) {
        id = std::stoll(key);
      }
      if (id < 0 || id > kTokenIdMax) {
        return r.Fail("logit_bias",
                      "'logit_bias' keys must be token ids (integers >= 0), got '" + key + "'");
      }
      if (!CheckVocab(r, limits, "logit_bias", id)) return false;
      if (!value.is_number() || !std::isfinite(value.get<double>())) {
        return r.Fail("logit_bias", "'logit_bias' values must be numbers (token " + key + ")");
      }
      const double b = value.get<double>();
      if (!(b >= -100.0 && b <= 100.0)) {
        return r.Fail("logit_bias", "'logit_bias' values must be in [-100, 100], got " +
                                        FormatNumber(b) + " for token " + key);
      }
      float bias = 0;
      if (!r.Narrow("logit_bias", b, /*zero_allowed=*/true, &bias)) return false;
      sp.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
    }
  }
  if (const Json* ids = r.Get("allowed_token_ids")) {
    if (!ids->is_array())
      return r.Fail("allowed_token_ids", "'allowed_token_ids' must be a list of token ids");
    if (ids->empty()) return r.Fail("allowed_token_ids", "'allowed_token_ids' must not be empty");
    if (!ParseTokenIds(r, *ids, "allowed_token_ids", &sp.allowed_token_ids)) return false;
    for (int32_t id : sp.allowed_token_ids) {
      if (!CheckVocab(r, limits, "allowed_token_ids", id)) return false;
    }
  }
  if (const Json* words = r.Get("bad_words")) {
    const char* kBad = "'bad_words' must be a list of non-empty strings";
    if (!words->is_array()) return r.Fail("bad_words", kBad);
    for (const Json& w : *words) {
      if (!w.is_string()) return r.Fail("bad_words", kBad);
      std::string word = w.get<std::string>();
      if (word.find_first_not_of(" \t\n\r\f\v") == std::string::npos)
        return r.Fail("bad_words", kBad);
      spec->bad_words.push_back(std::move(word));
    }
  }
  return true;
}

// The fields both endpoints share: sampling, stop conditions, n, streaming.
// Structured output (docs/structured_output.md): OpenAI's response_format, vLLM's guided_json /
// guided_choice and structured_outputs {json, choice, json_object}. One kind per request; what
// the server cannot constrain (regular expressions, grammars, structural tags) is refused.
bool ParseStructuredOutput(Reader& r, GenerateSpec* spec) {
  // structured_outputs.disable_any_whitespace: compact JSON, no whitespace between tokens;
  // structured_outputs.whitespace_pattern / guided_whitespace_pattern: a regex for it.
  bool compact = false;
  std::string ws_pattern, ws_param;
  // A whitespace pattern from either parameter (at most one of them).
  auto whitespace = [&](const std::string& param, const Json& v) -> bool {
    if (!ws_param.empty()) {
      return r.Fail(param, "'" + param + "' and '" + ws_param + "' were both given");
    }
    ws_param = param;
    if (!v.is_string())
      return r.Fail(param, "'" + param + "' must be a string (a regular expression)");
    ws_pattern = v.get<std::string>();
    return true;
  };
  if (const Json* so = r.Get("structured_outputs")) {
    if (so->is_object() && so->contains("disable_any_whitespace")) {
      const Json& v = (*so)["disable_any_whitespace"];
      if (!v.is_boolean() && !v.is_null()) {
        return r.Fail("structured_outputs.disable_any_whitespace",
                      "'structured_outputs.disable_any_whitespace' must be a boolean");
      }
      compact = v.is_boolean() && v.get<bool>();
    }
    if (so->is_object() && so->contains("whitespace_pattern") &&
        !(*so)["whitespace_pattern"].is_null() &&
        !whitespace("structured_outputs.whitespace_pattern", (*so)["whitespace_pattern"])) {
      return false;
    }
  }
  if (const Json* v = r.Get("guided_whitespace_pattern");
      v != nullptr && !whitespace("guided_whitespace_pattern", *v)) {
    return false;
  }
  if (!ws_param.empty() && ws_pattern.empty()) {
    return r.Fail(ws_param,
                  "'" + ws_param + "' is empty (disable_any_whitespace says no whitespace)");
  }
  if (!ws_param.empty() && compact) {
    return r.Fail(
        ws_param,
        "'" + ws_param + "' and 'structured_outputs.disable_any_whitespace' contradict each other");
  }
  bool json_structure = false;  // (what a whitespace pattern applies to)
  auto set = [&](const std::string& param, StatusOr<std::shared_ptr<const structured::Grammar>> g,
                 bool json = false) -> bool {
    if (spec->grammar != nullptr) {
      return r.Fail(param, "only one kind of structured output per request: '" +
                               spec->grammar_param + "' and '" + param + "' were given");
    }
    if (!g.ok()) return r.Fail(param, "'" + param + "': " + std::string(g.status().message()));
    spec->grammar = *std::move(g);
    spec->grammar_param = param;
    json_structure = json;
    return true;
  };
  // A schema given as JSON, or as JSON text (vLLM takes both).
  auto schema = [&](const std::string& param, const Json& v) -> bool {
    if (v.is_string()) {
      const std::string& text = v.get<std::string>();
      if (JsonNestedDeeperThan(text)) {
        return r.Fail(param, "'" + param + "' is nested deeper than " +
                                 std::to_string(kMaxJsonDepth) + " levels");
      }
      const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        return r.Fail(param, "'" + param + "' is not a valid JSON schema (malformed JSON)");
      }
      return set(param, structured::JsonSchemaGrammar(parsed, compact, ws_pattern), true);
    }
    if (!v.is_object() && !v.is_boolean()) {
      return r.Fail(param, "'" + param + "' must be a JSON schema (an object)");
    }
    return set(param, structured::JsonSchemaGrammar(v, compact, ws_pattern), true);
  };
  auto choice = [&](const std::string& param, const Json& v) -> bool {
    std::vector<std::string> choices;
    if (v.is_array()) {
      for (const Json& c : v) {
        if (!c.is_string()) break;
        choices.push_back(c.get<std::string>());
      }
    }
    if (!v.is_array() || choices.size() != v.size() || choices.empty()) {
      return r.Fail(param, "'" + param + "' must be a non-empty list of strings");
    }
    return set(param, structured::ChoiceGrammar(choices));
  };
  auto grammar = [&](const std::string& param, const Json& v) -> bool {
    if (!v.is_string()) return r.Fail(param, "'" + param + "' must be a string (a GBNF grammar)");
    return set(param, structured::GbnfGrammar(v.get<std::string>()));
  };
  auto regex = [&](const std::string& param, const Json& v) -> bool {
    if (!v.is_string())
      return r.Fail(param, "'" + param + "' must be a string (a regular expression)");
    return set(param, structured::RegexGrammar(v.get<std::string>()));
  };
  if (const Json* format = r.Get("response_format")) {
    const Json* type =
        format->is_object() && format->contains("type") ? &(*format)["type"] : nullptr;
    if (type == nullptr || !type->is_string()) {
      return r.Fail("response_format", "'response_format' must be an object with a string 'type'");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      if (!set("response_format", structured::JsonObjectGrammar(compact, ws_pattern), true))
        return false;
    } else if (t == "json_schema") {
      const Json* js = format->contains("json_schema") ? &(*format)["json_schema"] : nullptr;
      if (js == nullptr || !js->is_object() || !js->contains("schema") ||
          (*js)["schema"].is_null()) {
        return r.Fail("response_format",
                      "'response_format' of type 'json_schema' needs 'json_schema': {'name', "
                      "'schema'}");
      }
      if (!schema("response_format", (*js)["schema"])) return false;
    } else if (t != "text") {
      return r.Fail("response_format", "'response_format' of type '" + t +
                                           "' is not supported (text, json_object, json_schema)");
    }
  }
  if (const Json* v = r.Get("guided_json")) {
    if (!schema("guided_json", *v)) return false;
  }
  if (const Json* v = r.Get("guided_choice")) {
    if (!choice("guided_choice", *v)) return false;
  }
  if (const Json* v = r.Get("guided_regex")) {
    if (!regex("guided_regex", *v)) return false;
  }
  if (const Json* v = r.Get("guided_grammar")) {
    if (!grammar("guided_grammar", *v)) return false;
  }
  if (const Json* so = r.Get("structured_outputs")) {
    if (!so->is_object())
      return r.Fail("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [key, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string param = "structured_outputs." + key;
      if (key == "json") {
        if (!schema(param, v)) return false;
      } else if (key == "choice") {
        if (!choice(param, v)) return false;
      } else if (key == "regex") {
        if (!regex(param, v)) return false;
      } else if (key == "grammar") {
        if (!grammar(param, v)) return false;
      } else if (key == "json_object") {
        if (!v.is_boolean()) return r.Fail(param, "'" + param + "' must be a boolean");
        if (v.get<bool>() &&
            !set(param, structured::JsonObjectGrammar(compact, ws_pattern), true)) {
          return false;
        }
      } else if (key == "disable_any_whitespace" || key == "whitespace_pattern" ||
                 ((key == "disable_fallback" || key == "disable_additional_properties") &&
                  v.is_boolean())) {
        // (Read above.) No fallback backend to disable; without additionalProperties no other
        // member is generated anyway.
      } else {
        return r.Fail(param, "'" + param +
                                 "' is not supported (structured output: json, choice, regex, "
                                 "grammar, json_object)");
      }
    }
  }
  if (!ws_param.empty() && !json_structure) {
    return r.Fail(ws_param, "'" + ws_param +
                                "' applies to JSON structures only (response_format json_object / "
                                "json_schema, guided_json, structured_outputs.json / json_object)");
  }
  return true;
}

// Structured output (a format or forced tool calls) with what would generate outside it.
bool CheckStructuredCombinations(Reader& r, const GenerateSpec& spec) {
  if (spec.grammar == nullptr) return true;
  const std::string what = "'" + spec.grammar_param + "'";
  if (spec.ignore_eos) {
    return r.Fail("ignore_eos", "'ignore_eos' cannot be combined with " + what +
                                    " (generation would go on past the end of the structure)");
  }
  if (spec.min_tokens > 0) {
    return r.Fail("min_tokens", "'min_tokens' cannot be combined with " + what +
                                    " (the structure may be complete before it)");
  }
  if (!spec.forced_output_ids.empty()) {
    return r.Fail("forced_output_ids", "'forced_output_ids' cannot be combined with " + what);
  }
  return true;
}

bool ParseCommon(Reader& r, const ProtocolLimits& limits, GenerateSpec* spec) {
  if (!r.String("model", &spec->model)) return false;
  if (!r.String("oasis_ticket", &spec->oasis_ticket)) return false;
  if (const Json* salt = r.Get("cache_salt")) {  // vLLM's: prefix caching shares only within a salt
    if (!salt->is_string() || salt->get<std::string>().empty())
      return r.Fail("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.");
    spec->cache_salt = salt->get<std::string>();
  }
  if (!r.Int("n", 1, limits.max_n, &spec->n)) return false;
  if (!r.Bool("stream", &spec->stream)) return false;
  if (const Json* so = r.Get("stream_options")) {
    if (!so->is_object()) return r.Fail("stream_options", "'stream_options' must be an object");
    if (!spec->stream)
      return r.Fail("stream_options", "'stream_options' is only allowed with stream=true");
    // include_usage: a last chunk with the usage; continuous_usage_stats (vLLM's, with
    // include_usage): every chunk carries the usage so far. Nothing else is accepted.
    for (const auto& [key, value] : so->items()) {
      const std::string param = "stream_options." + key;
      bool* flag = key == "include_usage"            ? &spec->include_usage
                   : key == "continuous_usage_stats" ? &spec->continuous_usage
                                                     : nullptr;
      if (flag == nullptr) return r.Fail(param, "unknown parameter '" + param + "'");
      if (value.is_null()) continue;
      if (!value.is_boolean()) return r.Fail(param, "'" + param + "' must be a boolean");
      *flag = value.get<bool>();
    }
    spec->continuous_usage = spec->continuous_usage && spec->include_usage;
  }
  if (const Json* t = r.Get("truncate_prompt_tokens")) {
    int64_t keep = 0;
    if (!r.IntValue(*t, "truncate_prompt_tokens", -1, kInt64Max, &keep)) return false;
    if (keep == 0) {
      return r.Fail("truncate_prompt_tokens",
                    "'truncate_prompt_tokens' must be -1 (the context) or >= 1, got 0");
    }
    if (limits.max_model_len > 0 && keep > limits.max_model_len) {
      return r.Fail("truncate_prompt_tokens", "'truncate_prompt_tokens' (" + std::to_string(keep) +
                                                  ") is greater than the context (max_model_len " +
                                                  std::to_string(limits.max_model_len) + ")");
    }
    spec->truncate_prompt_tokens = keep;
  }
  const SamplingParams& defaults = limits.default_sampling;
  double temperature = defaults.temperature, top_p = defaults.top_p, min_p = defaults.min_p;
  // Checked as doubles, then as the floats the engine samples with (Reader::Narrow).
  if (!r.Number("temperature", &temperature)) return false;
  if (temperature < 0)
    return r.Fail("temperature", "'temperature' must be >= 0, got " + FormatNumber(temperature));
  if (!r.Narrow("temperature", temperature, /*zero_allowed=*/true, &spec->sampling.temperature))
    return false;
  if (!r.Number("top_p", &top_p)) return false;
  if (!(top_p > 0 && top_p <= 1))
    return r.Fail("top_p", "'top_p' must be in (0, 1], got " + FormatNumber(top_p));
  if (!r.Narrow("top_p", top_p, /*zero_allowed=*/false, &spec->sampling.top_p)) return false;
  if (!r.Number("min_p", &min_p)) return false;
  if (!(min_p >= 0 && min_p <= 1))
    return r.Fail("min_p", "'min_p' must be in [0, 1], got " + FormatNumber(min_p));
  if (!r.Narrow("min_p", min_p, /*zero_allowed=*/true, &spec->sampling.min_p)) return false;
  int64_t top_k = defaults.top_k;
  if (!r.Int("top_k", -1, kTokenIdMax, &top_k)) return false;
  spec->sampling.top_k = static_cast<int32_t>(top_k);
  if (const Json* seed = r.Get("seed")) {
    int64_t v = 0;
    if (!r.IntValue(*seed, "seed", std::numeric_limits<int64_t>::min(), kInt64Max, &v))
      return false;
    spec->sampling.seed = static_cast<uint64_t>(v);
  }
  if (!ParseLogitsProcessing(r, limits, spec)) return false;
  if (const Json* best_of = r.Get("best_of")) {
    int64_t v = 0;
    if (!r.IntValue(*best_of, "best_of", 1, limits.max_n, &v)) return false;
    if (v != spec->n) return r.Fail("best_of", "'best_of' other than n is not supported");
  }
  if (!ParseStructuredOutput(r, spec)) return false;
  if (const Json* stop = r.Get("stop")) {
    if (stop->is_string()) {
      spec->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const Json& s : *stop) {
        if (!s.is_string()) return r.Fail("stop", "'stop' must be a string or a list of strings");
        spec->stop.push_back(s.get<std::string>());
      }
    } else {
      return r.Fail("stop", "'stop' must be a string or a list of strings");
    }
    for (const std::string& s : spec->stop) {
      if (s.empty()) return r.Fail("stop", "'stop' strings must not be empty");
    }
  }
  if (const Json* ids = r.Get("stop_token_ids")) {
    if (!ids->is_array())
      return r.Fail("stop_token_ids", "'stop_token_ids' must be a list of token ids");
    if (!ParseTokenIds(r, *ids, "stop_token_ids", &spec->stop_token_ids)) return false;
    for (int32_t id : spec->stop_token_ids) {
      if (!CheckVocab(r, limits, "stop_token_ids", id)) return false;
    }
  }
  if (const Json* ids = r.Get("forced_output_ids")) {
    if (!ids->is_array())
      return r.Fail("forced_output_ids", "'forced_output_ids' must be a list of token ids");
    if (!ParseTokenIds(r, *ids, "forced_output_ids", &spec->forced_output_ids)) return false;
    for (int32_t id : spec->forced_output_ids) {
      if (!CheckVocab(r, limits, "forced_output_ids", id)) return false;
    }
  }
  if (!r.Bool("ignore_eos", &spec->ignore_eos)) return false;
  if (!r.Bool("return_tokens_as_token_ids", &spec->return_tokens_as_token_ids)) return false;
  if (!r.Bool("include_stop_str_in_output", &spec->include_stop_str_in_output)) return false;
  if (!r.Bool("skip_special_tokens", &spec->skip_special_tokens)) return false;
  if (!r.Bool("spaces_between_special_tokens", &spec->spaces_between_special_tokens)) return false;
  if (!r.Int("min_tokens", 0, kInt64Max, &spec->min_tokens)) return false;
  if (const Json* plp = r.Get("prompt_logprobs")) {
    int64_t k = 0;
    if (!r.IntValue(*plp, "prompt_logprobs", -1, kInt64Max, &k)) return false;
    if (k == -1) {
      return r.Fail("prompt_logprobs",
                    "'prompt_logprobs' of -1 (the whole vocabulary) is not "
                    "supported by this server: at most " +
                        std::to_string(limits.max_top_logprobs));
    }
    if (k > limits.max_top_logprobs) {
      return r.Fail("prompt_logprobs", "'prompt_logprobs': requested " + std::to_string(k) +
                                           ", which is greater than max allowed: " +
                                           std::to_string(limits.max_top_logprobs));
    }
    // vLLM refuses them with stream=true too (k > 0; a stream has no place for them at all).
    if (spec->stream)
      return r.Fail("prompt_logprobs", "'prompt_logprobs' are not available when stream=true");
    spec->prompt_logprobs = static_cast<int>(k);
  }
  return true;
}

// vLLM's add_special_tokens (both routes; the default is the endpoint's, GenerateSpec).
bool ParseAddSpecialTokens(Reader& r, GenerateSpec* spec) {
  if (r.Get("add_special_tokens") == nullptr) return true;
  bool add = false;
  if (!r.Bool("add_special_tokens", &add)) return false;
  spec->add_special_tokens = add;
  return true;
}

bool CheckMaxTokens(Reader& r, const ProtocolLimits& limits, const char* param,
                    GenerateSpec* spec) {
  if (!spec->max_tokens) return true;
  if (limits.max_model_len > 0 && *spec->max_tokens > limits.max_model_len) {
    return r.Fail(param, std::string("'") + param + "' (" + std::to_string(*spec->max_tokens) +
                             ") exceeds the model's context length (" +
                             std::to_string(limits.max_model_len) + ")");
  }
  if (spec->min_tokens > *spec->max_tokens) {
    return r.Fail("min_tokens", "'min_tokens' must be <= max_tokens");
  }
  return true;
}

bool ParsePrompt(Reader& r, const Json& prompt, GenerateSpec* spec) {
  const char* kBad =
      "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "
      "token ids";
  if (prompt.is_string()) {
    spec->prompts.push_back({prompt.get<std::string>(), {}});
  } else if (prompt.is_array()) {
    if (prompt.empty()) return r.Fail("prompt", "'prompt' must not be empty");
    if (prompt[0].is_number()) {
      PromptInput p;
      if (!ParseTokenIds(r, prompt, "prompt", &p.ids)) return false;
      spec->prompts.push_back(std::move(p));
    } else {
      for (const Json& item : prompt) {
        if (item.is_string()) {
          spec->prompts.push_back({item.get<std::string>(), {}});
        } else if (item.is_array()) {
          PromptInput p;
          if (item.empty()) return r.Fail("prompt", "'prompt' token id lists must not be empty");
          if (!ParseTokenIds(r, item, "prompt", &p.ids)) return false;
          spec->prompts.push_back(std::move(p));
        } else {
          return r.Fail("prompt", kBad);
        }
      }
    }
  } else {
    return r.Fail("prompt", kBad);
  }
  for (const PromptInput& p : spec->prompts) {
    if (p.text && p.text->empty()) return r.Fail("prompt", "'prompt' must not be empty");
  }
  return true;
}

// Chat message content: a string, null, or a list of parts of which only text is supported.
bool NormaliseContent(Reader& r, OrderedJson& message, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  auto it = message.find("content");
  if (it == message.end() || it->is_null() || it->is_string()) return true;
  if (!it->is_array())
    return r.Fail(param, "'content' must be a string or a list of content parts");
  // The parts' texts joined with "\n", as vLLM gives them to a template that takes a string.
  std::string text;
  bool first = true;
  for (const OrderedJson& part : *it) {
    if (!part.is_object()) return r.Fail(param, "content parts must be objects");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string())
      return r.Fail(param, "content parts need a 'type'");
    if (*type != "text") {
      return r.Fail(param, "content part type '" + type->get<std::string>() +
                               "' is not supported (only text)");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string())
      return r.Fail(param, "a text content part needs a string 'text'");
    if (!first) text += '\n';
    first = false;
    text += t->get<std::string>();
  }
  *it = text;
  return true;
}

// An assistant message's tool_calls as chat templates take them (vLLM's normalisation): a list of
// {"id"?, "type": "function", "function": {"name", "arguments": <object>}}, the arguments' JSON
// string parsed (Llama 3.1's template writes `arguments | tojson`). null: no tool_calls key.
bool NormaliseToolCalls(Reader& r, OrderedJson& message, const std::string& param) {
  auto it = message.find("tool_calls");
  if (it == message.end()) return true;
  if (it->is_null()) {
    message.erase(it);
    return true;
  }
  const std::string p = param + ".tool_calls";
  if (!it->is_array()) return r.Fail(p, "'tool_calls' must be a list");
  for (size_t j = 0; j < it->size(); ++j) {
    OrderedJson& call = (*it)[j];
    const std::string pj = p + "[" + std::to_string(j) + "]";
    if (!call.is_object()) return r.Fail(pj, "each tool call must be an object");
    auto type = call.find("type");
    if (type != call.end() && !type->is_null() && *type != "function")
      return r.Fail(pj + ".type", "a tool call's 'type' must be \"function\"");
    auto id = call.find("id");
    if (id != call.end() && !id->is_null() && !id->is_string())
      return r.Fail(pj + ".id", "a tool call's 'id' must be a string");
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object())
      return r.Fail(pj + ".function", "a tool call needs a 'function' object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      return r.Fail(pj + ".function.name", "a tool call's function needs a string 'name'");
    auto args = fn->find("arguments");
    const std::string pa = pj + ".function.arguments";
    if (args == fn->end() || args->is_null()) {
      (*fn)["arguments"] = OrderedJson::object();
    } else if (args->is_string()) {
      const std::string text = args->get<std::string>();
      OrderedJson parsed = JsonNestedDeeperThan(text)
                               ? OrderedJson(OrderedJson::value_t::discarded)
                               : OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded())
        return r.Fail(pa, "a tool call's 'arguments' must be a JSON text (of an object)");
      *args = std::move(parsed);
    } else if (!args->is_object()) {
      return r.Fail(pa, "a tool call's 'arguments' must be a JSON string or an object");
    }
  }
  return true;
}

// One chat message as the template gets it: content normalised (null or absent: "", as vLLM),
// tool calls normalised, a tool message's tool_call_id checked.
bool NormaliseMessage(Reader& r, OrderedJson& message, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "]";
  if (!NormaliseContent(r, message, index)) return false;
  auto content = message.find("content");
  if (content == message.end() || content->is_null()) message["content"] = "";
  const std::string role = message["role"].get<std::string>();
  if (role == "assistant") {
    if (!NormaliseToolCalls(r, message, param)) return false;
  } else if (message.contains("tool_calls") && !message["tool_calls"].is_null()) {
    return r.Fail(param + ".tool_calls", "only assistant messages carry 'tool_calls'");
  }
  auto id = message.find("tool_call_id");
  if (id != message.end() && !id->is_null() && !id->is_string())
    return r.Fail(param + ".tool_call_id", "'tool_call_id' must be a string");
  return true;
}

// tool_choice "required" or naming a function, as vLLM: the answer is forced to tool calls
// by constrained decoding (one or more of the tools, or the named one once; each call's
// parameters follow its schema).
bool ForceToolCalls(Reader& r, const Json& choice, bool parallel, GenerateSpec* spec) {
  if (spec->grammar != nullptr) {
    return r.Fail("tool_choice", "a forced 'tool_choice' cannot be combined with '" +
                                     spec->grammar_param + "' (one structure per request)");
  }
  std::vector<structured::ToolSchema> tools;
  for (const Json& t : spec->tools) {
    const Json& fn = t["function"];
    const Json* params = fn.contains("parameters") ? &fn["parameters"] : nullptr;
    tools.push_back({fn["name"].get<std::string>(), params});
  }
  int max_calls = parallel ? INT_MAX : 1;
  if (choice.is_object()) {
    const Json* fn = choice.contains("function") ? &choice["function"] : nullptr;
    if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return r.Fail("tool_choice",
                    "'tool_choice' naming a function must be {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
    }
    const std::string name = (*fn)["name"].get<std::string>();
    auto it = std::find_if(tools.begin(), tools.end(),
                           [&](const structured::ToolSchema& s) { return s.name == name; });
    if (it == tools.end()) {
      return r.Fail("tool_choice",
                    "'tool_choice' names the function '" + name + "', which is not among 'tools'");
    }
    tools = {*it};
    max_calls = 1;
  }
  auto g = structured::ToolCallsGrammar(tools, max_calls);
  if (!g.ok()) return r.Fail("tool_choice", "'tool_choice': " + std::string(g.status().message()));
  spec->grammar = *std::move(g);
  spec->grammar_param = "tool_choice";
  // Forced calls are generated in the llama3_json format: its parser reads them back.
  spec->output.tools = ToolParserKind::kLlama3Json;
  spec->output.max_tool_calls = max_calls;
  return true;
}

// tools, tool_choice and parallel_tool_calls → spec->tools and spec->output.tools, as vLLM:
// "auto" (the default when tools are given and --enable-auto-tool-choice is on) parses tool calls
// out of the answer; "none" (the default otherwise) renders the tools but parses nothing;
// "required" and a named function force calls by constrained decoding (ForceToolCalls).
bool ParseTools(Reader& r, const ProtocolLimits& limits, GenerateSpec* spec) {
  if (const Json* tools = r.Get("tools")) {
    if (!tools->is_array()) return r.Fail("tools", "'tools' must be a list");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return r.Fail(p, "each tool must be an object");
      auto type = t.find("type");
      if (type != t.end() && *type != "function")
        return r.Fail(p + ".type", "only tools of type \"function\" are supported");
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        return r.Fail(p + ".function", "a tool needs a 'function' object with a string 'name'");
    }
    spec->tools = *tools;
  }
  const bool has_tools = spec->tools.is_array() && !spec->tools.empty();
  const bool can_auto =
      limits.enable_auto_tool_choice && limits.tool_parser != ToolParserKind::kNone;
  bool parse_calls = has_tools && can_auto;  // tool_choice absent
  bool parallel = true;
  if (!r.Bool("parallel_tool_calls", &parallel)) return false;
  if (const Json* choice = r.Get("tool_choice")) {
    const std::string value = choice->is_string() ? choice->get<std::string>() : "";
    if (value == "none") {
      parse_calls = false;
    } else if (value == "required" && spec->tools.is_array() && spec->tools.empty()) {
      parse_calls = false;  // OpenAI's and vLLM's reading: "required" with no tools is "none"
    } else if (value == "auto" || value == "required" || choice->is_object()) {
      if (!has_tools)
        return r.Fail("tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
      if (value == "auto" && !can_auto) {
        return r.Fail("tool_choice",
                      "\"auto\" tool choice requires --enable-auto-tool-choice and "
                      "--tool-call-parser to be set");
      }
      if (value != "auto" && !ForceToolCalls(r, *choice, parallel, spec)) return false;
      parse_calls = true;
    } else {
      return r.Fail("tool_choice",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (spec->grammar != nullptr && spec->grammar_param == "tool_choice") return true;  // forced
  spec->output.tools = parse_calls ? limits.tool_parser : ToolParserKind::kNone;
  // Some models mark <tool_call> as a special token: the hermes parser must see it (vLLM turns
  // skip_special_tokens off for it too).
  if (spec->output.tools == ToolParserKind::kHermes) spec->skip_special_tokens = false;
  spec->output.max_tool_calls = parallel ? INT_MAX : 1;
  return true;
}

}  // namespace

OrderedJson ApiError::ToJson() const {
  OrderedJson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? OrderedJson(nullptr) : OrderedJson(param);
  e["code"] = code.empty() ? OrderedJson(http_status) : OrderedJson(code);
  return OrderedJson{{"error", e}};
}

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

int HttpStatusFor(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

ApiError FromStatus(const Status& status, std::string param) {
  ApiError e;
  e.http_status = HttpStatusFor(status.code());
  e.message = status.message();
  e.param = std::move(param);
  switch (e.http_status) {
    case 400:
      e.type = "invalid_request_error";
      break;
    case 404:
      e.type = "not_found_error";
      break;
    case 429:
      e.type = "rate_limit_error";
      break;
    case 503:
      e.type = "service_unavailable_error";
      break;
    default:
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError HostKvTooLarge(const Status& status) {
  ApiError e;
  e.http_status = 413;
  e.type = "invalid_request_error";
  e.message = status.message();
  e.param = "max_tokens";
  e.code = "host_kv_exhausted";
  return e;
}

std::string FormatNumber(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::optional<int32_t> JsonTokenId(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kTokenIdMax)) return std::nullopt;
    return static_cast<int32_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0 || i > kTokenIdMax) return std::nullopt;
    return static_cast<int32_t>(i);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= 0 && d <= static_cast<double>(kTokenIdMax)) || d != std::floor(d))
      return std::nullopt;
    return static_cast<int32_t>(d);
  }
  return std::nullopt;
}

std::optional<Json> ParseJsonBody(const std::string& body, ApiError* error) {
  if (JsonNestedDeeperThan(body)) {
    *error = BadRequest("the request body nests arrays and objects deeper than " +
                        std::to_string(kMaxJsonDepth) + " levels");
    return std::nullopt;
  }
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    *error = BadRequest("malformed JSON in the request body");
    return std::nullopt;
  }
  if (!json.is_object()) {
    *error = BadRequest("the request body must be a JSON object");
    return std::nullopt;
  }
  return json;
}

std::optional<GenerateSpec> ParseCompletionRequest(const Json& body, const ProtocolLimits& limits,
                                                   ApiError* error) {
  Reader r(body, error);
  GenerateSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  const Json* prompt = r.Get("prompt");
  if (prompt == nullptr) return r.Fail("prompt", "'prompt' is required"), std::nullopt;
  if (!ParsePrompt(r, *prompt, &spec)) return std::nullopt;
  if (!ParseCommon(r, limits, &spec)) return std::nullopt;
  int64_t max_tokens = 16;  // the OpenAI / vLLM default for completions
  if (!r.Int("max_tokens", 1, kInt64Max, &max_tokens)) return std::nullopt;
  spec.max_tokens = max_tokens;
  if (!CheckMaxTokens(r, limits, "max_tokens", &spec)) return std::nullopt;
  if (!r.Bool("echo", &spec.echo)) return std::nullopt;
  if (!ParseAddSpecialTokens(r, &spec)) return std::nullopt;
  if (const Json* lp = r.Get("logprobs")) {
    int64_t k = 0;
    if (!r.IntValue(*lp, "logprobs", 0, limits.max_top_logprobs, &k)) return std::nullopt;
    spec.logprobs = true;
    spec.top_logprobs = static_cast<int>(k);
  }
  // echo with logprobs: the prompt's logprobs lead the choice's (vLLM computes them as
  // prompt logprobs with k = logprobs unless prompt_logprobs is given).
  if (spec.echo && spec.logprobs && !spec.prompt_logprobs) spec.prompt_logprobs = spec.top_logprobs;
  if (const Json* suffix = r.Get("suffix")) {
    if (!suffix->is_string() || !suffix->get<std::string>().empty()) {
      return r.Fail("suffix", "'suffix' is not supported"), std::nullopt;
    }
  }
  if (!CheckStructuredCombinations(r, spec)) return std::nullopt;
  if (!r.RejectUnread()) return std::nullopt;
  return spec;
}

bool IsServerChatTemplateKey(std::string_view key) {
  for (std::string_view k : kServerChatTemplateKeys) {
    if (key == k) return true;
  }
  return false;
}

std::optional<GenerateSpec> ParseChatRequest(const Json& body, const ProtocolLimits& limits,
                                             ApiError* error) {
  Reader r(body, error);
  GenerateSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  const Json* messages = r.Get("messages");
  if (messages == nullptr) return r.Fail("messages", "'messages' is required"), std::nullopt;
  if (!messages->is_array() || messages->empty()) {
    return r.Fail("messages", "'messages' must be a non-empty list"), std::nullopt;
  }
  spec.messages = OrderedJson::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return r.Fail(param, "each message must be an object"), std::nullopt;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return r.Fail(param + ".role", "each message needs a string 'role'"), std::nullopt;
    OrderedJson copy = m;
    if (!NormaliseMessage(r, copy, i)) return std::nullopt;
    spec.messages.push_back(std::move(copy));
  }
  if (!ParseCommon(r, limits, &spec)) return std::nullopt;
  int64_t max_tokens = 0;
  // max_completion_tokens wins when both are given (vLLM); max_tokens must still be valid then.
  const char* max_param =
      r.Get("max_completion_tokens") != nullptr ? "max_completion_tokens" : "max_tokens";
  if (r.Get("max_tokens") != nullptr && !r.Int("max_tokens", 1, kInt64Max, &max_tokens))
    return std::nullopt;
  if (r.Get(max_param) != nullptr) {
    if (!r.Int(max_param, 1, kInt64Max, &max_tokens)) return std::nullopt;
    spec.max_tokens = max_tokens;
    spec.max_tokens_param = max_param;
  }
  if (!CheckMaxTokens(r, limits, max_param, &spec)) return std::nullopt;
  if (!r.Bool("logprobs", &spec.logprobs)) return std::nullopt;
  int64_t top = 0;
  if (!r.Int("top_logprobs", 0, limits.max_top_logprobs, &top)) return std::nullopt;
  if (top > 0 && !spec.logprobs)
    return r.Fail("top_logprobs", "'top_logprobs' needs logprobs=true"), std::nullopt;
  spec.top_logprobs = static_cast<int>(top);
  if (!r.Bool("add_generation_prompt", &spec.add_generation_prompt)) return std::nullopt;
  if (!ParseAddSpecialTokens(r, &spec)) return std::nullopt;
  if (!r.Bool("continue_final_message", &spec.continue_final_message)) return std::nullopt;
  if (spec.continue_final_message && spec.add_generation_prompt &&
      r.Get("add_generation_prompt") != nullptr) {
    return r.Fail("continue_final_message",
                  "'continue_final_message' and 'add_generation_prompt' exclude each other"),
           std::nullopt;
  }
  if (spec.continue_final_message) spec.add_generation_prompt = false;
  if (const Json* tmpl = r.Get("chat_template")) {
    if (!tmpl->is_string())
      return r.Fail("chat_template", "'chat_template' must be a string (a Jinja template)"),
             std::nullopt;
    if (!tmpl->get<std::string>().empty()) spec.chat_template = tmpl->get<std::string>();
  }
  if (const Json* kwargs = r.Get("chat_template_kwargs")) {
    if (!kwargs->is_object())
      return r.Fail("chat_template_kwargs", "'chat_template_kwargs' must be an object"),
             std::nullopt;
    for (const auto& [key, value] : kwargs->items()) {
      if (IsServerChatTemplateKey(key)) {
        return r.Fail("chat_template_kwargs",
                      "'chat_template_kwargs' may not set '" + key +
                          "': the server sets that template variable itself"),
               std::nullopt;
      }
    }
    spec.chat_template_kwargs = *kwargs;
  }
  if (!ParseTools(r, limits, &spec)) return std::nullopt;
  // Reasoning is split out unless the request turned thinking off (Qwen3's enable_thinking).
  auto thinking = spec.chat_template_kwargs.find("enable_thinking");
  const bool thinking_off = thinking != spec.chat_template_kwargs.end() && thinking->is_boolean() &&
                            !thinking->get<bool>();
  spec.output.reasoning = thinking_off ? ReasoningParserKind::kNone : limits.reasoning_parser;
  if (!CheckStructuredCombinations(r, spec)) return std::nullopt;
  if (!r.RejectUnread()) return std::nullopt;
  return spec;
}

}  // namespace oasis::server
