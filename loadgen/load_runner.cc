#include "loadgen/load_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace specula::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

RequestRecord RunOne(v1::Generation::Stub& stub, const SampleRequest& sample,
                     const LoadOptions& o) {
  v1::GenerateRequest request;
  for (int32_t t : sample.prompt_ids) request.mutable_token_ids()->add_ids(t);
  request.set_max_new_tokens(
      static_cast<int32_t>(sample.output_len > 0 ? sample.output_len : o.max_new_tokens));
  request.set_ignore_eos(o.ignore_eos);
  request.mutable_sampling()->set_temperature(o.temperature);
  request.mutable_speculation()->set_drafter(o.drafter);
  request.mutable_speculation()->set_max_draft_tokens(o.max_draft_tokens);

  RequestRecord r;
  r.prompt_tokens = static_cast<int64_t>(sample.prompt_ids.size());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  if (!o.authorization.empty()) context.AddMetadata("authorization", o.authorization);
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  auto reader = stub.GenerateStream(&context, request);
  v1::GenerateStreamResponse message;
  while (reader->Read(&message)) {
    const Clock::time_point now = Clock::now();
    if (message.has_delta()) {
      r.text += message.delta().text();
      if (message.delta().token_ids_size() > 0) {
        if (r.output_tokens == 0) {
          r.ttft_s = Seconds(start, now);
        } else {
          r.itl_s.push_back(Seconds(last, now));
        }
        r.output_tokens += message.delta().token_ids_size();
        last = now;
      }
    }
    if (message.has_finished()) {
      const v1::SpecStats& s = message.finished().spec();
      r.spec_steps = s.steps();
      r.draft_steps = s.draft_steps();
      r.draft_tokens = s.draft_tokens();
      r.accepted_tokens = s.accepted_tokens();
      r.draft_errors = s.draft_errors();
      r.accepted_per_position.assign(s.accepted_per_position().begin(),
                                     s.accepted_per_position().end());
      r.lossy = s.lossy();
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
                                   const std::vector<SampleRequest>& requests,
                                   const LoadOptions& options, double* duration_s) {
  const size_t n = requests.size();
  std::vector<RequestRecord> records(n);
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  const size_t threads = std::min<size_t>(
      std::max<size_t>(1, static_cast<size_t>(options.concurrency)), std::max<size_t>(n, 1));
  // Each client thread takes the next request, waits for its arrival time and runs it, so at
  // most `concurrency` are in flight and none is sent early.
  for (size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        if (i < options.arrival_s.size() && options.arrival_s[i] > 0) {
          std::this_thread::sleep_until(start +
                                        std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(options.arrival_s[i])));
        }
        records[i] = RunOne(stub, requests[i], options);
        if (options.progress != nullptr) options.progress->Add(1);
      }
    });
  }
  for (auto& t : workers) t.join();
  *duration_s = Seconds(start, Clock::now());
  return records;
}

}  // namespace specula::loadgen
