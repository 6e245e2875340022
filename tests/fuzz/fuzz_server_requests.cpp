// libFuzzer target over oasis-server's full request path, in one process: the real HTTP front
// (Boost.Beast framing, limits, routing, API-key hook), the route handlers (JSON parsing with its
// depth limit, request validation, chat templates, tokenization, tool and reasoning parsers) and
// real generations on the embedded model with the CPU backend, driven over loopback sockets.
//
// Input: the first byte picks a route (or "raw": the rest is sent as-is, the HTTP framing is
// then fuzzed); the rest is the body, sent with a Content-Length. Each request gets a short
// deadline; past it the client resets the connection (the disconnect path). Afterwards the
// engine must settle: no running or waiting request and every KV slot free — a request the
// server forgot to abort, or a leaked block, is a finding. So is a 500, a malformed answer, or
// anything the sanitizers report. OASIS_FUZZ_VERBOSE=1 prints each answer's start.
// Seeds: tests/fuzz/make_server_requests_corpus.py; dictionary: server_requests.dict.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/http_front.h"
#include "server/http_server.h"
#include "server/model_host.h"
#include "server/serving.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace oasis;
using namespace oasis::server;

constexpr auto kRequestDeadline = std::chrono::milliseconds(1500);
constexpr auto kSettleDeadline = std::chrono::seconds(5);

struct Server {
  std::unique_ptr<Service> service;
  std::unique_ptr<HttpFrontend> http;
  int port = 0;
  int64_t kv_slots = 0;
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "fuzz_server_requests: %s\n", why.c_str());
  std::fflush(stderr);
  std::abort();
}

Server& TheServer() {
  static Server* server = [] {
    auto* s = new Server;
    std::vector<std::string> args = {"oasis-server",
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     "0",
                                     "--max-num-seqs",
                                     "4",
                                     "--max-model-len",
                                     "512",
                                     "--http-threads",
                                     "2",
                                     "--enable-auto-tool-choice",
                                     "--tool-call-parser",
                                     "hermes",
                                     "--reasoning-parser",
                                     "qwen3",
                                     "--log-level",
                                     "off"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    StatusOr<ParsedCommandLine> cmd = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
    if (!cmd.ok()) Die("flags: " + cmd.status().ToString());
    spdlog::set_level(spdlog::level::off);
    s->service = std::make_unique<Service>(cmd->config);
    s->http = std::make_unique<HttpFrontend>(*s->service);
    StatusOr<int> port = s->http->Bind("127.0.0.1", 0);
    if (!port.ok()) Die("bind: " + port.status().ToString());
    s->port = *port;
    s->http->Start();
    StatusOr<std::unique_ptr<ModelHost>> host = LoadModelHost(cmd->config);
    if (!host.ok()) Die("load: " + host.status().ToString());
    s->kv_slots = (*host)->engine->Stats().kv.num_slots;
    s->service->Publish(std::move(host).value());
    return s;
  }();
  return *server;
}

// Sends `request` on a fresh loopback connection and reads the answer until the server closes
// it or the deadline passes (then the connection is reset: a client gone mid-request).
// Returns the bytes read and whether the server ended the answer.
// A raw request is followed by a half-close (its framing may leave the server waiting for more);
// a well-framed one is not (the server may take a client's EOF for a disconnect, as it should).
std::pair<std::string, bool> Exchange(int port, const std::string& request, bool half_close) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    // libFuzzer's timeout alarm (SIGALRM, no SA_RESTART) interrupts a connect that waits for
    // room in the server's accept queue (a busy 2-core CI machine): the handshake goes on in the
    // kernel, so wait for it rather than taking EINTR for a refused connection.
    if (errno != EINTR) Die(std::string("connect: ") + std::strerror(errno));
    const Clock::time_point until = Clock::now() + kSettleDeadline;
    pollfd p{fd, POLLOUT, 0};
    int ready = 0;
    while (Clock::now() < until && (ready = ::poll(&p, 1, 100)) <= 0) {
      if (ready < 0 && errno != EINTR) Die(std::string("connect: poll: ") + std::strerror(errno));
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (ready <= 0) Die("connect: not accepted within the settle deadline");
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
      Die(std::string("connect: ") + std::strerror(err));
  }
  const Clock::time_point deadline = Clock::now() + kRequestDeadline;
  size_t sent = 0;
  bool ended = false;
  std::string answer;
  char buf[16384];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (sent < request.size()) p.events |= POLLOUT;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left))) <= 0) continue;
    if ((p.revents & POLLOUT) && sent < request.size()) {
      const ssize_t n =
          ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        ended = true;  // the server closed the connection first (e.g. a framing error)
        break;
      }
      if (sent == request.size() && half_close) ::shutdown(fd, SHUT_WR);
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        answer.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        ended = true;
        break;
      }
    }
  }
  if (!ended) {
    linger l{1, 0};  // reset, not a graceful close
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  ::close(fd);
  return {answer, ended};
}

// A complete answer must be a well-formed HTTP response that is not a 5xx other than 503.
void CheckAnswer(const std::string& answer, bool raw) {
  if (answer.empty()) {
    if (raw) return;  // a framing error may close at once
    Die("no answer to a well-framed request");
  }
  if (answer.rfind("HTTP/1.1 ", 0) != 0 || answer.size() < 12) {
    Die("not an HTTP response: " + answer.substr(0, 80));
  }
  const int status = std::atoi(answer.c_str() + 9);
  if (status < 200 || status > 599) Die("bad status line: " + answer.substr(0, 80));
  if (status >= 500 && status != 503) Die("status " + std::to_string(status) + ": " + answer);
}

// The engine returns to idle with every KV slot free once the answer ended or the client left.
void CheckSettled(Server& s) {
  const Clock::time_point deadline = Clock::now() + kSettleDeadline;
  for (;;) {
    const EngineStats st = s.service->host()->engine->Stats();
    if (st.requests.num_running == 0 && st.requests.num_waiting == 0 &&
        st.kv.num_free_slots == s.kv_slots) {
      return;
    }
    if (Clock::now() > deadline) {
      Die("engine did not settle: running " + std::to_string(st.requests.num_running) +
          ", waiting " + std::to_string(st.requests.num_waiting) + ", free KV slots " +
          std::to_string(st.kv.num_free_slots) + " of " + std::to_string(s.kv_slots));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

constexpr std::string_view kRoutes[] = {"POST /v1/completions", "POST /v1/chat/completions",
                                        "POST /tokenize",       "POST /detokenize",
                                        "GET /v1/models",       "GET /health",
                                        "GET /metrics"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 256 * 1024) return 0;
  Server& s = TheServer();
  const uint8_t selector = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t num_routes = std::size(kRoutes);
  const bool raw = selector % (num_routes + 1) == num_routes;
  std::string request;
  if (raw) {
    request = body;
  } else {
    const std::string_view route = kRoutes[selector % (num_routes + 1)];
    const size_t space = route.find(' ');
    request = std::string(route.substr(0, space)) + " " + std::string(route.substr(space + 1)) +
              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (route.front() == 'P') {
      request +=
          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\n\r\n" + body;
    } else {
      request += "\r\n";
    }
  }
  const auto [answer, ended] = Exchange(s.port, request, raw);
  if (std::getenv("OASIS_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "fuzz_server_requests: %s answer (%zu bytes): %.300s\n",
                 ended ? "ended" : "cut", answer.size(), answer.c_str());
  }
  if (ended) CheckAnswer(answer, raw);
  CheckSettled(s);
  return 0;
}
