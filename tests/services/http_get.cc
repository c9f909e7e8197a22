#include "tests/services/http_get.h"

#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace specula {

HttpResponse HttpGet(int port, const std::string& path) {
  HttpResponse r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  const size_t sp = response.find(' ');
  if (sp == std::string::npos) return r;
  r.status = std::atoi(response.c_str() + sp + 1);
  const size_t body = response.find("\r\n\r\n");
  if (body != std::string::npos) r.body = response.substr(body + 4);
  return r;
}

double SeriesValue(const std::string& text, const std::string& name, const std::string& labels) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    const size_t space = line.rfind(' ');
    const std::string series = line.substr(0, space);
    bool match = true;
    std::istringstream wanted(labels);
    std::string item;
    while (std::getline(wanted, item, ',')) {
      if (!item.empty() && series.find(item) == std::string::npos) match = false;
    }
    if (match) return std::stod(line.substr(space + 1));
  }
  return -1;
}

}  // namespace specula
