// The engine codec's step results: finish reasons travel as their names (FinishReasonName), so the
// field's wire format is what it was when it carried strings; an unknown name ends that request
// alone, with INVALID_ARGUMENT naming the field.
#include "services/common/engine_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace specula::services {
namespace {

using ::testing::HasSubstr;

TEST(EngineCodecTest, FinishReasonsRoundTripAsTheirNames) {
  StepOutcome outcome;
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled,
                         FinishReason::kError}) {
    outcome.report.updates.push_back(
        {.id = static_cast<RequestId>(outcome.report.updates.size() + 1),
         .finished = true,
         .finish_reason = r,
         .error = r == FinishReason::kError ? InternalError("boom") : OkStatus()});
  }
  outcome.report.updates.push_back({.id = 9, .new_tokens = {5, 6}});  // not finished
  v1::StepResult message;
  ToProto(outcome, &message);
  ASSERT_EQ(message.updates_size(), 5);
  EXPECT_EQ(message.updates(0).finish_reason(), "stop");
  EXPECT_EQ(message.updates(1).finish_reason(), "length");
  EXPECT_EQ(message.updates(2).finish_reason(), "cancelled");
  EXPECT_EQ(message.updates(3).finish_reason(), "error");
  EXPECT_EQ(message.updates(4).finish_reason(), "");  // as before: only finished updates name one

  StepOutcome back = FromProto(message);
  ASSERT_EQ(back.report.updates.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(back.report.updates[i].finished) << i;
    EXPECT_EQ(back.report.updates[i].finish_reason, outcome.report.updates[i].finish_reason) << i;
  }
  EXPECT_EQ(back.report.updates[3].error, InternalError("boom"));
  EXPECT_FALSE(back.report.updates[4].finished);
}

TEST(EngineCodecTest, AnUnknownFinishReasonEndsThatRequestWithInvalidArgument) {
  v1::StepResult message;
  v1::EngineUpdate* ok = message.add_updates();
  ok->set_request_id(1);
  ok->set_finished(true);
  ok->set_finish_reason("length");
  v1::EngineUpdate* bad = message.add_updates();
  bad->set_request_id(2);
  bad->set_finished(true);
  bad->set_finish_reason("exploded");

  StepOutcome back = FromProto(message);
  ASSERT_EQ(back.report.updates.size(), 2u);
  EXPECT_EQ(back.report.updates[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(back.report.updates[0].error.ok());
  const RequestUpdate& u = back.report.updates[1];
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, FinishReason::kError);
  EXPECT_EQ(u.error.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(u.error.message(), HasSubstr("updates[1].finish_reason"));
  EXPECT_THAT(u.error.message(), HasSubstr("'exploded'"));
}

}  // namespace
}  // namespace specula::services
