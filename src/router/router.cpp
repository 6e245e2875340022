#include "router/router.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include "common/flags.h"
#include "common/http_listener.h"
#include "common/http_util.h"
#include "common/settings.h"
#include "router/upstream.h"

namespace oasis::router {
namespace {

using Clock = std::chrono::steady_clock;
using httplib::Request;
using httplib::Response;

constexpr auto kPoll = std::chrono::milliseconds(50);

std::string Dump(const OrderedJson& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void SendJson(Response& res, const OrderedJson& body, int status) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(Response& res, int status, const std::string& message) {
  SendJson(res, ErrorJson(status, message), status);
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Routes whose label is the path; everything else counts as "other" (bounded label set).
std::string RouteLabel(const std::string& path) {
  static const char* const kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"};
  for (const char* r : kRoutes) {
    if (path == r) return r;
  }
  return "other";
}

std::string Number(double v, int digits = 17) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

// The message of an OpenAI error body, or a short prefix of whatever the body is.
std::string ErrorMessageOf(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object()) {
      auto m = e->find("message");
      if (m != e->end() && m->is_string()) return m->get<std::string>();
    }
  }
  std::string text = Trim(body.substr(0, 200));
  return text.empty() ? "no body" : text;
}

const char* RoleName(Router::Role role) { return role == Router::Role::kPrefill ? "prefill" : "decode"; }

// ----------------------------------------------------------------------------- settings table

using Setting = SettingField<RouterSettings>;

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> settings = {
      {"prefill", &RouterSettings::prefill, "prefill instances, host:port[,host:port...] (required)"},
      {"decode", &RouterSettings::decode, "decode instances, host:port[,host:port...] (required)"},
      {"host", &RouterSettings::host, "address to listen on"},
      {"port", &RouterSettings::port, "port to listen on; 0 = any free port (printed at start)"},
      {"api-key", &RouterSettings::api_key,
       "when set, clients need 'Authorization: Bearer KEY' (not for /health, /metrics)"},
      {"timeout-s", &RouterSettings::timeout_s, "upstream read timeout in seconds"},
      {"connect-timeout-s", &RouterSettings::connect_timeout_s, "upstream connect timeout in seconds"},
      {"http-threads", &RouterSettings::http_threads, "HTTP worker threads (each open request holds one)"},
      {"max-body-bytes", &RouterSettings::max_body_bytes, "larger request bodies get 413"},
      {"log-level", &RouterSettings::log_level, "trace, debug, info, warn, error, off"},
  };
  return settings;
}

Status LoadConfigFile(const std::string& path, RouterSettings* settings) {
  OASIS_ASSIGN_OR_RETURN(const nlohmann::json json, ReadConfigJson(path));
  return ApplyRouterConfigJson(json, path, settings);
}

}  // namespace

// ------------------------------------------------------------------------------------ addresses

std::string Address::ToString() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

StatusOr<Address> ParseAddress(std::string_view text) {
  const std::string original(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgument("bad address '" + original + "': " + why + " (expected host:port)");
  };
  std::string s = Trim(text);
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  if (!s.empty() && s.back() == '/') s.pop_back();
  if (s.empty()) return bad("empty");
  std::string host, port;
  if (s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return bad("malformed [IPv6]:port");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("an IPv6 host needs brackets, [::1]:8000");
  }
  if (host.empty()) return bad("no host");
  for (char c : host) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == '@' || c == '?' || c == '#' || c == ',') {
      return bad("invalid character in the host");
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("the port must be a number in 1-65535");
  }
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return bad("the port must be a number in 1-65535");
  return Address{host, p};
}

StatusOr<std::vector<Address>> ParseAddressList(std::string_view text, const std::string& what) {
  std::vector<Address> out;
  if (Trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (Trim(item).empty()) return InvalidArgument(what + ": empty entry in '" + std::string(text) + "'");
    StatusOr<Address> a = ParseAddress(item);
    if (!a.ok()) return InvalidArgument(what + ": " + a.status().message());
    out.push_back(*a);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// ------------------------------------------------------------------------------------- settings

StatusOr<RouterOptions> RouterSettings::ToOptions() const {
  RouterOptions o;
  OASIS_ASSIGN_OR_RETURN(o.prefill, ParseAddressList(prefill, "--prefill"));
  OASIS_ASSIGN_OR_RETURN(o.decode, ParseAddressList(decode, "--decode"));
  if (o.prefill.empty()) {
    return InvalidArgument(
        "at least one prefill instance is required: --prefill host:port[,host:port...] or \"prefill\" in --config");
  }
  if (o.decode.empty()) {
    return InvalidArgument(
        "at least one decode instance is required: --decode host:port[,host:port...] or \"decode\" in --config");
  }
  if (host.empty()) return InvalidArgument("--host must not be empty");
  if (port < 0 || port > 65535) return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(port));
  if (!(timeout_s > 0)) return InvalidArgument("--timeout-s must be positive, got " + Number(timeout_s));
  if (!(connect_timeout_s > 0))
    return InvalidArgument("--connect-timeout-s must be positive, got " + Number(connect_timeout_s));
  if (http_threads < 1 || http_threads > 65536) {
    return InvalidArgument("--http-threads must be in [1, 65536], got " + std::to_string(http_threads));
  }
  if (max_body_bytes < 1)
    return InvalidArgument("--max-body-bytes must be positive, got " + std::to_string(max_body_bytes));
  o.api_key = api_key;
  o.timeout_s = timeout_s;
  o.connect_timeout_s = connect_timeout_s;
  o.http_threads = http_threads;
  o.max_body_bytes = max_body_bytes;
  return o;
}

Status ApplyRouterConfigJson(const nlohmann::json& json, const std::string& source, RouterSettings* settings) {
  if (!json.is_object()) return InvalidArgument(source + ": expected a JSON object of settings");
  for (const auto& [key, value] : json.items()) {
    if (!key.empty() && key[0] == '_') continue;  // "_comment" and the like
    const std::string name = FlagName(key);
    const std::string where = source + ": '" + key + "'";
    if (name == "prefill" || name == "decode") {
      std::string list;
      if (value.is_string()) {
        list = value.get<std::string>();
      } else if (value.is_array()) {
        for (const auto& item : value) {
          if (!item.is_string()) return InvalidArgument(where + " must be a list of \"host:port\" strings");
          if (!list.empty()) list += ",";
          list += item.get<std::string>();
        }
      } else {
        return InvalidArgument(where + " must be a list of \"host:port\" strings");
      }
      (name == "prefill" ? settings->prefill : settings->decode) = list;
      continue;
    }
    const Setting* setting = FindSetting(Settings(), name);
    if (setting == nullptr) return InvalidArgument(source + ": unknown setting '" + key + "'");
    OASIS_RETURN_IF_ERROR(ApplyJsonSetting(*setting, value, where, settings));
  }
  return Status::Ok();
}

StatusOr<RouterCommandLine> ParseRouterCommandLine(int argc, char** argv) {
  RouterCommandLine out;
  // Pass 1: the config file, so that flags given on the command line override it.
  OASIS_ASSIGN_OR_RETURN(const std::vector<std::string> paths, ConfigPaths(argc, argv));
  for (const std::string& path : paths) OASIS_RETURN_IF_ERROR(LoadConfigFile(path, &out.settings));
  // Pass 2: flags, bound to the fields (their defaults now being the file's values).
  FlagParser flags(
      "oasis-router: the OpenAI HTTP front of disaggregated prefill/decode. Each request goes to a\n"
      "prefill instance (oasis-server --role prefill), then with its handoff ticket to a decode\n"
      "instance (--role decode), whose answer is streamed back. Holds no model.\n"
      "Settings come from --config FILE (JSON, keys = flag names; \"prefill\"/\"decode\" may be lists)\n"
      "and flags, flags winning.");
  std::string config_path;
  flags.AddString("config", &config_path, "JSON file of settings (keys: the flag names)");
  RouterSettings& s = out.settings;
  AddSettingFlags(flags, Settings(), &s);
  OASIS_RETURN_IF_ERROR(flags.Parse(argc, argv));
  out.help = flags.help_requested();
  out.usage = flags.Usage();
  if (!out.help) {
    OASIS_ASSIGN_OR_RETURN(out.options, s.ToOptions());
  }
  return out;
}

// ------------------------------------------------------------------------------------- protocol

OrderedJson ErrorJson(int status, const std::string& message) {
  const char* type = status == 503 ? "service_unavailable" : status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}}}};
}

std::optional<ClientRequest> ParseClientRequest(const std::string& text, int* status, std::string* message) {
  *status = 400;
  ClientRequest out;
  out.body = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.body.is_discarded()) {
    *message = "the request body is not valid JSON";
    return std::nullopt;
  }
  if (!out.body.is_object()) {
    *message = "the request body must be a JSON object";
    return std::nullopt;
  }
  // Several samples per prompt would need one handoff per sample: not supported.
  for (const char* key : {"n", "best_of"}) {
    auto it = out.body.find(key);
    if (it != out.body.end() && it->is_number() && it->get<double>() > 1) {
      *message = "n > 1 is not supported by the disaggregated router";
      return std::nullopt;
    }
  }
  auto stream = out.body.find("stream");
  if (stream != out.body.end() && !stream->is_null()) {
    if (!stream->is_boolean()) {
      *message = "'stream' must be a boolean";
      return std::nullopt;
    }
    out.stream = stream->get<bool>();
  }
  auto options = out.body.find("stream_options");
  if (options != out.body.end() && options->is_object()) {
    auto usage = options->find("include_usage");
    out.include_usage = usage != options->end() && usage->is_boolean() && usage->get<bool>();
  }
  return out;
}

OrderedJson PrefillBody(const OrderedJson& client_body) {
  OrderedJson b = client_body;
  b["stream"] = false;
  b.erase("stream_options");
  return b;
}

OrderedJson DecodeBody(const OrderedJson& client_body, const std::string& ticket) {
  OrderedJson b = client_body;
  b["oasis_ticket"] = ticket;
  return b;
}

std::string SynthesizeSse(const OrderedJson& response, Endpoint endpoint, bool include_usage) {
  const bool chat = endpoint == Endpoint::kChatCompletions;
  auto member = [](const OrderedJson& j, const char* key) -> OrderedJson {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() ? OrderedJson(nullptr) : *it;
  };
  OrderedJson choice = OrderedJson::object();
  const OrderedJson choices = member(response, "choices");
  if (choices.is_array() && !choices.empty()) choice = choices[0];
  auto envelope = [&] {
    return OrderedJson{{"id", member(response, "id")},
                       {"object", chat ? "chat.completion.chunk" : "text_completion"},
                       {"created", member(response, "created")},
                       {"model", member(response, "model")}};
  };
  OrderedJson out_choice = {{"index", 0}};
  if (chat) {
    OrderedJson content = member(member(choice, "message"), "content");
    out_choice["delta"] = {{"role", "assistant"}, {"content", content.is_null() ? OrderedJson("") : content}};
  } else {
    OrderedJson text = member(choice, "text");
    out_choice["text"] = text.is_null() ? OrderedJson("") : text;
  }
  out_choice["logprobs"] = member(choice, "logprobs");
  out_choice["finish_reason"] = member(choice, "finish_reason");
  OrderedJson chunk = envelope();
  chunk["choices"] = OrderedJson::array({out_choice});
  std::string sse = "data: " + Dump(chunk) + "\n\n";
  if (include_usage) {
    OrderedJson usage = envelope();
    usage["choices"] = OrderedJson::array();
    usage["usage"] = member(response, "usage");
    sse += "data: " + Dump(usage) + "\n\n";
  }
  sse += "data: [DONE]\n\n";
  return sse;
}

// -------------------------------------------------------------------------------------- metrics

Histogram::Histogram()
    : bounds({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
              1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      counts(bounds.size() + 1, 0) {}

void Histogram::Observe(double seconds) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin());
  ++counts[i];
  sum += seconds;
  ++count;
}

std::string Histogram::Render(const std::string& name, const std::string& help) const {
  std::ostringstream s;
  s << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    s << name << "_bucket{le=\"" << (i < bounds.size() ? Number(bounds[i], 15) : "+Inf") << "\"} " << cumulative
      << "\n";
  }
  s << name << "_sum " << Number(sum) << "\n" << name << "_count " << count << "\n";
  return s.str();
}

// --------------------------------------------------------------------------------------- router

Router::Router(RouterOptions options) : options_(std::move(options)), server_(std::make_unique<HttpListener>()) {
  auto fill = [](Pool& pool, Role role, const std::vector<Address>& addresses) {
    for (const Address& a : addresses) {
      auto inst = std::make_unique<Instance>();
      inst->role = role;
      inst->address = a;
      inst->label = a.ToString();
      pool.instances.push_back(std::move(inst));
    }
  };
  fill(prefill_, Role::kPrefill, options_.prefill);
  fill(decode_, Role::kDecode, options_.decode);
  const size_t threads = static_cast<size_t>(std::max<int64_t>(1, options_.http_threads));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  server_->set_keep_alive_timeout(5);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);
  Routes();
}

Router::~Router() {
  if (run_started_.load()) Stop();
}

StatusOr<int> Router::Bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    if (bound <= 0) return Unavailable("cannot bind an HTTP port on " + host);
  } else if (!server_->bind_to_port(host, port)) {
    return Unavailable("cannot bind HTTP " + host + ":" + std::to_string(port) + " (in use, or a bad --host)");
  }
  if (!static_cast<HttpListener&>(*server_).RaiseBacklog()) {
    return Unavailable("cannot set the listen backlog of HTTP " + host + ":" + std::to_string(bound) + ": " +
                       std::strerror(errno));
  }
  return bound;
}

bool Router::Run() {
  run_started_ = true;
  for (Pool* pool : {&prefill_, &decode_}) {
    for (auto& inst : pool->instances) {
      Instance* i = inst.get();
      health_threads_.emplace_back([this, i] { HealthLoop(i); });
    }
  }
  const bool ok = stopping_.load() ? true : server_->listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_stop_ = true;
    health_cv_.notify_all();
  }
  for (std::thread& t : health_threads_) t.join();
  health_threads_.clear();
  run_exited_ = true;
  return ok;
}

void Router::Stop() {
  if (stopping_.exchange(true)) return;
  // httplib's stop() is a no-op until listen_after_bind() runs; a listener that came up later
  // would serve forever.
  for (int i = 0; i < 500 && !server_->is_running() && !run_exited_.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  server_->stop();
  std::lock_guard<std::mutex> lock(health_mu_);
  health_stop_ = true;
  health_cv_.notify_all();
}

void Router::HealthLoop(Instance* instance) {
  httplib::Client client(instance->address.host, instance->address.port);
  const auto timeout = std::chrono::milliseconds(options_.health_timeout_ms);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      if (health_stop_) return;
    }
    httplib::Result r = client.Get("/health");
    const bool ok = r && r->status == 200;
    if (instance->healthy.exchange(ok) != ok) {
      if (ok) {
        spdlog::info("{} instance {} is healthy", RoleName(instance->role), instance->label);
      } else {
        spdlog::warn("{} instance {} is unhealthy: {}", RoleName(instance->role), instance->label,
                     r ? "GET /health answered " + std::to_string(r->status)
                       : "GET /health failed (" + httplib::to_string(r.error()) + ")");
      }
    }
    std::unique_lock<std::mutex> lock(health_mu_);
    health_cv_.wait_for(lock, std::chrono::milliseconds(options_.health_interval_ms), [this] { return health_stop_; });
  }
}

bool Router::InstanceHealthy(Role role, size_t index) const {
  const Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  return index < pool.instances.size() && pool.instances[index]->healthy.load();
}

std::vector<Router::Instance*> Router::Candidates(Role role, std::vector<Instance*>* skipped) {
  Pool& pool = role == Role::kPrefill ? prefill_ : decode_;
  std::vector<Instance*> healthy, unhealthy;
  for (auto& inst : pool.instances) (inst->healthy.load() ? healthy : unhealthy).push_back(inst.get());
  // Round-robin over the healthy ones; when none is, over all of them (the poll may be stale).
  if (healthy.empty()) healthy.swap(unhealthy);
  if (skipped != nullptr) *skipped = unhealthy;
  if (healthy.empty()) return healthy;
  const size_t start = static_cast<size_t>(pool.next.fetch_add(1) % healthy.size());
  std::rotate(healthy.begin(), healthy.begin() + static_cast<std::ptrdiff_t>(start), healthy.end());
  return healthy;
}

void Router::CountFailure(Instance* instance, const std::string& why, bool connection_failure) {
  instance->failures.fetch_add(1);
  if (connection_failure) {
    const bool newly = instance->healthy.exchange(false);
    spdlog::warn("{} instance {} failed: {}{}", RoleName(instance->role), instance->label, why,
                 newly ? " (marked unhealthy until its next good /health)" : "");
  } else {
    spdlog::info("{} instance {} refused a request: {}", RoleName(instance->role), instance->label, why);
  }
}

Router::Dispatched Router::Dispatch(Role role, const UpstreamRequest& request, bool buffered) {
  Dispatched out;
  std::vector<std::string> failures;
  // Buffered answers are taken whole at the end, so nothing may hold their receiver back;
  // relayed ones are taken as they come, the receiver waiting past 4 MiB not yet relayed.
  const UpstreamOptions options{options_.connect_timeout_s, options_.timeout_s,
                                buffered ? std::numeric_limits<size_t>::max() : size_t{4} << 20};
  std::vector<Instance*> skipped;
  for (Instance* inst : Candidates(role, &skipped)) {
    if (stopping_.load()) break;
    auto call = std::make_shared<UpstreamCall>(inst->address.host, inst->address.port, request, options);
    const bool headers = call->WaitHeaders(&stopping_);
    if (headers && buffered) call->WaitDone(&stopping_);
    if (stopping_.load()) {
      call->Cancel();
      break;
    }
    if (!headers || (buffered && !call->complete())) {
      const std::string why = call->ErrorText();
      failures.push_back(inst->label + " (" + why + ")");
      CountFailure(inst, why, /*connection_failure=*/true);
      continue;
    }
    const int status = call->status();
    if (status == 429 || status == 503) {
      if (!buffered) call->WaitDone(&stopping_, Clock::now() + std::chrono::seconds(1));
      const std::string why = "HTTP " + std::to_string(status) + ": " + ErrorMessageOf(call->TakeBody());
      call->Cancel();
      failures.push_back(inst->label + " (" + why + ")");
      CountFailure(inst, why, /*connection_failure=*/false);
      continue;
    }
    out.call = std::move(call);
    out.instance = inst;
    return out;
  }
  if (stopping_.load()) failures.push_back("the router is shutting down");
  if (!skipped.empty()) {
    std::string names;
    for (const Instance* inst : skipped) names += (names.empty() ? "" : ", ") + inst->label;
    failures.push_back("not tried, unhealthy: " + names);
  }
  for (size_t i = 0; i < failures.size(); ++i) out.failures += (i ? "; " : "") + failures[i];
  return out;
}

void Router::CountRequest(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  ++requests_[{route, status}];
}

bool Router::Relay(UpstreamCall& call, httplib::DataSink& sink, bool sse, bool record_ttft, Clock::time_point arrival,
                   bool* first_byte_sent) {
  std::string data;
  auto client_gone = [&] {
    call.Cancel();
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++client_disconnects_;
    return false;
  };
  while (true) {
    if (stopping_.load()) {
      call.Cancel();
      return false;
    }
    bool finished = false;
    call.Next(&data, kPoll, &finished);
    if (!data.empty()) {
      if (!sink.write(data.data(), data.size())) return client_gone();
      if (!*first_byte_sent) {
        *first_byte_sent = true;
        if (record_ttft) {
          std::lock_guard<std::mutex> lock(metrics_mu_);
          ttft_.Observe(std::chrono::duration<double>(Clock::now() - arrival).count());
        }
      }
    } else if (!finished && !sink.is_writable()) {
      return client_gone();
    }
    if (finished) {
      if (call.complete()) {
        sink.done();
        return true;
      }
      const std::string why = call.ErrorText();
      spdlog::warn("the decode instance's answer broke off: {}", why);
      if (sse) {
        const std::string event =
            "data: " + Dump(ErrorJson(502, "the decode instance's answer broke off: " + why)) + "\n\n";
        sink.write(event.data(), event.size());
      }
      return false;  // the client sees an unterminated chunked body
    }
  }
}

void Router::HandleGenerate(const Request& req, Response& res, Endpoint endpoint) {
  const Clock::time_point arrival = Clock::now();
  int status = 400;
  std::string message;
  std::optional<ClientRequest> parsed = ParseClientRequest(req.body, &status, &message);
  if (!parsed) return SendError(res, status, message);

  UpstreamRequest up;
  up.method = "POST";
  up.path = req.path;
  up.body = Dump(PrefillBody(parsed->body));
  up.authorization = req.get_header_value("Authorization");

  // 1. Prefill.
  Dispatched p = Dispatch(Role::kPrefill, up, /*buffered=*/true);
  if (!p.call) return SendError(res, 503, "no prefill instance could take the request: " + p.failures);
  const int prefill_status = p.call->status();
  std::string prefill_type = p.call->content_type();
  if (prefill_type.empty()) prefill_type = "application/json";
  std::string prefill_body = p.call->TakeBody();
  if (prefill_status != 200) {  // the client's error (400, 404, 413, 500...): relayed as is
    res.status = prefill_status;
    res.set_content(prefill_body, prefill_type);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    prefill_seconds_.Observe(std::chrono::duration<double>(Clock::now() - arrival).count());
  }
  const OrderedJson answer = OrderedJson::parse(prefill_body, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) {
    return SendError(res, 502,
                     "prefill instance " + p.instance->label + " answered 200 with a body that is not a JSON object");
  }
  auto handoff = answer.find("oasis_handoff");
  if (handoff != answer.end() && !handoff->is_null() && !handoff->is_string()) {
    return SendError(res, 502,
                     "prefill instance " + p.instance->label + " answered an 'oasis_handoff' that is not a string");
  }
  if (handoff == answer.end() || handoff->is_null()) {
    // Finished on the prefill instance (it stopped within its first two tokens).
    {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      ++finished_at_prefill_;
    }
    if (!parsed->stream) {
      res.status = 200;
      res.set_content(prefill_body, prefill_type);
      return;
    }
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_content(SynthesizeSse(answer, endpoint, parsed->include_usage), "text/event-stream");
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ttft_.Observe(std::chrono::duration<double>(Clock::now() - arrival).count());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++handoffs_;
  }

  // 2. Decode with the ticket.
  up.body = Dump(DecodeBody(parsed->body, handoff->get<std::string>()));
  prefill_body.clear();
  Dispatched d = Dispatch(Role::kDecode, up, /*buffered=*/false);
  if (!d.call) return SendError(res, 503, "no decode instance could take the request: " + d.failures);
  res.status = d.call->status();
  std::string type = d.call->content_type();
  if (type.empty()) type = "application/json";
  const bool sse = type.rfind("text/event-stream", 0) == 0;
  if (sse) res.set_header("Cache-Control", "no-cache");
  const bool record_ttft = parsed->stream && res.status == 200;
  std::shared_ptr<UpstreamCall> call = d.call;
  auto first = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      type,
      [this, call, sse, record_ttft, arrival, first](size_t, httplib::DataSink& sink) {
        try {
          return Relay(*call, sink, sse, record_ttft, arrival, first.get());
        } catch (const std::exception& e) {
          spdlog::error("relaying the decode answer: {}", e.what());
          call->Cancel();
          return false;
        }
      },
      [call](bool) { call->Cancel(); });
}

void Router::HandleModels(const Request& req, Response& res) {
  UpstreamRequest up;
  up.method = "GET";
  up.path = "/v1/models";
  up.authorization = req.get_header_value("Authorization");
  Dispatched d = Dispatch(Role::kDecode, up, /*buffered=*/true);
  if (!d.call) return SendError(res, 503, "no decode instance could answer /v1/models: " + d.failures);
  std::string type = d.call->content_type();
  res.status = d.call->status();
  res.set_content(d.call->TakeBody(), type.empty() ? "application/json" : type);
}

OrderedJson Router::HealthJson(bool* all_roles_healthy) const {
  OrderedJson out = OrderedJson::object();
  bool ok = true;
  for (const auto& [name, pool] : {std::pair<const char*, const Pool*>{"prefill", &prefill_}, {"decode", &decode_}}) {
    OrderedJson list = OrderedJson::array();
    bool any = false;
    for (const auto& inst : pool->instances) {
      const bool h = inst->healthy.load();
      any = any || h;
      list.push_back({{"address", inst->label}, {"healthy", h}});
    }
    ok = ok && any;
    out[name] = std::move(list);
  }
  if (all_roles_healthy != nullptr) *all_roles_healthy = ok;
  return out;
}

std::string Router::RenderMetrics() const {
  std::ostringstream s;
  std::lock_guard<std::mutex> lock(metrics_mu_);
  s << "# HELP oasis:router_requests_total Requests answered by the router, by route and status.\n"
       "# TYPE oasis:router_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    s << "oasis:router_requests_total{route=\"" << EscapeLabel(std::get<0>(key)) << "\",status=\"" << std::get<1>(key)
      << "\"} " << count << "\n";
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    s << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n" << name << " " << v << "\n";
  };
  counter("oasis:router_handoffs_total", "Requests handed from a prefill instance to a decode instance.", handoffs_);
  counter("oasis:router_finished_at_prefill_total", "Requests that finished on the prefill instance (no handoff).",
          finished_at_prefill_);
  counter("oasis:router_client_disconnects_total", "Relayed answers whose client went away before the end.",
          client_disconnects_);
  s << "# HELP oasis:router_instance_failures_total Upstream calls that failed (connection failure, 429 or 503), by "
       "instance.\n"
       "# TYPE oasis:router_instance_failures_total counter\n";
  for (const Pool* pool : {&prefill_, &decode_}) {
    for (const auto& inst : pool->instances) {
      s << "oasis:router_instance_failures_total{role=\"" << RoleName(inst->role) << "\",address=\""
        << EscapeLabel(inst->label) << "\"} " << inst->failures.load() << "\n";
    }
  }
  s << "# HELP oasis:router_instance_healthy Whether the instance is healthy (1) or not (0).\n"
       "# TYPE oasis:router_instance_healthy gauge\n";
  for (const Pool* pool : {&prefill_, &decode_}) {
    for (const auto& inst : pool->instances) {
      s << "oasis:router_instance_healthy{role=\"" << RoleName(inst->role) << "\",address=\""
        << EscapeLabel(inst->label) << "\"} " << (inst->healthy.load() ? 1 : 0) << "\n";
    }
  }
  s << ttft_.Render("oasis:router_time_to_first_token_seconds",
                    "Streaming requests: arrival to the first byte relayed to the client.");
  s << prefill_seconds_.Render("oasis:router_prefill_seconds",
                               "Arrival to the prefill instance's 200 answer (retries included).");
  return s.str();
}

void Router::Routes() {
  httplib::Server& s = *server_;

  // Wraps a handler: everything thrown becomes a 500 OpenAI error (the router never dies).
  auto guard = [](auto handler) {
    return [handler](const Request& req, Response& res) {
      try {
        handler(req, res);
      } catch (const std::exception& e) {
        spdlog::error("{} {}: {}", req.method, req.path, e.what());
        SendError(res, 500, std::string("internal error: ") + e.what());
      } catch (...) {
        SendError(res, 500, "internal error");
      }
    };
  };

  s.set_pre_routing_handler([this](const Request& req, Response& res) {
    const std::string& key = options_.api_key;
    if (key.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0 && KeyMatches(auth.substr(7), key))
      return httplib::Server::HandlerResponse::Unhandled;
    SendError(res, 401, "Unauthorized: send 'Authorization: Bearer <api key>'");
    return httplib::Server::HandlerResponse::Handled;
  });

  // httplib's own errors (unknown route, body over the limit, unreadable request) have no body.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    switch (res.status) {
      case 404:
        SendError(res, 404, "no route " + req.method + " " + req.path);
        break;
      case 413:
        SendError(res, 413,
                  "request body larger than the router's limit (--max-body-bytes " +
                      std::to_string(options_.max_body_bytes) + ")");
        break;
      default:
        SendError(res, res.status, "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path);
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  s.set_exception_handler([](const Request& req, Response& res, std::exception_ptr) {
    SendError(res, 500, "internal error in " + req.path);
  });

  s.set_logger([this](const Request& req, const Response& res) {
    CountRequest(RouteLabel(req.path), res.status);
    spdlog::debug("{} {} {}", req.method, req.path, res.status);
  });

  s.Get("/health", guard([this](const Request&, Response& res) {
          bool ok = false;
          OrderedJson body = HealthJson(&ok);
          SendJson(res, body, ok ? 200 : 503);
        }));
  s.Get("/metrics", guard([this](const Request&, Response& res) {
          res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
        }));
  s.Get("/v1/models", guard([this](const Request& req, Response& res) { HandleModels(req, res); }));
  s.Post("/v1/completions",
         guard([this](const Request& req, Response& res) { HandleGenerate(req, res, Endpoint::kCompletions); }));
  s.Post("/v1/chat/completions",
         guard([this](const Request& req, Response& res) { HandleGenerate(req, res, Endpoint::kChatCompletions); }));
}

}  // namespace oasis::router
