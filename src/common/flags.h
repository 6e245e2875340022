// A small command-line flag parser for the project's programs: `--name value`,
// `--name=value`, boolean `--name` and `--no-name` (false). Unknown flags, missing values and
// malformed numbers are InvalidArgument errors naming the flag. Not thread-safe; used once in
// main().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "oasis/status.h"

namespace oasis {

class FlagParser {
 public:
  explicit FlagParser(std::string program_summary) : summary_(std::move(program_summary)) {}

  // Declare before Parse(). `*out` holds the default and receives the value.
  void AddString(const std::string& name, std::string* out, const std::string& help);
  void AddInt(const std::string& name, int64_t* out, const std::string& help);
  void AddDouble(const std::string& name, double* out, const std::string& help);
  void AddBool(const std::string& name, bool* out, const std::string& help);

  // Parses argv[1..]; positional arguments are an error. `--help` sets help_requested().
  Status Parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  // Whether the flag appeared on the command line.
  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    Kind kind;
    void* out;
    std::string help;
    std::string default_text;
  };
  Status Assign(const std::string& name, Flag& flag, const std::string& value);

  std::string summary_;
  std::map<std::string, Flag> flags_;
  std::map<std::string, bool> set_;
  bool help_ = false;
};

}  // namespace oasis
