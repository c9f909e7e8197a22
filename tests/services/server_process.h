// Runs `specula serve` as a child process for black-box tests: starts it, waits for its
// "listening on HOST:PORT" line, and stops it with a signal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace specula {

class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess();  // SIGKILL if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts `<build>/bin/specula serve args...` and waits for the listening line. On failure
  // returns false with the reason (and the server's stderr) in error().
  bool Start(const std::vector<std::string>& args,
             std::chrono::seconds timeout = std::chrono::seconds(180));
  // Sends `signal` and waits for exit; returns the exit code (-1 if killed by a signal or still
  // running after `timeout`, in which case it is killed).
  int Stop(int signal, std::chrono::seconds timeout = std::chrono::seconds(30));
  // Sends `signal` without waiting (SIGCONT: thaws a frozen peer).
  void Signal(int signal);
  // Sends SIGSTOP and waits until every thread of the server is stopped (false if that does not
  // happen within `timeout`). kill() returns before the stop: the kernel wakes one thread to take
  // the signal, and on a loaded machine the others can serve whole requests before it runs.
  bool Freeze(std::chrono::seconds timeout = std::chrono::seconds(30));

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }  // 0 when metrics are off
  const std::string& line() const { return line_; }   // the listening line
  const std::string& error() const { return error_; }
  std::string Stderr() const;  // everything written to stderr so far

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string stderr_path_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string line_;
  std::string error_;
};

}  // namespace specula
