// Drives the router's public Generation API (GenerateStream) with a fixed request set: at most
// `concurrency` requests in flight, each sent no earlier than its arrival time (arrivals.h), every
// token delivery timed on the client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/dataset.h"
#include "loadgen/load_report.h"
#include "loadgen/progress_bar.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula::loadgen {

struct LoadOptions {
  int32_t concurrency = 1;
  std::vector<double> arrival_s;  // send time of each request from the start; empty = all at 0
  int32_t max_new_tokens = 128;   // for requests whose output_len is 0
  bool ignore_eos = false;        // generate exactly the output length (vllm's --ignore-eos)
  std::string drafter;            // "" = the server's default, "none" = off
  int32_t max_draft_tokens = 0;   // 0 = the server's default
  float temperature = 0;
  double timeout_s = 600;           // per request
  std::string authorization;        // the `authorization` metadata of every call ("" = none)
  ProgressBar* progress = nullptr;  // advanced as requests finish, when set
};

// Runs every request once; returns one record per request (in request order) and the wall time.
std::vector<RequestRecord> RunLoad(v1::Generation::Stub& stub,
                                   const std::vector<SampleRequest>& requests,
                                   const LoadOptions& options, double* duration_s);

}  // namespace specula::loadgen
