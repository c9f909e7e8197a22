#include "services/common/metrics_endpoint.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace specula::services {
namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string Response(const char* status, const char* content_type, const std::string& body) {
  return StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host, int port, std::function<std::string()> render) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return InvalidArgumentError(StrCat("metrics host '", host, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) break;
    error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0)
    return UnavailableError(StrCat("cannot serve metrics on ", host, ":", port, ": ", error));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return InternalError(StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(fd, wake, bound_port, std::move(render)));
}

MetricsEndpoint::MetricsEndpoint(int listen_fd, int wake_fd, int port,
                                 std::function<std::string()> render)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (int fd : open_) shutdown(fd, SHUT_RDWR);  // wakes their recv/poll
    closed_.wait(lock, [&] { return open_.empty(); });
  }
  close(listen_fd_);
  close(wake_fd_);
}

void MetricsEndpoint::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int>(open_.size()) >= kMaxConnections) {
        const std::string busy = Response("503 Service Unavailable", "text/plain", "busy\n");
        (void)!send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        close(fd);
        continue;
      }
      open_.insert(fd);
    }
    std::thread([this, fd] {
      Handle(fd);
      std::lock_guard<std::mutex> lock(mu_);
      open_.erase(fd);
      close(fd);
      closed_.notify_all();
    }).detach();
  }
}

void MetricsEndpoint::Handle(int fd) {
  timeval timeout{.tv_sec = 2, .tv_usec = 0};  // a client that does not read cannot hold it
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  // The whole request within the deadline: a client trickling bytes cannot hold the thread.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kConnectionDeadlineMs);
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    SendAll(fd, Response("400 Bad Request", "text/plain", "bad request\n"));
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  if (path != "/metrics") {
    SendAll(fd, Response("404 Not Found", "text/plain", "only /metrics is served here\n"));
  } else if (method != "GET" && method != "HEAD") {
    SendAll(fd, Response("405 Method Not Allowed", "text/plain", "use GET\n"));
  } else {
    std::string response =
        Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_());
    if (method == "HEAD") response.resize(response.find("\r\n\r\n") + 4);
    SendAll(fd, response);
  }
}

}  // namespace specula::services
