// Histogram: buckets (upper bounds inclusive), and its Prometheus text with and without labels.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "common/histogram.h"

using namespace oasis;

TEST_CASE("histogram buckets and exposition", "[common][histogram]") {
  Histogram h = Histogram::WithBounds({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.Observe(v);
  CHECK(h.counts == std::vector<int64_t>{2, 1, 1});
  CHECK(h.count == 4);
  CHECK(h.sum == Approx(3.65));

  const std::string labelled = RenderHistogram("x_seconds", "X.", h, "model_name=\"m\"");
  CHECK(labelled.find("# HELP x_seconds X.\n# TYPE x_seconds histogram\n") == 0);
  // `le` is the shortest text that reads back as the bound (never 0.10000000000000001).
  CHECK(labelled.find("x_seconds_bucket{model_name=\"m\",le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(labelled.find("x_seconds_bucket{model_name=\"m\",le=\"1\"} 3\n") != std::string::npos);
  CHECK(labelled.find("x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(labelled.find("x_seconds_count{model_name=\"m\"} 4\n") != std::string::npos);

  const std::string bare = RenderHistogram("x_seconds", "X.", h, "", 15);
  CHECK(bare.find("x_seconds_bucket{le=\"0.1\"} 2\n") != std::string::npos);
  CHECK(bare.find("x_seconds_bucket{le=\"+Inf\"} 4\n") != std::string::npos);
  CHECK(bare.find("x_seconds_count 4\n") != std::string::npos);
  CHECK(bare.find("x_seconds_sum 3.") != std::string::npos);
  // Shortest round-trip text; explicit digits still honoured.
  CHECK(PrometheusNumber(0.005) == "0.005");
  CHECK(PrometheusNumber(1.4) == "1.4");
  CHECK(PrometheusNumber(2560.0) == "2560");
  CHECK(PrometheusNumber(7680.0) == "7680");
  CHECK(PrometheusNumber(1e20) == "1e+20");
  CHECK(PrometheusNumber(1.0 / 3.0) == "0.3333333333333333");
  CHECK(std::strtod(PrometheusNumber(0.1 + 0.2).c_str(), nullptr) == 0.1 + 0.2);
  CHECK(PrometheusNumber(0.1 + 0.2) == "0.30000000000000004");
  CHECK(PrometheusNumber(1e-300) == "1e-300");
  CHECK(PrometheusNumber(0.1, 17) == "0.10000000000000001");

  // Never initialised (a default EngineStats): one +Inf bucket with the count.
  const std::string empty = RenderHistogram("y", "Y.", Histogram{}, "a=\"b\"");
  CHECK(empty.find("y_bucket{a=\"b\",le=\"+Inf\"} 0\n") != std::string::npos);
}
