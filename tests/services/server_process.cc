#include "tests/services/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <thread>

namespace specula {

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (!stderr_path_.empty()) std::filesystem::remove(stderr_path_);
}

bool ServerProcess::Start(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  static int counter = 0;
  stderr_path_ =
      (std::filesystem::temp_directory_path() /
       ("specula_serve_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".err"))
          .string();
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) {
    error_ = "pipe failed";
    return false;
  }
  const std::string binary = std::string(SPECULA_BINARY_DIR) + "/bin/specula";
  std::vector<std::string> argv_strings = {binary, "serve"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  // Everything the child needs is prepared before fork(): only async-signal-safe calls after it.
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    close(pipe_fds[0]);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  out_fd_ = pipe_fds[0];
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (out.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      error_ = "no listening line within the timeout; stderr: " + Stderr();
      return false;
    }
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
      error_ = "the server exited before listening; stderr: " + Stderr();
      return false;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  line_ = out.substr(0, out.find('\n'));
  std::smatch m;
  if (!std::regex_search(line_, m, std::regex("listening on [^ ]+:([0-9]+)"))) {
    error_ = "unexpected first line: " + line_;
    return false;
  }
  port_ = std::stoi(m[1]);
  if (std::regex_search(line_, m, std::regex("metrics on http://[^ ]+:([0-9]+)/metrics"))) {
    metrics_port_ = std::stoi(m[1]);
  }
  return true;
}

int ServerProcess::Stop(int signal, std::chrono::seconds timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal);
  const auto end = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

void ServerProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

namespace {

// Whether every thread of `pid` is in the stopped state ('T', or 't' when traced).
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream in(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) continue;  // exited meanwhile
    const char state = stat[close + 2];
    if (state != 'T' && state != 't') return false;
    ++threads;
  }
  return !ec && threads > 0;
}

}  // namespace

bool ServerProcess::Freeze(std::chrono::seconds timeout) {
  if (pid_ <= 0) return false;
  kill(pid_, SIGSTOP);
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (AllThreadsStopped(pid_)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::string ServerProcess::Stderr() const {
  std::ifstream in(stderr_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specula
