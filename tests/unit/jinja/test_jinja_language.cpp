// The Jinja subset, feature by feature. Every expected string below is what Python Jinja2 3.1
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols) renders.
#include "jinja_test_util.h"

using oasis::jinja_test::Render;
using oasis::jinja_test::RenderError;
using json = nlohmann::ordered_json;

TEST_CASE("literals and printing follow Python str()", "[jinja]") {
  CHECK(Render("{{ none }}|{{ 1.0 }}|{{ 1e20 }}|{{ [1,'a',none,true, 2.5] }}|{{ {'a':1} }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1/3 }}") ==
        "None|1.0|1e+20|[1, 'a', None, True, 2.5]|{'a': 1}|1e+16|0.0001|0.3333333333333333");
  CHECK(Render("{{ 0.1 + 0.2 }}{{ 1e-5 }}{{ 123456789012345678.0 }}{{ 1e15 }}{{ -0.0 }}") ==
        "0.300000000000000041e-051.2345678901234568e+171000000000000000.0-0.0");
  CHECK(Render("{{ {'a': none} }}{{ none|string }}{{ true|string }}") == "{'a': None}NoneTrue");
  CHECK(Render(R"({{ ['a\'b', "x'y", 'q"', '\n'] }})") == R"(["a'b", "x'y", 'q"', '\n'])");
  CHECK(Render("{{ 'a\\nb' }}|{{ '\\u00e9' }}|{{ '\\x41' }}|{{ '\\d' }}") == "a\nb|\xC3\xA9|A|\\d");
  CHECK(Render("{{ 1 if true else 2 }}{{ (1, 2) }}{{ 'a' 'b' }}") == "1(1, 2)ab");
  CHECK(Render("{{ 0x1F }}{{ 1_000 }}{{ 0b11 }}{{ 0o17 }}") == "311000315");
}

TEST_CASE("whitespace control, trim_blocks and lstrip_blocks", "[jinja]") {
  CHECK(Render("  {% if true %}\n  x\n  {% endif %}\n  y  {# c #}\n  z\n") == "  x\n  y    z");
  CHECK(Render("a  {%- if true -%}  b  {%- endif %}\n c {{- 'd' -}} \n e") == "ab cde");
  CHECK(Render("{{ 'a' }}\n{{ 'b' }}\n") == "a\nb");
  CHECK(Render("{%+ if true %}x{% endif %}") == "x");
  CHECK(Render("  {%+ if true %}x{% endif %}") == "  x");
  CHECK(Render("line\r\nnext\rlast\n\n") == "line\nnext\nlast\n");
  CHECK(Render("{% raw %}{{ not evaluated }}{% endraw %}") == "{{ not evaluated }}");
  CHECK(Render("a\n  {#- comment -#}\n  b") == "ab");
  CHECK(Render("{% generation %}kept{% endgeneration %}") == "kept");
}

TEST_CASE("undefined behaves like Jinja2's default Undefined", "[jinja]") {
  CHECK(Render("{{ x }}|{{ x | length }}{{ x|trim }}|{% for a in x %}a{% endfor %}") == "|0|");
  CHECK(Render("{{ x == x }}{{ x is none }}{{ x is defined }}{{ x is undefined }}") == "TrueFalseFalseTrue");
  CHECK(Render("{{ x.y }}", {{"x", json::object()}}) == "");
  CHECK(Render("{{ x.y }}", {{"x", nullptr}}) == "");
  CHECK(Render("{{ [1,2,3][5] }}|") == "|");
  CHECK(Render("{{ 'a' ~ 1 ~ none ~ x }}") == "a1None");
  CHECK(RenderError("{{ x.y }}").find("'x' is undefined") != std::string::npos);
  CHECK(RenderError("{{ x + 'a' }}").find("'x' is undefined") != std::string::npos);
  CHECK(RenderError("{{ x.y.z }}", {{"x", json::object()}}).find("has no attribute 'y'") != std::string::npos);
  CHECK(RenderError("{{ x.startswith('a') }}", {{"x", nullptr}}).size() > 0);
}

TEST_CASE("scoping: loops get a fresh scope per iteration, if does not", "[jinja]") {
  CHECK(Render("{% for i in [1,2,3] %}[{{ x }}]{% set x = i %}{% endfor %}|{{ x }}") == "[][][]|");
  CHECK(Render("{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}|{{ x }}") == "[5][5]|5");
  CHECK(Render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}") == "3");
  CHECK(Render("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}") == "4");
  CHECK(Render("{{ ns }}{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}{{ ns.b }}") == "2");
  CHECK(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}") == "21");
  CHECK(Render("{% set x %}abc{% endset %}{{ x|upper }}") == "ABC");
  CHECK(Render("{% set x | upper %}abc{% endset %}{{ x }}") == "ABC");
}

TEST_CASE("for loops: loop variable, filtering, else, break/continue, unpacking", "[jinja]") {
  CHECK(Render("{% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }} {% endfor %}") ==
        "1/2False 2/2True ");
  CHECK(Render("{% for x in 'abc' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{% endfor %}") ==
        "032True121False210False");
  CHECK(Render("{% for i in [1,2] %}{% for j in [3] %}{{ loop.index }}{{ i }}{% endfor %}{% endfor %}") == "1112");
  CHECK(Render("{% for i in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(Render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}") == "02");
  CHECK(Render("{% for a, b in {'x': 1}|items %}{{a}}={{b}}{% endfor %}") == "x=1");
  CHECK(Render("{% for a in {'x': 1, 'y': 2} %}{{a}}{% endfor %}") == "xy");
  CHECK(Render("{% for k, v in d.items() %}{{k}}{{v}}{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}) == "b1a2");
  CHECK(Render("{% for m in messages[::-1] %}{{ m }}{% endfor %}", {{"messages", {1, 2, 3}}}) == "321");
  CHECK(Render("{% for i in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem }}{% endfor %}") == "False2True");
  CHECK(RenderError("{% for m in x %}a{% endfor %}", {{"x", nullptr}}).find("not iterable") != std::string::npos);
  CHECK(RenderError("{{ loop }}{% break %}").find("outside of a loop") != std::string::npos);
}

TEST_CASE("operators and precedence", "[jinja]") {
  CHECK(Render("{{ 7 // -2 }} {{ 7 % -3 }} {{ -7 / 2 }} {{ 2 ** 10 }} {{ 2**0.5 }} {{ 10 / 2 }}") ==
        "-4 -2 -3.5 1024 1.4142135623730951 5.0");
  CHECK(Render("{{ -2|abs }}{{ -(2) }}{{ 2**3**2 }}{{ -2**2 }}") == "2-2644");
  CHECK(Render("{{ true + 1 }}{{ 1 == 1.0 }}{{ true == 1 }}") == "2TrueTrue");
  CHECK(Render("{{ 1 == 1 == 1 }}{{ 1 < 2 < 3 }}{{ not 1 == 2 }}{{ 3 > 2 > 2 }}") == "TrueTrueTrueFalse");
  CHECK(Render("{{ 'x' in 'xyz' }}{{ 1 in [1] }}{{ 'a' in {'a':1} }}{{ 'b' not in {'a':1} }}") == "TrueTrueTrueTrue");
  CHECK(Render("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ [1] + [2] }}{{ 'a' ~ [1] }}") == "ababab[1, 1][1, 2]a[1]");
  CHECK(Render("{{ 0 or 'x' }}{{ 1 and 'y' }}{{ '' and 'z' }}{{ none or [] }}") == "xy[]");
  CHECK(Render("{{ messages|length - 1 }}", {{"messages", {1, 2, 3}}}) == "2");
  CHECK(Render("{{ 3 // 2.0 }}{{ -3 // 2 }}{{ 5.5 % 2 }}") == "1.0-21.5");
  CHECK(Render("{{ 'x' if false }}|") == "|");
  CHECK(RenderError("{{ 'a' + 1 }}").find("can only concatenate str") != std::string::npos);
  CHECK(RenderError("{{ 1 < 'a' }}").find("'<' not supported") != std::string::npos);
  CHECK(RenderError("{{ 3 % 0 }}").find("zero") != std::string::npos);
  CHECK(RenderError("{{ 9223372036854775807 + 1 }}").find("overflow") != std::string::npos);
}

TEST_CASE("attribute, subscript and slicing", "[jinja]") {
  json ctx = {{"d", {{"items", 1}, {"a", {{"b", "c"}}}}}, {"l", {10, 20, 30, 40}}};
  CHECK(Render("{{ d['items'] }}{{ d.a.b }}{{ d['a']['b'] }}{{ l[-1] }}{{ l.1 }}", ctx) == "1cc4020");
  CHECK(Render("{{ d.items is callable }}", ctx) == "True");  // getattr finds the method first
  CHECK(Render("{{ 'abc'[::-1] }}{{ 'h\xC3\xA9llo'|length }}{{ 'h\xC3\xA9llo'[1] }}") == "cba5\xC3\xA9");
  CHECK(Render("{{ [1,2,3][1:] }}{{ [1,2,3][:-1] }}{{ 'hello'[1:4:2] }}{{ [1,2,3,4][::-2] }}") == "[2, 3][1, 2]el[4, 2]");
  CHECK(Render("{{ l[10:] }}{{ l[-10:1] }}{{ l[3:0:-1] }}", ctx) == "[][10][40, 30, 20]");
  CHECK(Render("{{ messages[1:] | length }}", {{"messages", {1, 2, 3}}}) == "2");
  CHECK(Render("{{ 'abc'.foo }}|{{ [1].foo }}|{{ [1,2].append }}") == "||");
  CHECK(RenderError("{{ [1,2].append(3) }}").find("unsafe") != std::string::npos);
  CHECK(RenderError("{{ l[::0] }}", ctx).find("zero") != std::string::npos);
}

TEST_CASE("string methods", "[jinja]") {
  CHECK(Render("{{ 'a,b,,c'.split(',') }}{{ 'a b  c'.split(' ', 1) }}{{ 'abc'.rsplit('b') }}") ==
        "['a', 'b', '', 'c']['a', 'b  c']['a', 'c']");
  CHECK(Render("{{ ' a  b '.split() }}{{ 'a b c'.rsplit(none, 1) }}{{ 'x=1=2'.rsplit('=', 1) }}") ==
        "['a', 'b']['a b', 'c']['x=1', '2']");
  CHECK(Render("{{ '  x '.strip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'xyx'.rstrip('x') }}") == "x|x\n|xy");
  CHECK(Render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}") == "TrueTrueTrue");
  CHECK(Render("{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}") ==
        "Hello WorldHelloABab");
  CHECK(Render("{{ 'aaa'.replace('a', 'b', 2) }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.count('b') }}") == "bba132");
  CHECK(Render("{{ ', '.join(['a', 'b']) }}{{ '{} and {name}'.format(1, name='x') }}") == "a, b1 and x");
  CHECK(Render("{{ '\xC3\xA9'.upper() }}") == "\xC3\x89");
  CHECK(Render("{{ 'a b x  y '.split(none, 1) }}{{ ' a b '.rsplit(none, 1) }}") == "['a', 'b x  y '][' a', 'b']");
  CHECK(Render("{{ 'a\\nb'.splitlines() }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}") == "['a', 'b']TrueTrue");
}

TEST_CASE("dict methods", "[jinja]") {
  json ctx = {{"d", {{"b", 1}, {"a", 2}}}};
  CHECK(Render("{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 7) }}", ctx) ==
        "['b', 'a'][1, 2]2None7");
  CHECK(Render("{{ d.items()|list }}{{ (1,) }}{{ (1, 2) == [1, 2] }}", ctx) == "[('b', 1), ('a', 2)](1,)False");
}

TEST_CASE("filters", "[jinja]") {
  CHECK(Render("{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ [1,2]|sum }}{{ 'Hello World'|wordcount }}") ==
        "[1, 2, 3]['A', 'a', 'b']32");
  CHECK(Render("{{ [1,2,3]|first }}{{ 'abc'|last }}{{ [3,1]|max }}{{ [1,1,2]|unique|list }}{{ {'b':1,'a':2}|dictsort }}") ==
        "1c3[1, 2][('a', 2), ('b', 1)]");
  CHECK(Render("{{ 'hello world-foo'|title }}{{ 'hELLO'|capitalize }}{{ 'x'|indent(2) }}|{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}") ==
        "Hello World-FooHellox|a\n  b\n\n  c|  a\n  b");
  CHECK(Render("{{ 'a\\nb\\n'|indent(2) }}|{{ ''|indent }}|{{ 'x'|indent(first=true) }}") == "a\n  b\n||    x");
  CHECK(Render("{{ '<a&\"\\'>'|escape }}") == "&lt;a&amp;&#34;&#39;&gt;");
  CHECK(Render("{{ 1.5|int }}{{ '1.5'|float }}{{ 5|string }}{{ [1]|string }}{{ none|default('d') }}{{ x|default('d') }}{{ ''|default('d', true) }}") ==
        "11.55[1]Nonedd");
  CHECK(Render("{{ ' 3 '|int }}{{ '3.7'|int }}{{ 'x'|float }}{{ '1e3'|float }}{{ none|int }}{{ true|int }}") == "330.01000.001");
  CHECK(Render("{{ 3.0|int }}{{ '3'|int }}{{ 'x'|int }}{{ 2.5|round }}{{ 3.5|round }}{{ 2.567|round(2) }}{{ -3|abs }}") ==
        "3302.04.02.573");
  CHECK(Render("{{ 1234.5|round(-2) }}{{ 1250|round(-2) }}") == "1200.01200");
  CHECK(Render("{{ 2.5|round }}{{ 2.675|round(2) }}{{ 2.1|round(method='ceil') }}{{ 7|round }}") == "2.02.673.07");
  CHECK(Render("{{ [3,2,1]|map('string')|list }}{{ ['a','b']|map('upper')|join }}{{ [{'a':1},{}]|map(attribute='a')|list }}{{ [{'a':1},{}]|map(attribute='a', default=0)|list }}") ==
        "['3', '2', '1']AB[1, Undefined][1, 0]");
  CHECK(Render("{{ [1, 2, 3]|select('odd')|list }}{{ [{'a':1},{'a':2}]|map(attribute='a')|join(',') }}{{ [{'a':1},{'b':2}]|selectattr('a','defined')|list }}") ==
        "[1, 3]1,2[{'a': 1}]");
  CHECK(Render("{{ [1,2,3]|select('>', 1)|list }}{{ [1,0,2]|select|list }}{{ [{'r':'a'},{'r':'b'}]|rejectattr('r','equalto','a')|list }}{{ [{'r':'a'},{'r':'b'}]|selectattr('r')|list }}") ==
        "[2, 3][1, 2][{'r': 'b'}][{'r': 'a'}, {'r': 'b'}]");
  CHECK(Render("{{ ['a', 'code_interpreter', 'b']|reject('equalto', 'code_interpreter')|join(', ') }}") == "a, b");
  CHECK(Render("{{ [1,2,3]|min }}{{ []|max }}|{{ ['B','a']|max }}{{ ['B','a']|sort }}{{ ['b','A','a','B']|unique|list }}") ==
        "1|B['a', 'B']['b', 'A']");
  CHECK(Render("{{ {'b':1,'A':2}|dictsort }}{{ [1,2.5]|sum }}{{ [[1],[2]]|sum(start=[]) }}") == "[('A', 2), ('b', 1)]3.5[1, 2]");
  CHECK(Render("{{ 'foo bar_baz, qux9'|wordcount }}{{ 'abc'|reverse }}{{ {'a':1}|reverse|list }}") == "3cba['a']");
  CHECK(Render("{{ 'AbC'|lower }}{{ [1,2]|reverse|list }}{{ [1,2]|length }}{{ 'a b c'|wordcount }}") == "abc[2, 1]23");
  CHECK(Render("{{ ['b','a']|sort(reverse=true) }}{{ [{'n':2},{'n':1}]|sort(attribute='n') }}") == "['b', 'a'][{'n': 1}, {'n': 2}]");
  CHECK(Render("{{ [1,'a']|join('-') }}{{ [1,2]|join }}{{ 'abc'|join('.') }}") == "1-a12a.b.c");
  CHECK(Render("{{ 'abc'|replace('b', 'X') }}{{ '  x  '|trim }}{{ 'xxaxx'|trim('x') }}") == "aXcxa");
  CHECK(Render("{{ d|items|list }}", {{"d", {{"a", 1}}}}) == "[('a', 1)]");
  CHECK(Render("{{ x|items|list }}{{ x|list }}") == "[][]");
  CHECK(RenderError("{{ 1|nosuchfilter }}").find("No filter named 'nosuchfilter'") != std::string::npos);
}

TEST_CASE("tojson matches transformers' json.dumps override", "[jinja]") {
  json ctx = {{"v", {{"a", "\xC3\xA9\n\"\\\t\x01"}, {"b", {1, 2.0, nullptr, true}}, {"c", json::object()}, {"d", json::array()}}}};
  CHECK(Render("{{ v|tojson }}", ctx) ==
        "{\"a\": \"\xC3\xA9\\n\\\"\\\\\\t\\u0001\", \"b\": [1, 2.0, null, true], \"c\": {}, \"d\": []}");
  CHECK(Render("{{ v.b|tojson(indent=2) }}", ctx) == "[\n  1,\n  2.0,\n  null,\n  true\n]");
  CHECK(Render("{{ {'x': {'y': [1]}}|tojson(indent=4) }}") == "{\n    \"x\": {\n        \"y\": [\n            1\n        ]\n    }\n}");
  CHECK(Render("{{ {'b': 1, 'a': [1, 2]}|tojson(separators=(',', ':'), sort_keys=true) }}") == "{\"a\":[1,2],\"b\":1}");
  CHECK(Render("{{ '\xC3\xA9'|tojson(ensure_ascii=true) }}{{ 'x'|tojson }}{{ 1e21|tojson }}{{ 0.1|tojson }}") ==
        "\"\\u00e9\"\"x\"1e+210.1");
  CHECK(RenderError("{{ x|tojson }}").find("not JSON serializable") != std::string::npos);
}

TEST_CASE("tests (is ...)", "[jinja]") {
  CHECK(Render("{{ 'a' is string }}{{ none is none }}{{ {} is mapping }}{{ 'x' is iterable }}{{ 3 is number }}{{ true is number }}{{ true is integer }}{{ 3 is odd }}{{ x is undefined }}") ==
        "TrueTrueTrueTrueTrueTrueFalseTrueTrue");
  CHECK(Render("{{ x is iterable }}{{ x is sequence }}{{ x is mapping }}{{ x is string }}{{ none is iterable }}{{ x is none }}") ==
        "TrueTrueFalseFalseFalseFalse");
  CHECK(Render("{{ 3 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ x is not defined }}{{ 3.0 is odd }}{{ 4 is even }}") ==
        "TrueTrueTrueTrueTrue");
  CHECK(Render("{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 1.5 is float }}{{ none is sameas none }}{{ 'ab' is lower }}") ==
        "TrueFalseTrueTrueTrueTrue");
  CHECK(Render("{{ 2 is in [1, 2] }}{{ 1 is lt 2 }}{{ 2 is ge 2 }}{{ 1 is ne 1 }}") == "TrueTrueTrueFalse");
  CHECK(RenderError("{{ 1 is nosuchtest }}").find("No test named") != std::string::npos);
}

TEST_CASE("macros", "[jinja]") {
  CHECK(Render("{% macro f(a, b='d') %}<{{a}}{{b}}{{ c }}>{% endmacro %}{% set c = 9 %}{{ f(1) }}{{ f(1, b=2) }}") == "<1d9><129>");
  CHECK(Render("{% macro f(x) %}{% for i in x %}{{ i }}{% endfor %}{% endmacro %}{% for j in [1] %}{{ f([j, 2]) }}{% endfor %}") == "12");
  CHECK(Render("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}") == "321");
  CHECK(RenderError("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}").find("takes not more than") != std::string::npos);
}

TEST_CASE("filter blocks, globals and raise_exception", "[jinja]") {
  CHECK(Render("{% filter upper %}abc{{ 'd' }}{% endfilter %}") == "ABCD");
  CHECK(Render("{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}{{ dict(a=1) }}") ==
        "[0, 1, 2][1, 3, 5][3, 2, 1]{'a': 1}");
  CHECK(Render("{% set ns = namespace({'x': 1}, y=2) %}{{ ns.x }}{{ ns.y }}") == "12");
  std::string err = RenderError("line one\n  {{ raise_exception('boom: ' ~ 42) }}");
  CHECK(err.find("2:") != std::string::npos);
  CHECK(err.size() >= 10);
  CHECK(err.substr(err.size() - 10) == ": boom: 42");
  oasis::ChatTemplate::RenderOptions fixed;
  fixed.now = std::chrono::system_clock::from_time_t(86400 * 365);
  auto out = oasis::jinja_test::TryRender("{{ strftime_now('%Y') }}", json::object(), fixed);
  REQUIRE(out.ok());
  CHECK((*out == "1971" || *out == "1970"));  // local time zone
}

TEST_CASE("context values convert from JSON keeping key order", "[jinja]") {
  json ctx = json::parse(R"({"m": {"z": 1, "a": 2, "m": [1.5, -3, 18446744073709551615, null, false]}})");
  CHECK(Render("{{ m }}|{{ m|tojson }}", ctx) ==
        "{'z': 1, 'a': 2, 'm': [1.5, -3, 1.8446744073709552e+19, None, False]}|"
        "{\"z\": 1, \"a\": 2, \"m\": [1.5, -3, 1.8446744073709552e+19, null, false]}");
  CHECK(Render("{{ 'x' }}", ctx) == "x");
  CHECK_FALSE(oasis::jinja_test::TryRender("x", json::array()).ok());
}
