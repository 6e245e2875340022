// oasis-router: the OpenAI HTTP front of disaggregated prefill/decode (router.h has the protocol).
//
//   oasis-router --prefill 10.0.0.1:8001,10.0.0.2:8001 --decode 10.0.0.3:8002 --port 8000
//   oasis-router --config configs/router.json --port 9000        # flags override the file
//
// Prints "oasis-router listening on http://HOST:PORT" (the bound port, also with --port 0) to
// stdout once bound. SIGINT/SIGTERM: stop accepting, cancel the upstream calls in flight, exit 0.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "router/router.h"

using namespace oasis;
using namespace oasis::router;

namespace {

// Blocks SIGINT/SIGTERM in every thread (call before starting any); sigwait takes them.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // writes to closed sockets fail with EPIPE instead
  const sigset_t signals = BlockShutdownSignals();
  StatusOr<RouterCommandLine> cmd = ParseRouterCommandLine(argc, argv);
  if (!cmd.ok()) {
    std::fprintf(stderr, "oasis-router: %s\n", cmd.status().ToString().c_str());
    return 2;
  }
  if (cmd->help) {
    std::printf("%s", cmd->usage.c_str());
    return 0;
  }
  if (Status st = InitLogging(cmd->settings.log_level); !st.ok()) {
    std::fprintf(stderr, "oasis-router: %s\n", st.ToString().c_str());
    return 2;
  }
  Router router(cmd->options);
  StatusOr<int> port = router.Bind(cmd->settings.host, static_cast<int>(cmd->settings.port));
  if (!port.ok()) {
    std::fprintf(stderr, "oasis-router: %s\n", port.status().ToString().c_str());
    return 1;
  }
  bool served = true;
  std::thread http([&router, &served] {
    served = router.Run();
    if (!served) kill(getpid(), SIGTERM);  // wakes the sigwait below
  });
  std::printf("oasis-router listening on http://%s:%d\n", cmd->settings.host.c_str(), *port);
  std::fflush(stdout);
  std::string prefill, decode;
  for (const Address& a : cmd->options.prefill) prefill += (prefill.empty() ? "" : ",") + a.ToString();
  for (const Address& a : cmd->options.decode) decode += (decode.empty() ? "" : ",") + a.ToString();
  spdlog::info("prefill instances: {}; decode instances: {}", prefill, decode);
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  router.Stop();
  http.join();
  if (!served) {
    std::fprintf(stderr, "oasis-router: the HTTP server stopped with an error\n");
    return 1;
  }
  return 0;
}
