#include "loadgen/load_runner.h"

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

namespace specula::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

RequestRecord RunOne(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt,
                     const LoadOptions& o) {
  v1::GenerateRequest request;
  for (int32_t t : prompt) request.mutable_token_ids()->add_ids(t);
  request.set_max_new_tokens(o.max_new_tokens);
  request.set_ignore_eos(true);  // every request produces max_new_tokens, as vllm bench does
  request.mutable_sampling()->set_temperature(o.temperature);
  request.mutable_speculation()->set_drafter(o.drafter);
  request.mutable_speculation()->set_max_draft_tokens(o.max_draft_tokens);

  RequestRecord r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  auto reader = stub.GenerateStream(&context, request);
  v1::GenerateStreamResponse message;
  while (reader->Read(&message)) {
    const Clock::time_point now = Clock::now();
    if (message.has_delta() && message.delta().token_ids_size() > 0) {
      if (r.output_tokens == 0) {
        r.ttft_s = Seconds(start, now);
      } else {
        r.itl_s.push_back(Seconds(last, now));
      }
      r.output_tokens += message.delta().token_ids_size();
      last = now;
    }
    if (message.has_finished()) {
      const v1::SpecStats& s = message.finished().spec();
      r.draft_tokens = s.draft_tokens();
      r.accepted_tokens = s.accepted_tokens();
      r.spec_steps = s.steps();
    }
  }
  grpc::Status status = reader->Finish();
  r.e2e_s = Seconds(start, Clock::now());
  r.ok = status.ok();
  if (!r.ok) r.error = std::to_string(status.error_code()) + ": " + status.error_message();
  return r;
}

}  // namespace

std::vector<RequestRecord> RunLoad(v1::Generation::Stub& stub,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   const LoadOptions& options, double* duration_s) {
  const size_t n = prompts.size();
  std::vector<double> arrival(n, 0.0);
  if (options.request_rate > 0) {
    std::mt19937_64 rng(options.seed);
    std::exponential_distribution<double> gap(options.request_rate);
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      arrival[i] = t;
      t += gap(rng);
    }
  }
  std::vector<RequestRecord> records(n);
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  const int32_t threads = std::max<int32_t>(1, options.concurrency);
  for (int32_t w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrival[i])));
        records[i] = RunOne(stub, prompts[i], options);
      }
    });
  }
  for (auto& t : workers) t.join();
  *duration_s = Seconds(start, Clock::now());
  return records;
}

}  // namespace specula::loadgen
