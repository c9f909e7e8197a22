// StreamWatchdog against real blocked stream reads: a stream to an address where nothing listens,
// with wait_for_ready, blocks its Read until the call is cancelled, so each test below returns
// only if the watchdog cancels (a watchdog that sleeps through a deadline hangs the test until
// CTest's timeout fails it). No assertion depends on how fast the machine is.
#include "services/common/stream_watchdog.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "specula/v1/drafter.grpc.pb.h"

namespace specula::services {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;

// A loopback port nothing listens on (bound, then closed).
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// One stream whose Read blocks until its context is cancelled.
class BlockedStream {
 public:
  explicit BlockedStream(const std::string& address)
      : stub_(v1::Drafter::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_wait_for_ready(true);
    context_.set_initial_metadata_corked(true);  // else opening the stream blocks, unarmed
    stream_ = stub_->Session(&context_);
  }
  grpc::ClientContext* context() { return &context_; }
  // Blocks until the call ends; false once it was cancelled (it never gets a reply).
  bool Read() {
    v1::DrafterReply reply;
    return stream_->Read(&reply);
  }

 private:
  std::unique_ptr<v1::Drafter::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DrafterCall, v1::DrafterReply>> stream_;
};

// Arms the watchdog for `timeout` over the stream's blocked Read: returns once it cancels it.
void ExpectItCancels(StreamWatchdog& watchdog, BlockedStream& stream, milliseconds timeout) {
  watchdog.Arm(stream.context(), timeout);
  EXPECT_FALSE(stream.Read());
  EXPECT_TRUE(watchdog.Disarm());
}

class StreamWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int port = ClosedPort();
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  std::string address_;
};

TEST_F(StreamWatchdogTest, CancelsABlockedReadOnceItsDeadlinePasses) {
  StreamWatchdog watchdog;
  BlockedStream stream(address_);
  ExpectItCancels(watchdog, stream, milliseconds(20));
}

TEST_F(StreamWatchdogTest, DisarmedInTimeItCancelsNothing) {
  StreamWatchdog watchdog;
  BlockedStream stream(address_);
  // Exchanges that follow one another re-arm it without waking its thread; none of them fires.
  for (int i = 0; i < 1000; ++i) {
    watchdog.Arm(stream.context(), hours(1));
    EXPECT_FALSE(watchdog.Disarm());
  }
  // Still watching afterwards: the same watchdog cancels the next exchange that overruns.
  ExpectItCancels(watchdog, stream, milliseconds(20));
}

TEST_F(StreamWatchdogTest, AnEarlierDeadlineWakesItFromALaterOne) {
  StreamWatchdog watchdog;
  BlockedStream first(address_);
  watchdog.Arm(first.context(), hours(1));
  std::this_thread::sleep_for(milliseconds(20));  // its thread is asleep until an hour from now
  EXPECT_FALSE(watchdog.Disarm());
  BlockedStream second(address_);
  ExpectItCancels(watchdog, second, milliseconds(20));  // in 20 ms, not in an hour
}

TEST_F(StreamWatchdogTest, WakesFromIdleAndReportsOnlyItsNewExchange) {
  StreamWatchdog watchdog;
  BlockedStream idle(address_);
  ExpectItCancels(watchdog, idle, milliseconds(1));
  // Disarmed past its last deadline, its thread sleeps until the next Arm wakes it.
  std::this_thread::sleep_for(milliseconds(20));
  BlockedStream next(address_);
  ExpectItCancels(watchdog, next, milliseconds(20));
  // A fired watchdog re-armed reports only its new exchange.
  watchdog.Arm(next.context(), hours(1));
  EXPECT_FALSE(watchdog.Disarm());
}

}  // namespace
}  // namespace specula::services
