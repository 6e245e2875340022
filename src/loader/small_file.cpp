#include "loader/small_file.h"

#include <fstream>
#include <vector>

namespace oasis {
namespace fs = std::filesystem;

namespace {
std::string FormatCap(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}
}  // namespace

Status CheckSmallFile(const fs::path& path, const std::string& what, uint64_t max_bytes) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows symlinks
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory)
      return NotFound(path.string() + ": cannot open " + what + ": " + ec.message());
    return NotFound(path.string() + ": cannot open " + what);
  }
  if (fs::is_directory(st)) return InvalidArgument(path.string() + ": " + what + " is a directory");
  if (!fs::is_regular_file(st)) {
    return InvalidArgument(path.string() + ": " + what +
                           " is not a regular file (a FIFO, device or socket)");
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return NotFound(path.string() + ": cannot open " + what + ": " + ec.message());
  if (size > max_bytes) {
    return InvalidArgument(path.string() + ": " + what + " is " + std::to_string(size) +
                           " bytes, more than the " + FormatCap(max_bytes) + " such a file may be");
  }
  return Status::Ok();
}

StatusOr<std::string> ReadSmallFile(const fs::path& path, const std::string& what,
                                    uint64_t max_bytes) {
  OASIS_RETURN_IF_ERROR(CheckSmallFile(path, what, max_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path.string() + ": cannot open " + what);
  std::string text;
  std::vector<char> buf(size_t{1} << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    text.append(buf.data(), static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes) {
      return InvalidArgument(path.string() + ": " + what + " is more than the " +
                             FormatCap(max_bytes) + " such a file may be");
    }
  }
  if (in.bad()) return DataLoss(path.string() + ": cannot read " + what);
  return text;
}

StatusOr<fs::path> ResolveTokenizerFile(const fs::path& model_dir, const std::string& flag_value) {
  std::error_code ec;
  fs::path path = flag_value.empty() ? model_dir : fs::path(flag_value);
  if (fs::is_directory(path, ec)) path /= "tokenizer.json";
  if (!fs::exists(path, ec) && !fs::is_symlink(path, ec)) {
    if (!flag_value.empty()) return NotFound("--tokenizer: no " + path.string());
    return fs::path();
  }
  OASIS_RETURN_IF_ERROR(CheckSmallFile(path, "tokenizer", kMaxTokenizerJsonBytes));
  return path;
}

StatusOr<std::string> ReadChatTemplateFile(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return InvalidArgument("--chat-template " + path + " is a directory, not a file");
  if (!fs::exists(path, ec)) return NotFound("cannot open --chat-template " + path);
  StatusOr<std::string> text = ReadSmallFile(path, "chat template", kMaxConfigJsonBytes);
  if (!text.ok()) return text.status().WithContext("--chat-template");
  if (text->find_first_not_of(" \t\r\n") == std::string::npos)
    return InvalidArgument("--chat-template " + path + " is empty");
  return text;
}

}  // namespace oasis
