// A blocking HTTP/1.0 GET against 127.0.0.1 for tests of the metrics endpoint.
#pragma once

#include <string>

namespace specula {

struct HttpResponse {
  int status = 0;  // 0 if the request failed
  std::string body;
};

HttpResponse HttpGet(int port, const std::string& path);

// In Prometheus text `text`: the value of the first series of metric `name` whose labels contain
// each of `labels` (comma-separated `key="value"` items, e.g. `finished_reason="length"`; others,
// such as model_name, may be there too). -1 when there is none.
double SeriesValue(const std::string& text, const std::string& name,
                   const std::string& labels = "");

}  // namespace specula
