// A minimal HTTP/1.x server for Prometheus scrapes: GET /metrics returns the text a callback
// renders; anything else gets 404 (or 405 for other methods). One background thread handles one
// connection at a time, which is all a scraper needs.
//
// prometheus-cpp's own Exposer (civetweb) cannot be used here: civetweb starts its threads with a
// fixed 100 KiB stack, and in a process that also loads LibTorch and OpenBLAS the static TLS alone
// is larger, so pthread_create fails with EINVAL and the Exposer throws.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/util/status.h"

namespace specula::services {

class MetricsEndpoint {
 public:
  // Listens on host:port (port 0 = any free port). UNAVAILABLE if it cannot bind,
  // INVALID_ARGUMENT for a host that does not resolve.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host, int port,
                                                          std::function<std::string()> render);
  // Stops serving and joins the thread.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  MetricsEndpoint(int listen_fd, int wake_fd, int port, std::function<std::string()> render);
  void Serve();
  void Handle(int fd);

  int listen_fd_;
  int wake_fd_;  // eventfd: written once to stop Serve()
  int port_;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace specula::services
