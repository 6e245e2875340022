// SseParser: events survive any split of the byte stream, all line-end styles, comments,
// multi-line data, a BOM, and a missing final blank line.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "tools/loadgen/sse_parser.h"

using oasis::loadgen::SseEvent;
using oasis::loadgen::SseParser;

namespace {

std::vector<SseEvent> ParseInPieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser parser;
  std::vector<SseEvent> events;
  size_t at = 0;
  for (size_t cut : cuts) {
    parser.Feed(std::string_view(stream).substr(at, cut - at), &events);
    at = cut;
  }
  parser.Feed(std::string_view(stream).substr(at), &events);
  parser.Finish(&events);
  return events;
}

std::vector<std::string> Data(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& e : events) out.push_back(e.data);
  return out;
}

}  // namespace

TEST_CASE("SSE: whole stream at once") {
  const std::string stream =
      "data: {\"a\":1}\n\n: keep-alive comment\n\ndata: {\"b\":2}\n\nevent: error\ndata: x\n\n"
      "data: [DONE]\n\n";
  const auto events = ParseInPieces(stream, {});
  REQUIRE(Data(events) == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "x", "[DONE]"});
  CHECK(events[2].event == "error");
  CHECK(events[0].event.empty());
}

TEST_CASE("SSE: every split point and random splits give the same events") {
  const std::string lf =
      "data: {\"text\":\"h\xC3\xA9llo\"}\n\ndata:no-space\n\ndata: l1\ndata: l2\n\n"
      "id: 7\nretry: 10\ndata: [DONE]\n\n";
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  std::string cr;
  for (char c : lf) cr += c == '\n' ? '\r' : c;
  const std::vector<std::string> expected = {"{\"text\":\"h\xC3\xA9llo\"}", "no-space", "l1\nl2",
                                             "[DONE]"};
  for (const std::string* stream : std::vector<const std::string*>{&lf, &crlf, &cr}) {
    CAPTURE(*stream);
    CHECK(Data(ParseInPieces(*stream, {})) == expected);
    for (size_t cut = 0; cut <= stream->size(); ++cut) {
      CAPTURE(cut);
      REQUIRE(Data(ParseInPieces(*stream, {cut})) == expected);
    }
    // Byte at a time.
    std::vector<size_t> all;
    for (size_t i = 1; i < stream->size(); ++i) all.push_back(i);
    CHECK(Data(ParseInPieces(*stream, all)) == expected);
    std::mt19937 rng(std::random_device{}());
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      for (size_t i = 1; i < stream->size(); ++i) {
        if (rng() % 4 == 0) cuts.push_back(i);
      }
      REQUIRE(Data(ParseInPieces(*stream, cuts)) == expected);
    }
  }
}

TEST_CASE("SSE: CRLF split between CR and LF is one line end, not two") {
  // If the '\n' after a split "\r" were taken as a second (blank) line, "a" and "b" would
  // become two events.
  const std::string stream = "data: a\r\ndata: b\r\n\r\n";
  const auto events = ParseInPieces(stream, {8});
  REQUIRE(Data(events) == std::vector<std::string>{"a\nb"});
}

TEST_CASE("SSE: a byte-order mark is skipped, even split") {
  const std::string stream =
      "\xEF\xBB\xBF"
      "data: x\n\n";
  for (size_t cut = 0; cut <= 4; ++cut) {
    CHECK(Data(ParseInPieces(stream, {cut})) == std::vector<std::string>{"x"});
  }
  CHECK(Data(ParseInPieces("\xEF\xBB", {})).empty());  // a lone partial BOM is no event
}

TEST_CASE("SSE: Finish dispatches a last event without its blank line") {
  CHECK(Data(ParseInPieces("data: a\n\ndata: b", {})) == std::vector<std::string>{"a", "b"});
  CHECK(Data(ParseInPieces("data: a\n\ndata: b\n", {})) == std::vector<std::string>{"a", "b"});
  // Comments and empty streams yield nothing.
  CHECK(ParseInPieces(": ping\n\n", {}).empty());
  CHECK(ParseInPieces("", {}).empty());
}

TEST_CASE("SSE: empty data line is an event with empty data") {
  const auto events = ParseInPieces("data:\n\ndata\n\n", {});
  REQUIRE(events.size() == 2);
  CHECK(events[0].data.empty());
  CHECK(events[1].data.empty());
}
