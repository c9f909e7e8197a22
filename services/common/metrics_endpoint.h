// A minimal HTTP/1.x server for Prometheus scrapes: GET /metrics returns the text a callback
// renders; anything else gets 404 (or 405 for other methods). One thread accepts connections and
// each connection gets a thread of its own, at most kMaxConnections at once (more are closed with
// 503), so a client that connects and sends nothing, or trickles bytes, never blocks another
// scraper; each connection has kConnectionDeadline to send its request.
//
// prometheus-cpp's own Exposer (civetweb) cannot be used here: civetweb starts its threads with a
// fixed 100 KiB stack, and in a process that also loads LibTorch and OpenBLAS the static TLS alone
// is larger, so pthread_create fails with EINVAL and the Exposer throws.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/util/status.h"

namespace specula::services {

class MetricsEndpoint {
 public:
  static constexpr int kMaxConnections = 16;
  static constexpr int kConnectionDeadlineMs = 5000;

  // Listens on host:port (port 0 = any free port). UNAVAILABLE if it cannot bind,
  // INVALID_ARGUMENT for a host that does not resolve.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port,
                                                          std::function<std::string()> render);
  // Stops serving: closes open connections and waits for their threads.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int wake_fd, int port, std::function<std::string()> render);
  void Serve();
  void Handle(int fd);  // one connection, on its own thread

  int listen_fd_;
  int wake_fd_;  // eventfd: written once to stop Serve()
  int port_;
  std::function<std::string()> render_;
  std::thread thread_;  // accepts
  std::mutex mu_;
  std::condition_variable closed_;
  std::set<int> open_;  // connections being handled
};

}  // namespace specula::services
