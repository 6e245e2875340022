// Errors carry line:column, and the sandbox bounds every way a template could hang, exhaust
// memory or overflow the stack.
#include "jinja_test_util.h"

#include <thread>
#include <vector>

using oasis::ChatTemplate;
using oasis::StatusCode;
using oasis::jinja_test::Render;
using oasis::jinja_test::RenderError;
using json = nlohmann::ordered_json;

namespace {
std::string ParseError(const std::string& source) {
  auto t = ChatTemplate::Parse(source);
  INFO("template: " << source);
  REQUIRE_FALSE(t.ok());
  return t.status().message();
}
bool Has(const std::string& haystack, const std::string& needle) {
  INFO(haystack << " should contain " << needle);
  return haystack.find(needle) != std::string::npos;
}
}  // namespace

TEST_CASE("syntax errors report line:column", "[jinja][errors]") {
  CHECK(Has(ParseError("ok\n{{ 1 + }}"), "2:8: unexpected '}}'"));
  CHECK(Has(ParseError("{% if x %}\nno end"), "unexpected end of template, expected 'elif' or 'else' or 'endif'"));
  CHECK(Has(ParseError("{% for x in y %}{% endif %}"), "1:20: unexpected tag 'endif'"));
  CHECK(Has(ParseError("{% bogus %}"), "1:4: unknown tag 'bogus'"));
  CHECK(ChatTemplate::Parse("{% include 'x' %}").status().code() == StatusCode::kUnimplemented);
  CHECK(Has(ParseError("{{ 'unterminated }}"), "1:4"));
  CHECK(Has(ParseError("{# never closed"), "Missing end of comment tag"));
  CHECK(Has(ParseError("{{ (1 }}"), "unexpected '}'"));
  CHECK(Has(ParseError("{{ 1 ]}}"), "unexpected ']'"));
  CHECK(Has(ParseError("{{ a.}}"), "a name or number"));
  CHECK(Has(ParseError("{{ 'a' $ }}"), "unexpected char '$'"));
  CHECK(Has(ParseError("{{ 99999999999999999999 }}"), "too large"));
  CHECK(Has(ParseError("{{ '\\x4' }}"), "truncated"));
  CHECK(Has(ParseError("{{ '\\N{DASH}' }}"), "malformed \\N"));
  CHECK(Has(ParseError("{% set %}"), "1:8"));
  CHECK(Has(ParseError("{% endfor %}"), "unexpected tag 'endfor'"));
  CHECK(Has(ParseError("{% raw %}never"), "Missing end of raw directive"));
}

TEST_CASE("render errors report line:column of the failing node", "[jinja][errors]") {
  CHECK(Has(RenderError("a\nb {{ x.y }}"), "2:7: 'x' is undefined"));
  CHECK(Has(RenderError("{% for a in 3 %}{% endfor %}"), "1:13: 'int' object is not iterable"));
  CHECK(Has(RenderError("\n\n   {{ 1 + 'a' }}"), "3:9: unsupported operand"));
  CHECK(RenderError("{{ raise_exception('nope') }}").size() > 0);
  auto st = oasis::jinja_test::TryRender("{{ raise_exception('nope') }}").status();
  CHECK(st.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("sandbox: iteration, output, value size and depth limits", "[jinja][errors]") {
  ChatTemplate::RenderOptions small;
  small.max_iterations = 1000;
  small.max_output_bytes = 4096;
  small.max_call_depth = 8;
  CHECK(Has(RenderError("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", json::object(), small),
            "iteration limit"));
  CHECK(Has(RenderError("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", json::object(), small), "exceeds 4096 bytes"));
  CHECK(Has(RenderError("{{ 'x' * 100000 }}", json::object(), small), "exceeds"));
  CHECK(Has(RenderError("{{ 'x' * 9223372036854775807 }}", json::object(), small), "exceeds"));
  CHECK(Has(RenderError("{{ [1, 2] * 9223372036854775807 }}", json::object(), small), "too large"));
  CHECK(Has(RenderError("{{ range(1000000)|list }}"), "Range too big"));
  CHECK(Has(RenderError("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", json::object(), small), "call depth"));
  CHECK(Has(RenderError("{{ 2 ** 200 }}"), "overflow"));
  // Deep nesting is a parse error, not a stack overflow.
  CHECK(Has(ParseError("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "nested too deeply"));
  CHECK(Has(ParseError("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"), "nested too deeply"));
  CHECK(Has(ParseError("{{ " + std::string(3000, '-') + "1 }}"), "nested too deeply"));
  // Chains built in a loop (left-deep trees) count too: 100,000 links of each kind are refused
  // (they overflowed the stack when evaluated or destroyed), 100 links render.
  auto chain = [](const std::string& head, const std::string& link, int n) {
    std::string t = "{{ " + head;
    for (int i = 0; i < n; ++i) t += link;
    return t + " }}";
  };
  const std::vector<std::pair<std::string, std::string>> chains = {
      {"1", "|string"}, {"x", ".y"}, {"x", "[0]"}, {"range", "(1)"}, {"1", " + 1"}, {"'a'", " ~ 'a'"},
      {"1", " and 1"},  {"0", " or 0"}, {"2", " * 1"}, {"1", " if 1 else 0"}};
  for (const auto& [head, link] : chains) {
    INFO(head << link);
    CHECK(Has(ParseError(chain(head, link, 100000)), "nested too deeply"));
  }
  CHECK(oasis::jinja_test::TryRender(chain("1", "|string", 100), json::object()).ok());
  CHECK(oasis::jinja_test::TryRender(chain("1", " + 1", 100), json::object()).ok());
  CHECK(Has(ParseError("{% filter " + std::string("upper|") + [] {
              std::string f;
              for (int i = 0; i < 100000; ++i) f += "lower|";
              return f;
            }() + "upper %}x{% endfilter %}"),
            "nested too deeply"));
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if true %}";
  CHECK(Has(ParseError(ifs), "nested too deeply"));
  // Values nested deeper than the limit cannot be built.
  json deep = json::array();
  for (int i = 0; i < 400; ++i) deep = json::array({deep});
  CHECK_FALSE(oasis::jinja_test::TryRender("{{ x }}", {{"x", deep}}).ok());
  // Namespaces cannot be made to contain themselves.
  CHECK(Has(RenderError("{% set ns = namespace() %}{% set ns.me = [ns] %}"), "namespace"));
}

TEST_CASE("a parsed template renders concurrently", "[jinja]") {
  auto tmpl = ChatTemplate::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}{{ ns.n }}");
  REQUIRE(tmpl.ok());
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        json ctx = {{"messages", {{{"content", std::to_string(t)}}, {{"content", "x"}}}}};
        auto out = tmpl->Render(ctx);
        if (out.ok() && *out == std::to_string(t) + "x2") ++ok[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) CHECK(ok[t] == 200);
}
