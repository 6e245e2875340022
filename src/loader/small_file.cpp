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

}  // namespace oasis
