#include "netns_pair.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace oasis::disagg::testing {

int RunQuiet(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

std::unique_ptr<NetnsPair> NetnsPair::Create(std::string* why) {
  if (geteuid() != 0) {
    *why = "network namespaces need root";
    return nullptr;
  }
  std::unique_ptr<NetnsPair> p(new NetnsPair());
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) {
      p->ip_ = path;
      break;
    }
  }
  if (p->ip_.empty()) {
    *why = "the `ip` tool (iproute2) is not installed";
    return nullptr;
  }
  const unsigned pid = static_cast<unsigned>(getpid());
  p->name_ = "oasis_dg_" + std::to_string(pid);
  p->veth_host_ = "odg" + std::to_string(pid % 10000000) + "h";
  p->veth_ns_ = "odg" + std::to_string(pid % 10000000) + "n";
  const unsigned base = (pid % 32768) * 4;  // a /30 inside 198.18.0.0/15
  const std::string prefix =
      "198." + std::to_string(18 + (base >> 16)) + "." + std::to_string((base >> 8) & 0xff) + ".";
  p->host_ip_ = prefix + std::to_string((base & 0xff) + 1);
  p->ns_ip_ = prefix + std::to_string((base & 0xff) + 2);
  const std::string& ip = p->ip_;
  if (RunQuiet({ip, "netns", "add", p->name_}) != 0) {
    *why = "`ip netns add` failed (no permission to make network namespaces here)";
    return nullptr;
  }
  p->created_ = true;
  const std::vector<std::vector<std::string>> steps = {
      {ip, "link", "add", p->veth_host_, "type", "veth", "peer", "name", p->veth_ns_},
      {ip, "link", "set", p->veth_ns_, "netns", p->name_},
      {ip, "addr", "add", p->host_ip_ + "/30", "dev", p->veth_host_},
      {ip, "link", "set", p->veth_host_, "up"},
      {ip, "netns", "exec", p->name_, ip, "addr", "add", p->ns_ip_ + "/30", "dev", p->veth_ns_},
      {ip, "netns", "exec", p->name_, ip, "link", "set", p->veth_ns_, "up"},
      {ip, "netns", "exec", p->name_, ip, "link", "set", "lo", "up"},
  };
  for (const auto& step : steps) {
    if (RunQuiet(step) != 0) {
      *why = "setting up the veth pair failed at `ip";
      for (size_t i = 1; i < step.size(); ++i) *why += " " + step[i];
      *why += "`";
      return nullptr;  // the destructor removes what exists
    }
  }
  // `ip netns exec` remounts /sys, which some containers forbid even to root.
  const char* true_path = access("/usr/bin/true", X_OK) == 0 ? "/usr/bin/true" : "/bin/true";
  if (RunQuiet(p->Inside({true_path})) != 0) {
    *why = "`ip netns exec` cannot run a program in the namespace";
    return nullptr;
  }
  return p;
}

NetnsPair::~NetnsPair() {
  if (!created_) return;
  RunQuiet({ip_, "link", "del", veth_host_});  // gone already if the namespace took it along
  RunQuiet({ip_, "netns", "del", name_});
}

std::vector<std::string> NetnsPair::Inside(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {ip_, "netns", "exec", name_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace oasis::disagg::testing
