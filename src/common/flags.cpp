#include "common/flags.h"

#include <charconv>
#include <cstdlib>
#include <sstream>

namespace oasis {

void FlagParser::AddString(const std::string& name, std::string* out, const std::string& help) {
  flags_[name] = {Kind::kString, out, help, *out};
}
void FlagParser::AddInt(const std::string& name, int64_t* out, const std::string& help) {
  flags_[name] = {Kind::kInt, out, help, std::to_string(*out)};
}
void FlagParser::AddDouble(const std::string& name, double* out, const std::string& help) {
  std::ostringstream s;
  s << *out;
  flags_[name] = {Kind::kDouble, out, help, s.str()};
}
void FlagParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_[name] = {Kind::kBool, out, help, *out ? "true" : "false"};
}

Status FlagParser::Assign(const std::string& name, Flag& flag, const std::string& value) {
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.out) = value;
      break;
    case Kind::kInt: {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec != std::errc() || p != value.data() + value.size()) {
        return InvalidArgument("--" + name + " expects an integer, got '" + value + "'");
      }
      *static_cast<int64_t*>(flag.out) = v;
      break;
    }
    case Kind::kDouble: {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size()) {
        return InvalidArgument("--" + name + " expects a number, got '" + value + "'");
      }
      *static_cast<double*>(flag.out) = v;
      break;
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.out) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.out) = false;
      } else {
        return InvalidArgument("--" + name + " expects true or false, got '" + value + "'");
      }
      break;
  }
  set_[name] = true;
  return Status::Ok();
}

Status FlagParser::Parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0)
      return InvalidArgument("unexpected argument '" + arg + "' (see --help)");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && !has_value && name.rfind("no-", 0) == 0) {
      // --no-NAME: a boolean flag's false (as vLLM's --no-enable-prefix-caching).
      auto positive = flags_.find(name.substr(3));
      if (positive != flags_.end() && positive->second.kind == Kind::kBool) {
        OASIS_RETURN_IF_ERROR(Assign(positive->first, positive->second, "false"));
        continue;
      }
    }
    if (it == flags_.end()) return InvalidArgument("unknown flag --" + name + " (see --help)");
    if (!has_value) {
      if (it->second.kind == Kind::kBool) {
        value = "true";
      } else {
        if (i + 1 >= argc) return InvalidArgument("--" + name + " needs a value");
        value = argv[++i];
      }
    }
    OASIS_RETURN_IF_ERROR(Assign(name, it->second, value));
  }
  return Status::Ok();
}

std::string FlagParser::Usage() const {
  std::ostringstream s;
  s << summary_ << "\n\nFlags:\n";
  for (const auto& [name, f] : flags_) {
    s << "  --" << name << "  " << f.help;
    if (!f.default_text.empty()) s << " (default: " << f.default_text << ")";
    s << "\n";
  }
  return s.str();
}

}  // namespace oasis
