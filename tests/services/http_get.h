// A blocking HTTP/1.0 GET against 127.0.0.1 for tests of the metrics endpoint.
#pragma once

#include <string>

namespace specula {

struct HttpResponse {
  int status = 0;  // 0 if the request failed
  std::string body;
};

HttpResponse HttpGet(int port, const std::string& path);

}  // namespace specula
