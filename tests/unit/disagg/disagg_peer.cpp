// disagg_peer: the other process of the two-process disaggregation tests.
//
//   disagg_peer serve --tls T --blocks N --block-bytes B --seed S [--listen HOST:PORT]
//                     [--secret S]
//     A StagingPool of N blocks filled with the test pattern, behind a StagingServer on
//     --listen (default 127.0.0.1:0) asking --secret of its readers. Prints
//     "READY <address>", then serves until stdin closes (exit 0).
//   disagg_peer read --tls T --peer ADDR --seed S --lease ID --blocks N --count C --renew-ms R
//                    [--secret S]
//     Connects (sending --secret), fetches C random blocks of the first N, checks the pattern, prints
//     "FETCHED <C> OK" (or "FAIL <why>" and exits 1), then renews lease ID every R ms until
//     stdin closes; then sends Complete for it and exits 0.
// T is a UCX_TLS value, or "default" for UCX's own selection.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "disagg/remote_reader.h"
#include "disagg/staging_pool.h"
#include "disagg/staging_server.h"
#include "disagg_test_util.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 2; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  return args;
}

uint64_t Num(std::map<std::string, std::string>& args, const std::string& key) {
  return std::strtoull(args[key].c_str(), nullptr, 10);
}

int Fail(const std::string& why) {
  std::printf("FAIL %s\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

// True when stdin has closed (EOF), after waiting up to `ms`.
bool StdinClosed(int ms) {
  pollfd fd{STDIN_FILENO, POLLIN, 0};
  if (poll(&fd, 1, ms) <= 0) return false;
  char c;
  return read(STDIN_FILENO, &c, 1) <= 0;
}

int Serve(std::map<std::string, std::string>& args, std::shared_ptr<UcxContext> ctx) {
  StagingPoolOptions po;
  po.num_blocks = Num(args, "--blocks");
  po.block_bytes = Num(args, "--block-bytes");
  auto pool = StagingPool::Create(ctx, po);
  if (!pool.ok()) return Fail(pool.status().ToString());
  for (uint64_t b = 0; b < po.num_blocks; ++b) {
    testing::FillPattern((*pool)->BlockData(static_cast<uint32_t>(b)), po.block_bytes,
                         Num(args, "--seed"), b);
  }
  StagingServerOptions so;
  so.listen_address = args.count("--listen") ? args["--listen"] : "127.0.0.1:0";
  if (args.count("--secret")) so.secret = args["--secret"];
  auto server = StagingServer::Start(ctx, pool->get(), so);
  if (!server.ok()) return Fail(server.status().ToString());
  std::printf("READY %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  while (!StdinClosed(1000)) {
  }
  return 0;
}

int Read(std::map<std::string, std::string>& args, std::shared_ptr<UcxContext> ctx) {
  RemoteReaderOptions ro;
  if (args.count("--secret")) ro.secret = args["--secret"];
  auto reader = RemoteReader::Connect(ctx, args["--peer"], ro);
  if (!reader.ok()) return Fail(reader.status().ToString());
  const uint64_t bb = (*reader)->descriptor().block_bytes;
  const uint64_t count = Num(args, "--count");
  std::mt19937_64 rng(7);
  std::vector<uint64_t> blocks(count);
  for (auto& b : blocks) b = rng() % Num(args, "--blocks");
  std::vector<unsigned char> local(count * bb);
  std::vector<FetchItem> items(count);
  for (uint64_t i = 0; i < count; ++i) items[i] = {blocks[i], local.data() + i * bb};
  Status s = (*reader)->Fetch(items, Clock::now() + std::chrono::seconds(5));
  if (!s.ok()) return Fail(s.ToString());
  for (uint64_t i = 0; i < count; ++i) {
    if (!testing::MatchesPattern(local.data() + i * bb, bb, Num(args, "--seed"), blocks[i])) {
      return Fail("block " + std::to_string(blocks[i]) + " differs");
    }
  }
  std::printf("FETCHED %llu OK\n", static_cast<unsigned long long>(count));
  std::fflush(stdout);
  const uint64_t lease = Num(args, "--lease");
  const int renew_ms = static_cast<int>(Num(args, "--renew-ms"));
  while (!StdinClosed(renew_ms)) {
    s = (*reader)->Renew({&lease, 1}, Clock::now() + std::chrono::seconds(2));
    if (!s.ok()) return Fail(s.ToString());
  }
  s = (*reader)->Complete({&lease, 1}, Clock::now() + std::chrono::seconds(2));
  return s.ok() ? 0 : Fail(s.ToString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: disagg_peer serve|read --key value ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto args = ParseArgs(argc, argv);
  UcxOptions uo;
  if (args["--tls"] != "default") uo.transports = args["--tls"];
  auto ctx = UcxContext::Create(uo);
  if (!ctx.ok()) return Fail(ctx.status().ToString());
  if (mode == "serve") return Serve(args, *ctx);
  if (mode == "read") return Read(args, *ctx);
  std::fprintf(stderr, "disagg_peer: unknown mode %s\n", mode.c_str());
  return 2;
}
