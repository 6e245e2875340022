#include "common/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/check.h"

namespace oasis {

Histogram Histogram::WithBounds(std::vector<double> upper_bounds) {
  OASIS_CHECK(std::is_sorted(upper_bounds.begin(), upper_bounds.end()))
      << "histogram bounds must ascend";
  Histogram h;
  h.counts.assign(upper_bounds.size() + 1, 0);
  h.bounds = std::move(upper_bounds);
  return h;
}

void Histogram::Observe(double value) {
  OASIS_CHECK_EQ(counts.size(), bounds.size() + 1) << "histogram not initialised (WithBounds)";
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
  ++counts[bucket];
  sum += value;
  ++count;
}

std::string PrometheusNumber(double value, int digits) {
  char buf[64];
  if (digits > 0) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, value);
    return buf;
  }
  // Whole-number digits are never cut into an exponent (2560, not 2.56e+03).
  const int whole = std::isfinite(value) && std::fabs(value) >= 1
                        ? static_cast<int>(std::floor(std::log10(std::fabs(value)))) + 1
                        : 1;
  for (int d = std::min(whole, 17); d <= 17; ++d) {  // 17 digits always round-trip a double
    std::snprintf(buf, sizeof buf, "%.*g", d, value);
    if (d == 17 || std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

std::string RenderHistogram(const std::string& name, const std::string& help, const Histogram& h,
                            const std::string& labels, int bound_digits) {
  const std::string prefix = labels.empty() ? "" : labels + ",";
  const std::string braced = labels.empty() ? "" : "{" + labels + "}";
  std::ostringstream s;
  s << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    const std::string le =
        i < h.bounds.size() ? PrometheusNumber(h.bounds[i], bound_digits) : "+Inf";
    s << name << "_bucket{" << prefix << "le=\"" << le << "\"} " << cumulative << "\n";
  }
  if (h.counts.empty()) s << name << "_bucket{" << prefix << "le=\"+Inf\"} " << h.count << "\n";
  s << name << "_sum" << braced << " " << PrometheusNumber(h.sum) << "\n";
  s << name << "_count" << braced << " " << h.count << "\n";
  return s.str();
}

}  // namespace oasis
