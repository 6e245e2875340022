// Histogram: a Prometheus-style histogram with fixed upper bounds, and its text exposition.
// The engine keeps its latency histograms (TTFT, ITL, e2e) in it, oasis-router its own; both
// /metrics endpoints render them with RenderHistogram. Plain value type; thread-compatible
// (its owner locks or snapshots it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oasis {

// counts[i] = observations in (bounds[i-1], bounds[i]]; the exposition makes them cumulative.
struct Histogram {
  std::vector<double> bounds;  // upper bounds, ascending
  std::vector<int64_t>
      counts;  // per bucket (non-cumulative), bounds.size() + 1 entries (+Inf last)
  double sum = 0.0;
  int64_t count = 0;

  // Empty buckets for `upper_bounds` (ascending).
  static Histogram WithBounds(std::vector<double> upper_bounds);
  void Observe(double value);
};

// A sample value in Prometheus text: printf's %.{digits}g, or with digits 0 the shortest %g
// that reads back as the same double (0.005 as "0.005", not "0.0050000000000000001").
std::string PrometheusNumber(double value, int digits = 0);

// The exposition of `h`: HELP, TYPE, cumulative _bucket lines, _sum and _count. `labels` are
// the series' labels without braces (`model_name="m"`), or empty for none; `bound_digits` are
// the significant digits of the `le` labels (0: the shortest that round-trips).
std::string RenderHistogram(const std::string& name, const std::string& help, const Histogram& h,
                            const std::string& labels, int bound_digits = 0);

}  // namespace oasis
