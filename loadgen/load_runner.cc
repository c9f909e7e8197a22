#include "loadgen/load_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace specula::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP_STRING:
      return "stop_string";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

// Cancels `context` after `delay` unless Done() comes first (a client giving up mid-stream).
class CancelTimer {
 public:
  CancelTimer(grpc::ClientContext* context, double delay_s) {
    if (delay_s <= 0) return;
    thread_ = std::thread([this, context, delay_s] {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::duration<double>(delay_s), [this] { return done_; })) {
        context->TryCancel();
      }
    });
  }
  ~CancelTimer() { Done(); }
  void Done() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

RequestRecord RunOne(v1::Generation::Stub& stub, const SampleRequest& sample,
                     const LoadOptions& o) {
  const RequestOverrides& x = sample.overrides;
  v1::GenerateRequest request;
  for (int32_t t : sample.prompt_ids) request.mutable_token_ids()->add_ids(t);
  request.set_max_new_tokens(
      static_cast<int32_t>(sample.output_len > 0 ? sample.output_len : o.max_new_tokens));
  request.set_ignore_eos(x.ignore_eos.value_or(o.ignore_eos));
  v1::SamplingParams& sampling = *request.mutable_sampling();
  sampling.set_temperature(x.temperature.value_or(o.temperature));
  if (x.top_p) sampling.set_top_p(*x.top_p);
  if (x.top_k) sampling.set_top_k(*x.top_k);
  if (x.seed) sampling.set_seed(*x.seed);
  request.mutable_speculation()->set_drafter(x.drafter.value_or(o.drafter));
  request.mutable_speculation()->set_max_draft_tokens(
      x.max_draft_tokens.value_or(o.max_draft_tokens));
  for (const std::string& stop : x.stop) request.add_stop(stop);

  RequestRecord r;
  r.prompt_tokens = static_cast<int64_t>(sample.prompt_ids.size());
  grpc::ClientContext context;
  const double timeout_s = x.timeout_s > 0 ? x.timeout_s : o.timeout_s;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)));
  if (!o.authorization.empty()) context.AddMetadata("authorization", o.authorization);
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  auto reader = stub.GenerateStream(&context, request);
  CancelTimer cancel(&context, x.cancel_after_s);
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
          r.itl_tokens.push_back(message.delta().token_ids_size());
        }
        r.output_tokens += message.delta().token_ids_size();
        last = now;
      }
    }
    if (message.has_finished()) {
      r.finish_reason = FinishReasonName(message.finished().finish_reason());
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
  cancel.Done();
  grpc::Status status = reader->Finish();
  r.e2e_s = Seconds(start, Clock::now());
  r.ok = status.ok();
  r.status_code = static_cast<int32_t>(status.error_code());
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
