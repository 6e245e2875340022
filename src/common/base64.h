// Standard base64 (RFC 4648, '+' '/', '=' padding): how a handoff ticket travels inside the
// JSON of oasis-server's internal disaggregation fields. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "oasis/status.h"

namespace oasis {

std::string Base64Encode(std::string_view bytes);
// InvalidArgument for a length that is not a multiple of 4, a character outside the
// alphabet, or padding anywhere but at the end.
StatusOr<std::string> Base64Decode(std::string_view text);

}  // namespace oasis
