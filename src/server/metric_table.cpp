#include "server/metric_table.h"

namespace oasis::server {
namespace {

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kCounter:
      return "counter";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

void RenderMetric(std::ostream& out, const char* name, MetricType type, const char* help,
                  const std::string& labels, const std::vector<MetricSample>& samples) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << TypeName(type) << "\n";
  for (const MetricSample& sample : samples) {
    out << name << "{" << labels;
    if (!sample.label.empty()) out << (labels.empty() ? "" : ",") << sample.label;
    out << "} ";
    if (const int64_t* i = std::get_if<int64_t>(&sample.value)) {
      out << *i;
    } else {
      out << PrometheusNumber(std::get<double>(sample.value));
    }
    out << "\n";
  }
}

}  // namespace oasis::server
