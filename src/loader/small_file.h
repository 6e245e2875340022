// Reading the small JSON files of a model directory (config.json, generation_config.json,
// model.safetensors.index.json, tokenizer.json, tokenizer_config.json) safely: only a regular
// file (after following symlinks) of at most a cap is read. A directory, a FIFO (which would
// block forever), a device such as /dev/zero (endless) or a file past the cap is an error
// naming the path, never a hang or an out-of-memory abort. Plain functions; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "oasis/status.h"

namespace oasis {

// Caps far above any real file: Hub config.json files are a few KB, generation configs and
// indexes well under 1 MiB; the largest tokenizer.json files on the Hub are tens of MB.
inline constexpr uint64_t kMaxConfigJsonBytes = uint64_t{16} << 20;  // 16 MiB
// model.safetensors.index.json: about 100 bytes per tensor (DeepSeek-V3's ~90k tensors: 9 MB).
inline constexpr uint64_t kMaxIndexJsonBytes = uint64_t{64} << 20;       // 64 MiB
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{256} << 20;  // 256 MiB

// OK when `path` names a regular file (symlinks followed) of at most `max_bytes`; else
// NotFound (missing), InvalidArgument ("is a directory", "is not a regular file", "is N bytes,
// more than the cap"). `what` names the file's role in errors ("model config").
Status CheckSmallFile(const std::filesystem::path& path, const std::string& what,
                      uint64_t max_bytes);

// The whole file, after CheckSmallFile (and reading at most `max_bytes` + 1 bytes, should it
// have grown since).
StatusOr<std::string> ReadSmallFile(const std::filesystem::path& path, const std::string& what,
                                    uint64_t max_bytes);

// The tokenizer file a --tokenizer flag names (oasis-server, oasis-generate): `flag_value` when
// given (a directory means its tokenizer.json), else `model_dir`/tokenizer.json. A given path
// that does not exist is NotFound ("--tokenizer: no PATH"); the file found is checked as
// CheckSmallFile does (at most kMaxTokenizerJsonBytes). Returns "" when nothing was given and
// the model directory has no tokenizer.json (token ids only).
StatusOr<std::filesystem::path> ResolveTokenizerFile(const std::filesystem::path& model_dir,
                                                     const std::string& flag_value);

// A --chat-template FILE (oasis-server, oasis-generate): InvalidArgument when it is a
// directory, not a regular file or empty (blank), NotFound when it cannot be opened; at most
// kMaxConfigJsonBytes.
StatusOr<std::string> ReadChatTemplateFile(const std::string& path);

}  // namespace oasis
