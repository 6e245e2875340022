// oasis-router: the OpenAI HTTP front of disaggregated prefill/decode (router.h has the protocol).
//
//   oasis-router --prefill 10.0.0.1:8001,10.0.0.2:8001 --decode 10.0.0.3:8002 --port 8000
//   oasis-router --config configs/router.json --port 9000        # flags override the file
//
// Prints "oasis-router listening on http://HOST:PORT" (the bound port, also with --port 0) to
// stdout once bound. SIGINT/SIGTERM: stop accepting, cancel the upstream calls in flight, exit 0.
#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/program.h"
#include "router/router.h"

using namespace oasis;
using namespace oasis::router;

int main(int argc, char** argv) {
  const ShutdownSignals signals;
  StatusOr<RouterCommandLine> cmd = ParseRouterCommandLine(argc, argv);
  if (std::optional<int> exit_code = StartProgram(
          "oasis-router", cmd, [](const RouterCommandLine& c) { return c.settings.log_level; })) {
    return *exit_code;
  }
  RaiseOpenFileLimit();
  Router router(cmd->options);
  StatusOr<int> port = router.Bind(cmd->settings.host, static_cast<int>(cmd->settings.port));
  if (!port.ok()) return ExitWithError("oasis-router", port.status(), 1);
  bool served = true;
  std::thread http([&router, &served] {
    served = router.Run();
    if (!served) ShutdownSignals::Raise();  // wakes the Wait below
  });
  std::printf("oasis-router listening on http://%s:%d\n", cmd->settings.host.c_str(), *port);
  std::fflush(stdout);
  std::string prefill, decode;
  for (const Address& a : cmd->options.prefill)
    prefill += (prefill.empty() ? "" : ",") + a.ToString();
  for (const Address& a : cmd->options.decode) decode += (decode.empty() ? "" : ",") + a.ToString();
  spdlog::info("prefill instances: {}; decode instances: {}", prefill, decode);
  signals.Wait();
  router.Stop();
  http.join();
  if (!served) {
    std::fprintf(stderr, "oasis-router: the HTTP server stopped with an error\n");
    return 1;
  }
  return 0;
}
