// Nesting limit for untrusted JSON text (request bodies, upstream answers, file headers):
// checked on the text before any parse, so that no recursive code (dump, copy, conversion,
// template rendering) ever sees a document deep enough to exhaust a thread's stack.
#pragma once

#include <string_view>

namespace oasis {

// The deepest request a client may send: tool schemas and chat_template_kwargs nest a few
// levels, never hundreds.
inline constexpr int kMaxJsonDepth = 256;

// Whether arrays and objects in `text` nest deeper than `max_depth` (brackets inside strings,
// escapes included, do not count). Linear, no allocation; malformed text is left to the parser.
bool JsonNestedDeeperThan(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace oasis
