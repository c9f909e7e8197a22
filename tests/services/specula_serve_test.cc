// Black-box tests of `specula serve`: the real binary on 127.0.0.1 with ephemeral ports. Greedy
// output on the bundled model equals plain decoding, gRPC health checking reports SERVING,
// reflection lists the Generation service, the metrics endpoint counts requests, SIGTERM stops
// the server cleanly, and flag errors are clear.
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <regex>
#include <thread>

#include "common/util/mapped_file.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "specula/v1/generation.grpc.pb.h"
#include "tests/services/http_get.h"
#include "tests/services/served_test_model.h"
#include "tests/services/server_process.h"
#include "tests/testing/temp_dir.h"

namespace specula {
namespace {

const std::string kBundled = std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-6m";

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                             grpc::InsecureChannelCredentials());
}

class SpeculaServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start({"--model", kBundled, "--drafter", "ngram", "--port", "0",
                                "--metrics-port", "-1", "--max-queue", "16"}))
        << server_->error();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static ServerProcess* server_;
};

ServerProcess* SpeculaServeTest::server_ = nullptr;

TEST_F(SpeculaServeTest, PrintsWhereItListens) {
  EXPECT_NE(server_->line().find("specula serve: listening on 127.0.0.1:"), std::string::npos);
  EXPECT_NE(server_->line().find("pyllama-6m"), std::string::npos) << server_->line();
  EXPECT_NE(server_->line().find("drafters ngram"), std::string::npos) << server_->line();
  EXPECT_GT(server_->metrics_port(), 0) << server_->line();
}

TEST_F(SpeculaServeTest, BundledModelServedGreedyEqualsPlainDecoding) {
  ReferenceDecoder reference(kBundled);
  auto stub = v1::Generation::NewStub(Channel(server_->port()));
  for (const std::string prompt : {"import os\n", "def main(argv):\n", "class Parser(object):\n"}) {
    // The server stops at the model's EOS unless asked not to; so does the reference here.
    const std::vector<int32_t> expected = reference.Greedy(reference.tokenizer().Encode(prompt), 40,
                                                           reference.config().eos_token_ids);
    for (const std::string drafter : {"none", "ngram"}) {
      v1::GenerateRequest request;
      request.set_text(prompt);
      request.set_max_new_tokens(40);
      request.mutable_speculation()->set_drafter(drafter);
      grpc::ClientContext context;
      v1::GenerateResponse response;
      grpc::Status status = stub->Generate(&context, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
                expected)
          << drafter << " / " << prompt;
      EXPECT_EQ(response.text(), reference.tokenizer().Decode(expected, true).value());

      grpc::ClientContext stream_context;
      auto reader = stub->GenerateStream(&stream_context, request);
      v1::GenerateStreamResponse m;
      std::vector<int32_t> streamed;
      bool finished = false;
      while (reader->Read(&m)) {
        streamed.insert(streamed.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
        finished |= m.has_finished();
      }
      ASSERT_TRUE(reader->Finish().ok());
      EXPECT_TRUE(finished);
      EXPECT_EQ(streamed, expected) << drafter << " / " << prompt;
    }
  }
}

TEST_F(SpeculaServeTest, HealthCheckReportsServing) {
  auto health = grpc::health::v1::Health::NewStub(Channel(server_->port()));
  for (const std::string service : {"", "specula.v1.Generation"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = health->Check(&context, request, &response);
    ASSERT_TRUE(status.ok()) << service << ": " << status.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_EQ(health->Check(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SpeculaServeTest, ReflectionListsTheGenerationService) {
  namespace refl = grpc::reflection::v1alpha;
  auto stub = refl::ServerReflection::NewStub(Channel(server_->port()));
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.push_back(s.name());
  EXPECT_NE(std::find(services.begin(), services.end(), "specula.v1.Generation"), services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  refl::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("specula.v1.Generation");
  ASSERT_TRUE(stream->Write(symbol));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "specula/v1/generation.proto");
  ASSERT_GT(file.service_size(), 0);
  EXPECT_EQ(file.service(0).method_size(), 3);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(SpeculaServeTest, MetricsEndpointCountsRequests) {
  HttpResponse before = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_EQ(before.status, 200);
  auto stub = v1::Generation::NewStub(Channel(server_->port()));
  v1::GenerateRequest request;
  request.mutable_token_ids()->add_ids(100);
  request.mutable_token_ids()->add_ids(200);
  request.set_max_new_tokens(8);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  v1::GenerateResponse response;
  ASSERT_TRUE(stub->Generate(&context, request, &response).ok());
  HttpResponse after = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_EQ(after.status, 200);
  const std::string model = "model_name=\"pyllama-6m\"";
  auto delta = [&](const std::string& name, const std::string& labels) {
    return SeriesValue(after.body, name, labels) - SeriesValue(before.body, name, labels);
  };
  EXPECT_EQ(delta("specula_generation_tokens_total", model), 8);
  // vLLM's finished_reason values, Specula's own reason beside them.
  EXPECT_EQ(delta("specula_request_success_total",
                  model + ",finished_reason=\"length\",specula_reason=\"length\""),
            1);
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    EXPECT_GE(SeriesValue(after.body, "specula_request_success_total",
                          model + ",finished_reason=\"" + reason + "\""),
              0)
        << reason;
  }
  // vLLM V1's per-request histograms, with the model_name label vLLM dashboards filter on.
  for (const char* name :
       {"specula_request_queue_time_seconds_count", "specula_request_prefill_time_seconds_count",
        "specula_request_decode_time_seconds_count", "specula_request_inference_time_seconds_count",
        "specula_request_time_per_output_token_seconds_count",
        "specula_request_prompt_tokens_count", "specula_request_generation_tokens_count",
        "specula_request_params_max_tokens_count", "specula_e2e_request_latency_seconds_count",
        "specula_time_to_first_token_seconds_count"}) {
    EXPECT_EQ(delta(name, model), 1) << name;
  }
  EXPECT_EQ(delta("specula_request_generation_tokens_sum", model), 8);
  EXPECT_EQ(delta("specula_request_prompt_tokens_sum", model), 2);
  EXPECT_EQ(delta("specula_request_params_max_tokens_sum", model), 8);
  EXPECT_GT(delta("specula_iteration_tokens_total_count", model), 0);
  EXPECT_GE(delta("specula_iteration_tokens_total_sum", model), 10);  // 2 prompt + 8 generated
  EXPECT_NE(after.body.find("specula_spec_decode_num_drafts_total"), std::string::npos);
  EXPECT_EQ(SeriesValue(after.body, "specula_kv_cache_usage_perc", model), 0);
}

// One access-log line per finished request on stderr, with a timestamp and level.
TEST_F(SpeculaServeTest, AccessLogLinePerRequest) {
  auto stub = v1::Generation::NewStub(Channel(server_->port()));
  v1::GenerateRequest request;
  request.set_request_id("access-log-1");
  request.mutable_token_ids()->add_ids(100);
  request.mutable_token_ids()->add_ids(200);
  request.mutable_token_ids()->add_ids(300);
  request.set_max_new_tokens(5);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  v1::GenerateResponse response;
  ASSERT_TRUE(stub->Generate(&context, request, &response).ok());
  // The line is written before the response's last event, so it is there by now.
  const std::string err = server_->Stderr();
  const size_t at = err.find("request id=access-log-1 ");
  ASSERT_NE(at, std::string::npos) << err;
  const size_t begin = err.rfind('\n', at) + 1;  // npos + 1 = 0 for the first line
  const std::string line = err.substr(begin, err.find('\n', at) - begin);
  EXPECT_TRUE(std::regex_search(
      line, std::regex("^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z INFO  request ")))
      << line;
  for (const char* field :
       {" status=OK ", " finish=length ", " prompt_tokens=3 ", " completion_tokens=5 ",
        " ttft_ms=", " e2e_ms=", " tpot_ms=", " drafter=ngram ", " mean_accepted_len="}) {
    EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
  }
}

TEST(SpeculaServeProcessTest, SigtermAndSigintStopTheServerCleanly) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  for (int signal : {SIGTERM, SIGINT}) {
    ServerProcess server;
    ASSERT_TRUE(server.Start({"--model", dirs.target, "--drafter", "ngram,draft-model",
                              "--drafter-model", dirs.draft, "--default-drafter", "draft-model",
                              "--port", "0", "--metrics-port", "0"}))
        << server.error();
    EXPECT_NE(server.line().find("metrics off"), std::string::npos) << server.line();
    EXPECT_NE(server.line().find("default drafter draft-model"), std::string::npos)
        << server.line();
    auto stub = v1::Generation::NewStub(Channel(server.port()));
    v1::GenerateRequest request;
    request.mutable_token_ids()->add_ids(5);
    request.set_max_new_tokens(6);
    grpc::ClientContext context;
    v1::GenerateResponse response;
    ASSERT_TRUE(stub->Generate(&context, request, &response).ok());
    EXPECT_EQ(response.spec().drafter(), "draft-model");
    EXPECT_EQ(server.Stop(signal), 0) << server.Stderr();
    EXPECT_NE(server.Stderr().find("shutting down"), std::string::npos) << server.Stderr();
  }
}

TEST(SpeculaServeProcessTest, ShortDeadlinesCancelsAndShutdownWithQueuedRequestsNeverAbort) {
  // Issue 19.1: requests that left while queued (deadline, client cancel, shutdown past the grace
  // period) aborted the server. One sequence per step keeps most of each burst queued.
  const TestModelDirs& dirs = TinyServedModelDirs();
  ServerProcess server;
  ASSERT_TRUE(
      server.Start({"--model", dirs.target, "--drafter", "ngram", "--port", "0", "--metrics-port",
                    "0", "--max-batch-size", "1", "--shutdown-grace-s", "0.2"}))
      << server.error();
  auto stub = v1::Generation::NewStub(Channel(server.port()));
  auto generate = [&](int first_token, int max_new, int deadline_ms) {
    v1::GenerateRequest request;
    request.mutable_token_ids()->add_ids(5);
    request.mutable_token_ids()->add_ids(first_token);
    request.set_max_new_tokens(max_new);
    grpc::ClientContext context;
    if (deadline_ms > 0) {
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(deadline_ms));
    }
    v1::GenerateResponse response;
    return stub->Generate(&context, request, &response);
  };
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> burst;
    for (int i = 0; i < 24; ++i) {
      burst.emplace_back([&, i] { (void)generate(6 + i, 60, 1 + i % 8); });
    }
    for (std::thread& t : burst) t.join();
    grpc::Status alive = generate(7, 4, 0);
    ASSERT_TRUE(alive.ok()) << "round " << round << ": " << alive.error_message()
                            << server.Stderr();
  }
  // Requests still queued when SIGTERM's grace period ends.
  std::vector<std::thread> queued;
  for (int i = 0; i < 6; ++i) queued.emplace_back([&, i] { (void)generate(8 + i, 900, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let them reach the server
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.Stderr();
  for (std::thread& t : queued) t.join();
}

struct RunResult {
  int exit_code = -1;
  std::string err;
};

RunResult RunServe(const std::string& args) {
  TempDir dir;
  const std::string err = dir.File("err.txt");
  const std::string cmd =
      std::string(SPECULA_BINARY_DIR) + "/bin/specula serve " + args + " > /dev/null 2> " + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFileToString(err).value()};
}

// Every flag of `serve --help` is listed under the role that reads it.
TEST(SpeculaServeFlagsTest, HelpIsGroupedByRole) {
  TempDir dir;
  const std::string out = dir.File("out.txt");
  const std::string cmd = std::string(SPECULA_BINARY_DIR) + "/bin/specula serve --help > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string help = ReadFileToString(out).value();
  EXPECT_EQ(help.find("\nflags:\n"), std::string::npos) << "flags outside any section:\n" << help;
  const size_t all = help.find("\nflags for every role:\n");
  const size_t router = help.find("\nrouter flags (--role router, all):\n");
  const size_t target = help.find("\ntarget flags (--role target, all):\n");
  const size_t drafter = help.find("\ndrafter flags (--role drafter");
  ASSERT_NE(all, std::string::npos) << help;
  ASSERT_NE(router, std::string::npos) << help;
  ASSERT_NE(target, std::string::npos) << help;
  ASSERT_NE(drafter, std::string::npos) << help;
  EXPECT_LT(all, router);
  EXPECT_LT(router, target);
  EXPECT_LT(target, drafter);
  auto section_of = [&](const std::string& flag) {
    const size_t at = help.find("\n  --" + flag + " ");
    EXPECT_NE(at, std::string::npos) << flag;
    return at < router ? "all" : at < target ? "router" : at < drafter ? "target" : "drafter";
  };
  EXPECT_STREQ(section_of("port"), "all");
  EXPECT_STREQ(section_of("log-level"), "all");
  EXPECT_STREQ(section_of("model"), "all");
  EXPECT_STREQ(section_of("max-queue"), "router");
  EXPECT_STREQ(section_of("log-stats-interval-s"), "router");
  EXPECT_STREQ(section_of("target-address"), "router");
  // The draft budget's own section sits within the router's part (the router runs the policy).
  EXPECT_NE(help.find("\ndraft budget flags (--role router, all):\n"), std::string::npos);
  EXPECT_STREQ(section_of("draft-budget"), "router");
  EXPECT_STREQ(section_of("max-prefill-step-slowdown"), "router");
  EXPECT_STREQ(section_of("drafter-address"), "target");
  EXPECT_STREQ(section_of("kv-memory-mb"), "target");
  EXPECT_STREQ(section_of("drafter-context"), "target");
  EXPECT_STREQ(section_of("ngram-max"), "drafter");
  EXPECT_STREQ(section_of("drafter"), "drafter");
  EXPECT_STREQ(section_of("proposal-top-k"), "drafter");
}

// Served, the draft budget keeps the streams' p99 inter-token gap within 5% of no speculation's
// by default; `generate` and `bench`, whose output nobody waits on chunk by chunk, have no bound.
TEST(SpeculaServeFlagsTest, ServedDraftsAreLatencyBoundByDefault) {
  TempDir dir;
  auto default_of = [&](const std::string& command) {
    const std::string out = dir.File(command + ".txt");
    const std::string cmd =
        std::string(SPECULA_BINARY_DIR) + "/bin/specula " + command + " --help > " + out;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << command;
    const std::string help = ReadFileToString(out).value();
    const size_t flag = help.find("\n  --max-draft-slowdown ");
    if (flag == std::string::npos) return std::string("missing");
    const size_t at = help.find("(default: ", flag);
    return help.substr(at + 10, help.find(')', at) - at - 10);
  };
  EXPECT_EQ(default_of("serve"), "0.05");
  EXPECT_EQ(default_of("generate"), "-1");
  EXPECT_EQ(default_of("bench"), "-1");
}

TEST(SpeculaServeFlagsTest, ClearErrors) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  RunResult r = RunServe("--role router --model " + dirs.target);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT: --role router needs --target-address"), std::string::npos)
      << r.err;
  r = RunServe("--model " + dirs.target + " --target-address 127.0.0.1:1");
  EXPECT_NE(r.err.find("--target-address is for --role router"), std::string::npos) << r.err;
  r = RunServe("--role drafter --model " + dirs.target + " --drafter-address 127.0.0.1:1");
  EXPECT_NE(r.err.find("--drafter-address is for --role target"), std::string::npos) << r.err;
  // Nothing listens on port 1: the peer's address is named, after the connect timeout.
  r = RunServe("--role router --model " + dirs.target +
               " --target-address 127.0.0.1:1 --connect-timeout-s 0.3 --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("UNAVAILABLE"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("target at 127.0.0.1:1 (--target-address)"), std::string::npos) << r.err;
  r = RunServe("--role target --model " + dirs.target +
               " --drafter-address 127.0.0.1:1 --connect-timeout-s 0.3 --port 0");
  EXPECT_NE(r.err.find("drafter service at 127.0.0.1:1 (--drafter-address)"), std::string::npos)
      << r.err;
  r = RunServe("--model " + dirs.target + " --proposal-top-k 8");
  EXPECT_NE(r.err.find("--proposal-top-k is for --role drafter"), std::string::npos) << r.err;
  // Without the check the target would start: pointed at a drafter that is not there, it exits
  // at once with another error instead of serving until the test times out.
  r = RunServe("--role target --model " + dirs.target +
               " --drafter-address 127.0.0.1:1 --connect-timeout-s 0.3 --port 0"
               " --step-trace /tmp/x.jsonl");
  EXPECT_NE(r.err.find("--step-trace is for --role router or all"), std::string::npos) << r.err;
  r = RunServe("--model " + dirs.target + " --draft-budget fixed --step-trace /tmp/x.jsonl");
  EXPECT_NE(r.err.find("--step-trace traces the adaptive draft budget's plans: it needs "
                       "--draft-budget adaptive"),
            std::string::npos)
      << r.err;
  r = RunServe("--role drafter --model " + dirs.target + " --proposal-top-k -1");
  EXPECT_NE(r.err.find("--proposal-top-k must be >= 0 (0 = dense), got -1"), std::string::npos)
      << r.err;
  r = RunServe("--role drafter --model " + dirs.target + " --drafter none --port 0");
  EXPECT_NE(r.err.find("--role drafter needs --drafter"), std::string::npos) << r.err;
  r = RunServe("--role target --model " + dirs.target + " --overlap-steps sometimes --port 0");
  EXPECT_NE(r.err.find("--overlap-steps must be auto, true or false, got 'sometimes'"),
            std::string::npos)
      << r.err;
  r = RunServe("--role banana");
  EXPECT_NE(r.err.find("INVALID_ARGUMENT: --role must be"), std::string::npos) << r.err;
  r = RunServe("--model " + dirs.target +
               " --drafter ngram --default-drafter draft-model --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--default-drafter: 'draft-model' is not loaded"), std::string::npos)
      << r.err;
  r = RunServe("--model " + dirs.target + " --verify specdec --port 0");
  EXPECT_NE(r.err.find("--verify: requests choose"), std::string::npos) << r.err;
  r = RunServe("--model " + dirs.target + " --port 70000");
  EXPECT_NE(r.err.find("--port must be in [0, 65535]"), std::string::npos) << r.err;
  r = RunServe("--model " + dirs.target + " --drafter medusa");
  EXPECT_NE(r.err.find("unknown drafter 'medusa'"), std::string::npos) << r.err;
  // Issue 19.8: a default draft length past the engine's cap was accepted, then every request
  // (even drafter "none") was refused.
  r = RunServe("--model " + dirs.target + " --draft-len 1000 --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("INVALID_ARGUMENT: --draft-len must be in [0, 256], got 1000"),
            std::string::npos)
      << r.err;
  r = RunServe("--role target --model " + dirs.target + " --drafter-deadline-ms 0 --port 0");
  EXPECT_NE(r.err.find("--drafter-deadline-ms must be at least 1, got 0"), std::string::npos)
      << r.err;
  r = RunServe("--role router --model " + dirs.target +
               " --target-address 127.0.0.1:1 --target-step-deadline-s 0 --port 0");
  EXPECT_NE(r.err.find("--target-step-deadline-s must be at least 0.001"), std::string::npos)
      << r.err;
  r = RunServe("--model " + dirs.target + " --max-prompt-bytes 0 --port 0");
  EXPECT_NE(r.err.find("--max-prompt-bytes must be at least 1, got 0"), std::string::npos) << r.err;
  r = RunServe("--model " + dirs.target + " --log-level loud --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("log level must be debug, info, warning, error or off, got 'loud'"),
            std::string::npos)
      << r.err;
  r = RunServe("--model " + dirs.target + " --log-stats-interval-s -1 --port 0");
  EXPECT_NE(r.err.find("--log-stats-interval-s must be >= 0, got -1"), std::string::npos) << r.err;
  r = RunServe("--model /nonexistent/model --port 0");
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace specula
