// bench_disagg_fetch: RemoteReader throughput and latency against a staging pool in another
// process (disagg_peer serve), the way the decode side will use it.
//   bench_disagg_fetch PEER_BINARY [--tls T] [--block-bytes 4096] [--pool-mib 512]
//                                  [--batch 512] [--seconds 2] [--spin-us 0]
// Reports, for random scattered blocks in batches of --batch (one layer's drift fetch) and for
// whole contiguous runs: GB/s, batches/s, and the p50/p99 latency of one Fetch call.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "disagg/remote_reader.h"
#include "disagg_test_util.h"

using namespace oasis;
using namespace oasis::disagg;

namespace {
struct Result {
  double gbps, batches_per_s, p50_us, p99_us;
};

Result Run(RemoteReader& reader, size_t batch, bool contiguous, double seconds) {
  const uint64_t bb = reader.descriptor().block_bytes;
  const uint64_t nblocks = reader.descriptor().num_blocks;
  std::vector<unsigned char> local(batch * bb);
  std::vector<FetchItem> items(batch);
  std::mt19937_64 rng(1);
  std::vector<double> lat;
  uint64_t bytes = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const uint64_t base = rng() % (nblocks - batch);
    for (size_t i = 0; i < batch; ++i) {
      items[i] = {contiguous ? base + i : rng() % nblocks, local.data() + i * bb};
    }
    const auto t0 = Clock::now();
    Status s = reader.Fetch(items, Clock::now() + std::chrono::seconds(10));
    if (!s.ok()) {
      std::fprintf(stderr, "fetch failed: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    bytes += batch * bb;
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(lat.begin(), lat.end());
  return {bytes / took / 1e9, lat.size() / took, lat[lat.size() / 2],
          lat[std::min(lat.size() - 1, lat.size() * 99 / 100)]};
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_disagg_fetch PEER_BINARY [--key value ...]\n");
    return 2;
  }
  std::map<std::string, std::string> args = {{"--tls", "tcp"},      {"--block-bytes", "4096"},
                                             {"--pool-mib", "512"}, {"--batch", "512"},
                                             {"--seconds", "2"},    {"--spin-us", "0"}};
  for (int i = 2; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  const uint64_t bb = std::stoull(args["--block-bytes"]);
  const uint64_t nblocks = std::stoull(args["--pool-mib"]) * (1 << 20) / bb;
  const size_t batch = std::stoul(args["--batch"]);
  const double seconds = std::stod(args["--seconds"]);

  testing::ChildProcess peer({argv[1], "serve", "--tls", args["--tls"], "--blocks",
                              std::to_string(nblocks), "--block-bytes", std::to_string(bb),
                              "--seed", "1"});
  auto line = testing::ReadPeerLine(peer, std::chrono::seconds(30));
  auto words = line ? testing::SplitWords(*line) : std::vector<std::string>{};
  if (words.size() != 2 || words[0] != "READY") {
    std::fprintf(stderr, "peer did not start: %s\n", line ? line->c_str() : "(nothing)");
    return 1;
  }
  UcxOptions uo;
  if (args["--tls"] != "default") uo.transports = args["--tls"];
  auto ctx = UcxContext::Create(uo);
  if (!ctx.ok()) return std::fprintf(stderr, "%s\n", ctx.status().ToString().c_str()), 1;
  RemoteReaderOptions ro;
  ro.spin = std::chrono::microseconds(std::stoll(args["--spin-us"]));
  auto reader = RemoteReader::Connect(*ctx, words[1], ro);
  if (!reader.ok()) return std::fprintf(stderr, "%s\n", reader.status().ToString().c_str()), 1;

  std::printf("UCX_TLS=%s block %llu B, pool %llu blocks, batch %zu, spin %s us\n",
              args["--tls"].c_str(), static_cast<unsigned long long>(bb),
              static_cast<unsigned long long>(nblocks), batch, args["--spin-us"].c_str());
  std::printf("%s", (*reader)->TransportInfo().c_str());
  double gbps[2] = {0, 0};
  for (bool contiguous : {false, true}) {
    const Result r = Run(**reader, batch, contiguous, seconds);
    gbps[contiguous ? 1 : 0] = r.gbps;
    std::printf("%-10s %7.3f GB/s  %8.1f fetches/s  p50 %8.1f us  p99 %8.1f us\n",
                contiguous ? "contiguous" : "scattered", r.gbps, r.batches_per_s, r.p50_us,
                r.p99_us);
  }
  std::printf("RESULT disagg_fetch tls=%s batch=%zu scattered %.3f GB/s contiguous %.3f GB/s\n",
              args["--tls"].c_str(), batch, gbps[0], gbps[1]);
  std::printf("gets issued %llu for %llu blocks\n",
              static_cast<unsigned long long>((*reader)->stats().gets_issued),
              static_cast<unsigned long long>((*reader)->stats().blocks_fetched));
  reader->reset();
  peer.CloseStdin();
  peer.Wait(std::chrono::seconds(10));
  return 0;
}
