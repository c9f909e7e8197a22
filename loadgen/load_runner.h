// Drives the router's public Generation API (GenerateStream) with a fixed prompt set: `concurrency`
// client threads, requests arriving all at once (rate 0) or as a Poisson process, every token
// delivery timed on the client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/load_report.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula::loadgen {

struct LoadOptions {
  int32_t concurrency = 1;
  double request_rate = 0;  // requests/s; 0 = all at once (limited by concurrency)
  uint64_t seed = 0;        // arrival times
  int32_t max_new_tokens = 128;
  std::string drafter;           // "" = the server's default, "none" = off
  int32_t max_draft_tokens = 0;  // 0 = the server's default
  float temperature = 0;
  double timeout_s = 600;  // per request
};

// Runs every prompt once; returns one record per prompt (in prompt order) and the wall time.
std::vector<RequestRecord> RunLoad(v1::Generation::Stub& stub,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const LoadOptions& options, double* duration_s);

}  // namespace specula::loadgen
