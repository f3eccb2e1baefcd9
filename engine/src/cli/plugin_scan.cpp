// dqn plugins' scan in child processes (plugin_scan.hpp).
#include "plugin_scan.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>

#include "core/plugin_loader.hpp"

namespace dqn::cli {

namespace {

void write_all(int fd, const std::string& s) {
  for (std::size_t done = 0; done < s.size();) {
    const ssize_t k = ::write(fd, s.data() + done, s.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    done += std::size_t(k);
  }
}

/// In the child: "OK\n<name>\n<text>" or "ERR\n<why>" on fd, then _exit (no destructors run).
[[noreturn]] void describe_in_child(const std::string& path, int fd) {
  try {
    const LoadedPlugin p = PluginLoader::load_file(path);
    write_all(fd, "OK\n" + std::string(p.descriptor->name) + "\n" + describe_plugin(p));
    ::_exit(0);
  } catch (const std::exception& e) {
    write_all(fd, std::string("ERR\n") + e.what());
  } catch (...) {
    write_all(fd, "ERR\nplugin '" + path + "': loading it threw something that is not a std::exception");
  }
  ::_exit(3);
}

ScannedPlugin scan_one(const std::string& path, int timeout_s) {
  ScannedPlugin r;
  r.path = path;
  int fds[2];
  if (::pipe(fds) != 0) {
    r.problem = "plugin '" + path + "': cannot scan it (pipe: " + std::strerror(errno) + ")";
    return r;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    r.problem = "plugin '" + path + "': cannot scan it (fork: " + std::strerror(errno) + ")";
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    describe_in_child(path, fds[1]);
  }
  ::close(fds[1]);
  std::string out;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (char buf[4096];;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, int(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // (the deadline is checked above)
    const ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;  // the child closed its end: it is done
    out.append(buf, std::size_t(k));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    r.problem = "plugin '" + path + "': did not finish loading within " + std::to_string(timeout_s) + " s; skipped";
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    r.problem = "plugin '" + path + "': crashed while being loaded or described (signal " + std::to_string(sig) + ", " +
                ::strsignal(sig) + "); skipped";
  } else if (out.rfind("OK\n", 0) == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    const std::size_t eol = out.find('\n', 3);
    r.name = out.substr(3, eol == std::string::npos ? std::string::npos : eol - 3);
    r.text = eol == std::string::npos ? std::string() : out.substr(eol + 1);
  } else if (out.rfind("ERR\n", 0) == 0) {
    r.problem = out.substr(4);
  } else {
    r.problem = "plugin '" + path + "': exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                " while being loaded; skipped";
  }
  return r;
}

}  // namespace

std::vector<ScannedPlugin> scan_plugins(const std::vector<std::string>& files, int timeout_s) {
  std::vector<ScannedPlugin> out;
  for (const auto& f : files) out.push_back(scan_one(f, timeout_s));
  return out;
}

}  // namespace dqn::cli
