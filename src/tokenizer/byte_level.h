// GPT-2's reversible byte <-> printable-character map used by ByteLevel pre-tokenizers and
// decoders ("Ġ" is the space byte 0x20). Immutable tables built once; thread-safe.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace oasis::tokenizer {

// The UTF-8 encoding of the character that stands for each byte.
const std::array<std::string, 256>& ByteLevelAlphabet();

// Maps a byte-level token ("Ġthe") back to the raw bytes it stands for (" the"); nullopt when a
// character of `token` is not in the alphabet (an added token such as "<|im_start|>" is made of
// alphabet characters only, so it maps to itself).
std::optional<std::string> ByteLevelToBytes(std::string_view token);

// The byte-level form of raw bytes (" the" -> "Ġthe").
std::string BytesToByteLevel(std::string_view bytes);

}  // namespace oasis::tokenizer
