// A deadline for one blocking operation on a long-lived gRPC stream. gRPC deadlines belong to a
// whole call, so a stream that carries many request/reply exchanges (Target.Run, Drafter.Session)
// gets none per exchange; the watchdog gives one: Arm before the blocking Write/Read, Disarm after.
// If the deadline passes first, a background thread cancels the stream's ClientContext, which makes
// the blocked Write/Read return false; Disarm then reports that it fired, and the caller drops the
// stream (the next exchange opens a new one).
//
// Arm and Disarm take a mutex and nothing more while exchanges follow one another: the watchdog's
// thread sleeps until the deadline it last saw and is woken only when a new one comes earlier or
// it has gone idle (no exchange for a whole timeout). Woken on every Arm, it cost each exchange a
// context switch, which on a loaded 2-core machine showed in every step of the three-process
// deployment (the router arms once per step, the target once per drafter call).
//
// Thread-safety: Arm and Disarm from one thread at a time (the stream's user); the watchdog's own
// thread only calls ClientContext::TryCancel, which gRPC allows from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace specula::services {

class StreamWatchdog {
 public:
  StreamWatchdog() = default;
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Cancels `context` unless Disarm is called within `timeout`. `context` must stay alive until
  // Disarm returns.
  void Arm(grpc::ClientContext* context, std::chrono::steady_clock::duration timeout);
  // Stops watching; true if the deadline had passed and the context was cancelled.
  bool Disarm();

 private:
  void Watch();

  std::mutex mu_;
  std::condition_variable cv_;
  grpc::ClientContext* context_ = nullptr;  // armed while not null
  std::chrono::steady_clock::time_point deadline_;
  // What the watchdog's thread sleeps until (max() while idle: until an Arm wakes it).
  std::chrono::steady_clock::time_point sleeping_until_ =
      std::chrono::steady_clock::time_point::max();
  bool fired_ = false;
  bool stop_ = false;
  std::thread thread_;  // started by the first Arm
};

}  // namespace specula::services
