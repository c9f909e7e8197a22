// The Generation service end to end over gRPC, with the router server in-process on 127.0.0.1 and
// an ephemeral port: served greedy output equals plain decoding (Generate and GenerateStream, every
// drafter), 32 concurrent streams, cancellation and deadlines free KV blocks, bad input names the
// field, the queue limit, stop strings, lossy labelling, server info and metrics.
#include "services/router/generation_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "services/router/router_server.h"
#include "tests/services/gated_backend.h"
#include "tests/services/http_get.h"
#include "tests/services/served_test_model.h"

namespace specula::router {
namespace {

using namespace std::chrono_literals;

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  bool finished = false;
  v1::GenerationFinished final;
  int deltas = 0;
  std::string request_id;
};

class GenerationServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const TestModelDirs& dirs = TinyServedModelDirs();
    reference_ = new ReferenceDecoder(dirs.target);
    RouterServerOptions options;
    options.port = 0;
    options.metrics_port = 0;
    options.loop.default_drafter = "ngram";
    options.loop.default_max_draft_tokens = 3;
    options.loop.max_queue = 64;
    auto server = RouterServer::Start(LoadServedModel(dirs.target, dirs.draft), options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }

  static std::unique_ptr<v1::Generation::Stub> Stub(int port) {
    return v1::Generation::NewStub(
        grpc::CreateChannel(StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  static std::unique_ptr<v1::Generation::Stub> Stub() { return Stub(server_->port()); }

  static v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int32_t max_new,
                                     const std::string& drafter) {
    v1::GenerateRequest r;
    for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
    r.set_max_new_tokens(max_new);
    r.set_ignore_eos(true);
    r.mutable_speculation()->set_drafter(drafter);
    return r;
  }

  static StreamResult Stream(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                             grpc::ClientContext* context = nullptr) {
    grpc::ClientContext local;
    if (!context) context = &local;
    StreamResult out;
    auto reader = stub.GenerateStream(context, request);
    v1::GenerateStreamResponse m;
    while (reader->Read(&m)) {
      out.request_id = m.request_id();
      EXPECT_FALSE(out.finished) << "a message after the final one";
      if (m.has_delta()) {
        ++out.deltas;
        out.tokens.insert(out.tokens.end(), m.delta().token_ids().begin(),
                          m.delta().token_ids().end());
        out.text += m.delta().text();
      } else if (m.has_finished()) {
        out.finished = true;
        out.final = m.finished();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  // Waits until the loop is idle and the KV cache empty again.
  static bool WaitIdle(std::chrono::seconds timeout = 30s) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      LoadSnapshot s = server_->loop().load();
      if (s.in_flight == 0 && s.running == 0 && s.kv_cache_blocks_used == 0) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  static RouterServer* server_;
  static ReferenceDecoder* reference_;
};

RouterServer* GenerationServiceTest::server_ = nullptr;
ReferenceDecoder* GenerationServiceTest::reference_ = nullptr;

TEST_F(GenerationServiceTest, ServedGreedyEqualsPlainDecodingForEveryDrafter) {
  auto stub = Stub();
  const Tokenizer& tok = reference_->tokenizer();
  for (const std::string prompt_text : {"def f(x):\n    return x", "import os\n"}) {
    const std::vector<int32_t> prompt = tok.Encode(prompt_text);
    const std::vector<int32_t> expected = reference_->Greedy(prompt, 24);
    const std::string expected_text = tok.Decode(expected, true).value();
    for (const std::string drafter : {"none", "ngram", "draft-model", ""}) {
      SCOPED_TRACE(drafter + " / " + prompt_text);
      v1::GenerateRequest request = Request({}, 24, drafter);
      request.set_text(prompt_text);  // the server tokenizes like Tokenizer::Encode
      grpc::ClientContext context;
      v1::GenerateResponse response;
      grpc::Status status = stub->Generate(&context, request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()),
                expected);
      EXPECT_EQ(response.text(), expected_text);
      EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(response.usage().prompt_tokens(), static_cast<int32_t>(prompt.size()));
      EXPECT_EQ(response.usage().completion_tokens(), 24);
      EXPECT_FALSE(response.request_id().empty());
      const std::string used = drafter.empty() ? "ngram" : drafter;  // the server's default
      EXPECT_EQ(response.spec().drafter(), used);
      EXPECT_FALSE(response.spec().lossy());
      if (used != "none") {
        EXPECT_GT(response.spec().draft_tokens(), 0);
        EXPECT_EQ(response.spec().max_draft_tokens(), 3);
        EXPECT_EQ(24, response.spec().steps() + response.spec().accepted_tokens() + 1);
      }

      request.set_request_id("mine-1");
      StreamResult s = Stream(*stub, request);
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      ASSERT_TRUE(s.finished);
      EXPECT_EQ(s.request_id, "mine-1");
      EXPECT_EQ(s.tokens, expected);
      EXPECT_EQ(s.text, expected_text);
      EXPECT_EQ(s.final.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(s.final.usage().completion_tokens(), 24);
      EXPECT_EQ(s.final.spec().drafter(), used);
    }
  }
}

TEST_F(GenerationServiceTest, ThirtyTwoConcurrentStreamsAllCompleteCorrectly) {
  constexpr int kClients = 32;
  const std::vector<std::string> drafters = {"none", "ngram", "draft-model"};
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < kClients; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 2 + (i * 7) % 41; ++j) prompt.push_back(3 + (i * 13 + j * 5) % 250);
    const int32_t max_new = 4 + (i * 11) % 57;
    requests.push_back(Request(prompt, max_new, drafters[i % drafters.size()]));
    expected.push_back(reference_->Greedy(prompt, max_new));
  }
  std::vector<StreamResult> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto stub = Stub();  // one channel per client
      results[i] = Stream(*stub, requests[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    SCOPED_TRACE(StrCat("client ", i, " drafter ", drafters[i % drafters.size()]));
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_TRUE(results[i].finished);
    EXPECT_EQ(results[i].tokens, expected[i]);
    EXPECT_EQ(results[i].text, reference_->tokenizer().Decode(expected[i], true).value());
  }
  EXPECT_TRUE(WaitIdle());
}

TEST_F(GenerationServiceTest, StreamsEachStepsTokensAsTheStepEnds) {
  // A server whose steps end only when the test lets them: each step's token must reach the
  // client as its own message before the next step may end.
  const TestModelDirs& dirs = TinyServedModelDirs();
  ServedModel model = LoadServedModel(dirs.target, "");
  auto gated = std::make_unique<GatedBackend>(std::move(model.backend));
  GatedBackend* backend = gated.get();
  model.backend = std::move(gated);
  RouterServerOptions options;
  options.port = 0;
  options.log_stats_interval_s = 0;
  auto server = RouterServer::Start(std::move(model), options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub((*server)->port());
  grpc::ClientContext context;  // a server that held tokens back would fail it, not hang it
  context.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub->GenerateStream(&context, Request({5, 6, 7}, 6, "none"));
  std::vector<int32_t> tokens;
  v1::GenerateStreamResponse m;
  for (int step = 0; step < 6; ++step) {
    backend->Allow(1);
    ASSERT_TRUE(reader->Read(&m));
    ASSERT_TRUE(m.has_delta()) << "step " << step;
    ASSERT_EQ(m.delta().token_ids_size(), 1) << "step " << step;
    tokens.push_back(m.delta().token_ids(0));
  }
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_TRUE(m.has_finished());
  EXPECT_FALSE(reader->Read(&m));
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, reference_->Greedy({5, 6, 7}, 6));
  backend->Allow(1 << 20);
  (*server)->Shutdown();
}

TEST_F(GenerationServiceTest, CancelledAndExpiredCallsFreeTheirKvBlocks) {
  auto stub = Stub();
  // A long stream, cancelled by the client after its first tokens.
  grpc::ClientContext cancel_context;
  auto reader = stub->GenerateStream(&cancel_context, Request({5, 6, 7, 8}, 1000, "none"));
  v1::GenerateStreamResponse first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_TRUE(first.has_delta());
  EXPECT_GT(server_->loop().load().kv_cache_blocks_used, 0);
  // Meanwhile another request is served correctly.
  std::thread other([&] {
    auto s = Stub();
    StreamResult r = Stream(*s, Request({9, 10, 11}, 30, "ngram"));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, reference_->Greedy({9, 10, 11}, 30));
  });
  cancel_context.TryCancel();
  while (reader->Read(&first)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  // A unary call whose deadline passes mid-generation.
  grpc::ClientContext deadline_context;
  deadline_context.set_deadline(std::chrono::system_clock::now() + 40ms);
  v1::GenerateResponse response;
  grpc::Status status =
      stub->Generate(&deadline_context, Request({5, 6, 7, 9}, 1000, "none"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  // A stream whose deadline passes mid-generation, and one whose client leaves without a word
  // (its context destroyed mid-stream, as a process that exits would).
  grpc::ClientContext stream_deadline;
  stream_deadline.set_deadline(std::chrono::system_clock::now() + 40ms);
  auto expiring = stub->GenerateStream(&stream_deadline, Request({5, 6, 7, 10}, 1000, "none"));
  v1::GenerateStreamResponse m;
  while (expiring->Read(&m)) {
  }
  EXPECT_EQ(expiring->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  {
    auto gone_context = std::make_unique<grpc::ClientContext>();
    auto gone = stub->GenerateStream(gone_context.get(), Request({5, 6, 7, 11}, 1000, "ngram"));
    ASSERT_TRUE(gone->Read(&m));
    gone_context->TryCancel();
    gone.reset();
    gone_context.reset();
  }
  other.join();
  EXPECT_TRUE(WaitIdle()) << "KV blocks still in use: "
                          << server_->loop().load().kv_cache_blocks_used;

  // The server info reports the freed cache too.
  grpc::ClientContext info_context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&info_context, {}, &info).ok());
  EXPECT_EQ(info.load().kv_cache_blocks_used(), 0);
  EXPECT_EQ(info.load().running(), 0);
}

TEST_F(GenerationServiceTest, BadRequestsNameTheFieldAndTheServerKeepsServing) {
  auto stub = Stub();
  auto expect_error = [&](const v1::GenerateRequest& request, grpc::StatusCode code,
                          const std::string& text) {
    for (bool stream : {false, true}) {
      grpc::Status status;
      if (stream) {
        status = Stream(*stub, request).status;
      } else {
        grpc::ClientContext context;
        v1::GenerateResponse response;
        status = stub->Generate(&context, request, &response);
      }
      EXPECT_EQ(status.error_code(), code) << text << ": " << status.error_message();
      EXPECT_NE(status.error_message().find(text), std::string::npos) << status.error_message();
    }
  };
  using grpc::StatusCode;
  v1::GenerateRequest r = Request({5, 6}, 4, "none");
  r.clear_token_ids();
  expect_error(r, StatusCode::INVALID_ARGUMENT, "prompt is empty");
  r.set_text("");
  expect_error(r, StatusCode::INVALID_ARGUMENT, "prompt is empty");
  expect_error(Request({}, 4, "none"), StatusCode::INVALID_ARGUMENT, "prompt is empty");
  expect_error(Request({5, 100000}, 4, "none"), StatusCode::INVALID_ARGUMENT,
               "token_ids[1] = 100000 is outside the vocabulary");
  expect_error(Request({5, -1}, 4, "none"), StatusCode::INVALID_ARGUMENT, "token_ids[1] = -1");
  expect_error(Request({5}, 4, "medusa"), StatusCode::INVALID_ARGUMENT,
               "speculation.drafter: unknown drafter 'medusa'");
  expect_error(Request({5}, 0, "none"), StatusCode::INVALID_ARGUMENT,
               "max_new_tokens must be positive");
  expect_error(Request({5}, -3, "none"), StatusCode::INVALID_ARGUMENT,
               "max_new_tokens must be positive");
  expect_error(Request({5}, 2000, "none"), StatusCode::OUT_OF_RANGE,
               "max_new_tokens 2000 plus the prompt's 1 tokens exceeds the context length of 1024");
  expect_error(Request(std::vector<int32_t>(1024, 5), 1, "none"), StatusCode::OUT_OF_RANGE,
               "longer than the context length");
  r = Request({5}, 4, "none");
  r.add_stop_token_ids(7);
  r.add_stop_token_ids(5000);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "stop_token_ids[1] = 5000");
  r = Request({5}, 4, "none");
  r.add_stop("");
  expect_error(r, StatusCode::INVALID_ARGUMENT, "stop[0] is empty");
  r = Request({5}, 4, "none");
  r.mutable_sampling()->set_temperature(-1);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "sampling.temperature");
  r = Request({5}, 4, "none");
  r.mutable_sampling()->set_top_p(0);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "sampling.top_p must be in (0, 1]");
  r = Request({5}, 4, "none");
  r.mutable_sampling()->set_top_k(-2);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "sampling.top_k");
  r = Request({5}, 4, "ngram");
  r.mutable_speculation()->set_max_draft_tokens(-1);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "speculation.max_draft_tokens must be >= 0");
  r.mutable_speculation()->set_max_draft_tokens(100000);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "max_draft_tokens");
  r = Request({5}, 4, "ngram");
  r.mutable_speculation()->set_verify(v1::VERIFY_MODE_SPECDEC);
  r.mutable_speculation()->set_specdec_beta(0);
  expect_error(r, StatusCode::INVALID_ARGUMENT, "speculation.specdec_beta must be >= 1");
  r.mutable_speculation()->set_verify(static_cast<v1::VerifyMode>(42));
  expect_error(r, StatusCode::INVALID_ARGUMENT, "speculation.verify");

  // Still serving, correctly.
  StreamResult ok = Stream(*stub, Request({5, 6, 7}, 12, "ngram"));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, reference_->Greedy({5, 6, 7}, 12));
  EXPECT_TRUE(WaitIdle());
  EXPECT_GT(SeriesValue(server_->metrics().Text(), "specula_request_rejected_total",
                        "code=\"INVALID_ARGUMENT\""),
            0);
}

// Issue 19.7: a proto3 string that is not UTF-8 fails protobuf's parse; gRPC answered INTERNAL
// with an empty message. It is the client's error: INVALID_ARGUMENT naming the field.
TEST_F(GenerationServiceTest, InvalidUtf8IsInvalidArgumentNamingTheField) {
  auto stub = Stub();
  auto expect_invalid = [&](const v1::GenerateRequest& request, const std::string& text) {
    for (bool stream : {false, true}) {
      grpc::Status status;
      if (stream) {
        status = Stream(*stub, request).status;
      } else {
        grpc::ClientContext context;
        v1::GenerateResponse response;
        status = stub->Generate(&context, request, &response);
      }
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << text << ": " << status.error_message();
      EXPECT_NE(status.error_message().find(text), std::string::npos) << status.error_message();
    }
  };
  v1::GenerateRequest r = Request({}, 4, "none");
  r.set_text(std::string("def f(x):\xff\xfe", 11));  // the C++ client sends it as it is
  expect_invalid(r, "text is not valid UTF-8 (byte 9)");
  r.set_text("ok \xed\xa0\x80");  // a UTF-16 surrogate
  expect_invalid(r, "text is not valid UTF-8 (byte 3)");
  r = Request({5, 6}, 4, "none");
  r.add_stop("fine");
  r.add_stop("\xc0\xaf");  // an overlong '/'
  expect_invalid(r, "stop[1] is not valid UTF-8 (byte 0)");
  r = Request({5, 6}, 4, "none");
  r.mutable_speculation()->set_drafter("\x80");
  expect_invalid(r, "speculation.drafter is not valid UTF-8");

  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), -1);
  EXPECT_EQ(FirstInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), -1);
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0);  // past U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("ab\xe2\x82"), 2);        // cut short
  // Still serving, and valid text works.
  r = Request({}, 4, "none");
  r.set_text("caf\xc3\xa9");
  grpc::ClientContext context;
  v1::GenerateResponse response;
  grpc::Status ok = stub->Generate(&context, r, &response);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(response.token_ids_size(), 4);
}

// Issue 19.9 and the message size limit: a huge prompt is refused before it is tokenized, and a
// message over --max-request-bytes never reaches the handler.
TEST_F(GenerationServiceTest, OversizedPromptsAndMessagesAreRefused) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  RouterServerOptions options;
  options.port = 0;
  options.max_prompt_bytes = 1000;
  options.max_request_bytes = 64 * 1024;
  auto small = RouterServer::Start(LoadServedModel(dirs.target, ""), options);
  ASSERT_TRUE(small.ok()) << small.status();
  auto stub = Stub((*small)->port());
  v1::GenerateRequest r = Request({}, 4, "none");
  r.set_text(std::string(1001, 'a'));
  grpc::ClientContext c1;
  v1::GenerateResponse response;
  grpc::Status status = stub->Generate(&c1, r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("text is 1001 bytes, over the server's limit of 1000"),
            std::string::npos)
      << status.error_message();
  r.set_text(std::string(100 * 1024, 'a'));
  grpc::ClientContext c2;
  status = stub->Generate(&c2, r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  r.set_text(std::string(1000, 'a'));
  grpc::ClientContext c3;
  status = stub->Generate(&c3, r, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(GenerationServiceTest, QueueFullIsResourceExhausted) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  RouterServerOptions options;
  options.port = 0;
  options.loop.max_queue = 2;
  auto small = RouterServer::Start(LoadServedModel(dirs.target, ""), options);
  ASSERT_TRUE(small.ok()) << small.status();
  auto stub = Stub((*small)->port());
  grpc::ClientContext c1, c2;
  auto r1 = stub->GenerateStream(&c1, Request({5, 6}, 1000, "none"));
  auto r2 = stub->GenerateStream(&c2, Request({5, 7}, 1000, "none"));
  v1::GenerateStreamResponse m;
  ASSERT_TRUE(r1->Read(&m));
  ASSERT_TRUE(r2->Read(&m));
  grpc::ClientContext c3;
  v1::GenerateResponse response;
  grpc::Status full = stub->Generate(&c3, Request({5, 8}, 4, "none"), &response);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  EXPECT_NE(full.error_message().find("max_queue"), std::string::npos) << full.error_message();
  c1.TryCancel();
  c2.TryCancel();
  while (r1->Read(&m)) {
  }
  while (r2->Read(&m)) {
  }
  r1->Finish();
  r2->Finish();
  // Once they are gone there is room again.
  const auto end = Clock::now() + 30s;
  while ((*small)->loop().load().in_flight > 0 && Clock::now() < end)
    std::this_thread::sleep_for(10ms);
  grpc::ClientContext c4;
  EXPECT_TRUE(stub->Generate(&c4, Request({5, 8}, 4, "none"), &response).ok());
  EXPECT_EQ(response.token_ids_size(), 4);
}

TEST_F(GenerationServiceTest, ShutdownLetsAcceptedRequestsFinishAndRefusesNewOnes) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  RouterServerOptions options;
  options.port = 0;
  auto server = RouterServer::Start(LoadServedModel(dirs.target, ""), options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub((*server)->port());
  grpc::ClientContext context;
  auto reader = stub->GenerateStream(&context, Request({5, 6, 7}, 300, "none"));
  v1::GenerateStreamResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::vector<int32_t> tokens(m.delta().token_ids().begin(), m.delta().token_ids().end());
  std::thread shutdown([&] { (*server)->Shutdown(std::chrono::seconds(60)); });
  // Draining: new requests are refused while the accepted one runs to its end.
  grpc::Status refused;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext c;
    v1::GenerateResponse r;
    refused = stub->Generate(&c, Request({5}, 2, "none"), &r);
    if (!refused.ok()) break;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  bool finished = false;
  while (reader->Read(&m)) {
    tokens.insert(tokens.end(), m.delta().token_ids().begin(), m.delta().token_ids().end());
    finished |= m.has_finished();
  }
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(finished);
  EXPECT_EQ(tokens, reference_->Greedy({5, 6, 7}, 300));
  shutdown.join();
}

TEST_F(GenerationServiceTest, StopStringsEndTheTextBeforeTheMatch) {
  auto stub = Stub();
  const Tokenizer& tok = reference_->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("class A:");
  const std::vector<int32_t> full = reference_->Greedy(prompt, 48);
  const std::string text = tok.Decode(full, true).value();
  ASSERT_GT(text.size(), 10u);
  // Three bytes from the middle, widened to whole UTF-8 characters.
  auto boundary = [&](size_t i) {
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  const size_t begin = boundary(text.size() / 2);
  const std::string stop = text.substr(begin, boundary(begin + 3) - begin);
  ASSERT_FALSE(stop.empty());
  v1::GenerateRequest request = Request(prompt, 48, "ngram");
  request.add_stop(stop);
  grpc::ClientContext context;
  v1::GenerateResponse response;
  ASSERT_TRUE(stub->Generate(&context, request, &response).ok());
  EXPECT_EQ(response.finish_reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(response.stop_string(), stop);
  EXPECT_EQ(response.text(), text.substr(0, text.find(stop)));
  EXPECT_EQ(response.usage().completion_tokens(), response.token_ids_size());
  StreamResult s = Stream(*stub, request);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(s.text, response.text());
  EXPECT_EQ(s.final.finish_reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(s.tokens,
            std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end()));
  EXPECT_TRUE(WaitIdle());
}

TEST_F(GenerationServiceTest, LossyVerificationOnlyWhenAskedAndLabelled) {
  auto stub = Stub();
  v1::GenerateRequest request = Request({5, 6, 7}, 20, "draft-model");
  request.mutable_speculation()->set_verify(v1::VERIFY_MODE_SPECDEC);
  grpc::ClientContext context;
  v1::GenerateResponse response;
  ASSERT_TRUE(stub->Generate(&context, request, &response).ok());
  EXPECT_TRUE(response.spec().lossy());
  EXPECT_EQ(response.spec().verify(), v1::VERIFY_MODE_SPECDEC);
  EXPECT_EQ(SeriesValue(server_->metrics().Text(), "specula_spec_decode_lossy_requests_total"), 1);
}

TEST_F(GenerationServiceTest, SamplingIsSeeded) {
  auto stub = Stub();
  auto sample = [&](uint64_t seed, const std::string& drafter) {
    v1::GenerateRequest request = Request({5, 6, 7}, 16, drafter);
    request.mutable_sampling()->set_temperature(1.0f);
    request.mutable_sampling()->set_top_p(0.9f);
    request.mutable_sampling()->set_seed(seed);
    grpc::ClientContext context;
    v1::GenerateResponse response;
    EXPECT_TRUE(stub->Generate(&context, request, &response).ok());
    return std::vector<int32_t>(response.token_ids().begin(), response.token_ids().end());
  };
  EXPECT_EQ(sample(1, "none"), sample(1, "none"));
  EXPECT_NE(sample(1, "none"), sample(2, "none"));
  EXPECT_EQ(sample(3, "draft-model"), sample(3, "draft-model"));
}

TEST_F(GenerationServiceTest, ServerInfoAndMetricsEndpoint) {
  auto stub = Stub();
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.model_name(), "target");
  EXPECT_EQ(info.vocab_size(), reference_->config().vocab_size);
  EXPECT_EQ(info.context_length(), 1024);
  EXPECT_EQ(std::vector<std::string>(info.drafters().begin(), info.drafters().end()),
            (std::vector<std::string>{"draft-model", "ngram"}));
  EXPECT_EQ(info.default_drafter(), "ngram");
  EXPECT_EQ(info.default_max_draft_tokens(), 3);
  EXPECT_EQ(info.limits().max_queue(), 64);
  EXPECT_EQ(info.limits().max_batch_size(), 64);
  ASSERT_EQ(info.verify_modes_size(), 3);
  EXPECT_FALSE(info.verify_modes(0).lossy());
  EXPECT_TRUE(info.verify_modes(1).lossy());
  EXPECT_GT(info.load().kv_cache_blocks_total(), 0);

  auto counter = [](const std::string& text, const std::string& name) {
    return SeriesValue(text, name);
  };
  ASSERT_GT(server_->metrics_port(), 0);
  HttpResponse before = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_EQ(before.status, 200);
  StreamResult r = Stream(*stub, Request({5, 6, 7, 8}, 10, "ngram"));
  ASSERT_TRUE(r.status.ok());
  HttpResponse after = HttpGet(server_->metrics_port(), "/metrics");
  for (const char* name :
       {"specula_spec_decode_num_drafts_total", "specula_spec_decode_num_draft_tokens_total",
        "specula_spec_decode_num_accepted_tokens_total",
        "specula_spec_decode_num_accepted_tokens_per_pos_total",
        "specula_time_to_first_token_seconds_bucket", "specula_inter_token_latency_seconds_bucket",
        "specula_e2e_request_latency_seconds_bucket", "specula_num_requests_running",
        "specula_num_requests_waiting", "specula_request_success_total",
        "specula_prompt_tokens_total", "specula_generation_tokens_total",
        "specula_kv_cache_usage_perc"}) {
    EXPECT_NE(after.body.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(counter(after.body, "specula_generation_tokens_total") -
                counter(before.body, "specula_generation_tokens_total"),
            10);
  EXPECT_EQ(counter(after.body, "specula_prompt_tokens_total") -
                counter(before.body, "specula_prompt_tokens_total"),
            4);
  EXPECT_EQ(counter(after.body, "specula_e2e_request_latency_seconds_count") -
                counter(before.body, "specula_e2e_request_latency_seconds_count"),
            1);
  EXPECT_GE(counter(after.body, "specula_spec_decode_num_draft_tokens_total"),
            counter(before.body, "specula_spec_decode_num_draft_tokens_total"));
}

}  // namespace
}  // namespace specula::router
