// Prometheus text rendered from a table: one MetricRow per metric (name, type, help and an
// accessor reading its value(s) from a stats snapshot), rendered in the table's order with
// the same labels on every series. /metrics renders EngineStats and the staging pool's stats
// this way (metrics.cpp). Rows are constant data (constexpr-constructible); thread-safe.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "common/histogram.h"

namespace oasis::server {

enum class MetricType { kGauge, kCounter, kHistogram };

// One series of a labelled metric: its own label (`phase="step"`, added after the common
// labels) and its value (a double is written with 17 significant digits, an integer as is).
struct MetricSample {
  std::string label;
  std::variant<double, int64_t> value;
};

template <class Stats>
struct MetricRow {
  using ValueFn = double (*)(const Stats&);
  using SeriesFn = std::vector<MetricSample> (*)(const Stats&);
  using HistogramFn = const Histogram& (*)(const Stats&);

  // A gauge or counter with one series.
  constexpr MetricRow(const char* name, MetricType type, const char* help, ValueFn value)
      : name(name), type(type), help(help), value(value) {}
  // A gauge or counter with one series per sample (zero or more).
  constexpr MetricRow(const char* name, MetricType type, const char* help, SeriesFn series)
      : name(name), type(type), help(help), series(series) {}
  // A histogram.
  constexpr MetricRow(const char* name, const char* help, HistogramFn histogram)
      : name(name), type(MetricType::kHistogram), help(help), histogram(histogram) {}

  const char* name;
  MetricType type;
  const char* help;
  ValueFn value = nullptr;  // exactly one of the three is set
  SeriesFn series = nullptr;
  HistogramFn histogram = nullptr;
};

// HELP, TYPE and one line per sample: `name{labels[,sample.label]} value`.
void RenderMetric(std::ostream& out, const char* name, MetricType type, const char* help,
                  const std::string& labels, const std::vector<MetricSample>& samples);

// Every row of `table` for `stats`, in order; `labels` (`model_name="m"`) on every series.
template <class Stats>
std::string RenderMetricTable(std::span<const MetricRow<Stats>> table, const Stats& stats,
                              const std::string& labels) {
  std::ostringstream s;
  for (const MetricRow<Stats>& row : table) {
    if (row.histogram != nullptr) {
      s << RenderHistogram(row.name, row.help, row.histogram(stats), labels);
    } else if (row.value != nullptr) {
      RenderMetric(s, row.name, row.type, row.help, labels, {{"", row.value(stats)}});
    } else {
      RenderMetric(s, row.name, row.type, row.help, labels, row.series(stats));
    }
  }
  return s.str();
}

}  // namespace oasis::server
