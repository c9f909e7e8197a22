// common/drafters/drafter_registry.h: the built-in families and their names, flags and errors,
// the load context (the target loaded once, on demand), and a family added from outside.
#include "common/drafters/drafter_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/drafters/beagle/beagle_drafter.h"
#include "common/drafters/draft_model_drafter.h"
#include "common/drafters/draft_vocab.h"
#include "common/model/cpu_kernels.h"
#include "common/model/transformer.h"
#include "common/util/mapped_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DrafterRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_dir_ = tmp_.File("target");
    ASSERT_TRUE(
        SaveModelDir(*MakeTinyModel(TinyModelConfig(), 3), TinyModelConfig(), target_dir_).ok());
    registry_.RegisterFlags(flags_);
  }
  // Loads `name` after parsing `args`, with the target in this process.
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          const std::vector<std::string>& args = {}) {
    RETURN_IF_ERROR(flags_.Parse(args));
    auto target = ModelRunner::Load(target_dir_, {});
    EXPECT_TRUE(target.ok()) << target.status();
    DrafterLoadContext context(**target, {});
    return registry_.Load(name, context);
  }

  TempDir tmp_;
  std::string target_dir_;
  DrafterRegistry registry_ = BuiltinDrafterRegistry();
  FlagSet flags_{"test"};
};

TEST_F(DrafterRegistryTest, NamesEveryBuiltinVariantInOrder) {
  EXPECT_THAT(registry_.Names(), ElementsAre("ngram", "draft-model", "specformer", "beagle",
                                             "beagle-chain", "parallelspec", "parallelspec-chain",
                                             "parallelspec-static", "parallelspec-ar", "specdec"));
  EXPECT_THAT(registry_.Describe(), HasSubstr("beagle (EAGLE-2 dynamic tree)"));
  ASSERT_NE(registry_.Find("beagle-chain"), nullptr);
  EXPECT_EQ(registry_.Find("beagle-chain")->family(), "beagle");
  EXPECT_EQ(registry_.Find("medusa"), nullptr);
  EXPECT_NE(flags_.Usage().find("--beagle-depth"), std::string::npos);
  EXPECT_NE(flags_.Usage().find("--ngram-max"), std::string::npos);
}

// --draft-vocab: a missing or bad file, or one made for another vocabulary, names the flag.
TEST_F(DrafterRegistryTest, DraftVocabErrorsNameTheFlag) {
  auto missing = Load("ngram", {"--draft-vocab=" + tmp_.File("none.json")});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--draft-vocab"));
  DraftVocab other = DraftVocab::FromCounts(std::vector<int64_t>(4096, 1), 16, "");
  ASSERT_TRUE(WriteStringToFile(tmp_.File("other.json"), other.ToJson()).ok());
  auto wrong = Load("ngram", {"--draft-vocab=" + tmp_.File("other.json")});
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("--draft-vocab"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("made for a vocabulary of 4096 tokens"));
}

TEST_F(DrafterRegistryTest, UnknownNamesAndMissingCheckpointsNameTheFlag) {
  auto unknown = Load("medusa");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown drafter 'medusa' (ngram, "));
  const std::vector<std::pair<std::string, std::string>> needs = {
      {"draft-model", "--drafter-model"},
      {"specformer", "--specformer-model"},
      {"beagle", "--beagle-model"},
      {"beagle-chain", "--beagle-model"},
      {"parallelspec", "--parallelspec-model"},
      {"parallelspec-chain", "--parallelspec-model"},
      {"specdec", "--specdec-model"}};
  for (const auto& [name, flag] : needs) {
    auto d = Load(name);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(d.status().message(), HasSubstr(flag)) << name;
  }
  auto missing_tree = Load("parallelspec-static", {"--parallelspec-model", tmp_.File("ps")});
  EXPECT_THAT(missing_tree.status().message(), HasSubstr("--parallelspec-static-tree"));
  auto absent = Load("beagle", {"--beagle-model", tmp_.File("nothing-here")});
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr("--beagle-model"));
  auto bad_ngram = Load("ngram", {"--ngram-min=5", "--ngram-max=2"});
  EXPECT_EQ(bad_ngram.status().code(), StatusCode::kInvalidArgument);
  auto bad_repeat = Load("ngram", {"--ngram-repeat-min-match=-1"});
  EXPECT_EQ(bad_repeat.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_repeat.status().message(), HasSubstr("--ngram-repeat-min-match"));
  auto bad_width = Load("draft-model", {"--drafter-model", target_dir_, "--tree-width=0"});
  EXPECT_THAT(bad_width.status().message(), HasSubstr("--tree-width"));
  auto bad_context = Load("draft-model", {"--drafter-model", target_dir_, "--tree-width=1",
                                          "--draft-model-context=-1"});
  EXPECT_EQ(bad_context.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_context.status().message(), HasSubstr("--draft-model-context"));
  auto bad_matmul = Load("draft-model", {"--draft-model-context=0", "--drafter-matmul=fp8"});
  EXPECT_EQ(bad_matmul.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_matmul.status().message(), HasSubstr("--drafter-matmul"));
  EXPECT_THAT(bad_matmul.status().message(), HasSubstr("fp8"));
}

TEST_F(DrafterRegistryTest, LoadsWithTheFlagsAndReportsThemInSettings) {
  auto ngram = Load("ngram", {"--ngram-max=6"});
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  EXPECT_EQ((*ngram)->name(), "ngram");
  // The draft LM: any model of the target's vocabulary (here the target itself).
  auto draft = Load("draft-model",
                    {"--drafter-model", target_dir_, "--tree-width=2", "--draft-model-context=64"});
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ((*draft)->name(), "draft-model");
  // int8 by default, where the CPU has AVX-512.
  EXPECT_EQ(static_cast<DraftModelDrafter&>(**draft).model().draft_matmul(),
            Int8MatmulRuns() ? DraftMatmul::kInt8 : DraftMatmul::kFloat32);
  const nlohmann::json s = registry_.Settings();
  EXPECT_EQ(s["matmul"], "int8");
  EXPECT_EQ(s["ngram"]["max"], 6);
  EXPECT_EQ(s["draft-model"]["tree_width"], 2);
  EXPECT_EQ(s["draft-model"]["context"], 64);
  EXPECT_EQ(s["draft-model"]["model"], target_dir_);
  EXPECT_EQ(s["beagle"]["depth"], BeagleDrafterOptions{}.depth);  // the default
  EXPECT_TRUE(s.contains("specdec") && s.contains("parallelspec") && s.contains("specformer"));
}

// --drafter-matmul bfloat16 and float32 reach the draft LM's runner (where the CPU can run them)
// and the settings.
TEST_F(DrafterRegistryTest, DrafterMatmulReachesTheDraftLm) {
  auto draft = Load("draft-model", {"--drafter-model", target_dir_, "--drafter-matmul=bfloat16"});
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ(static_cast<DraftModelDrafter&>(**draft).model().draft_matmul(),
            Bf16MatmulRuns() ? DraftMatmul::kBfloat16 : DraftMatmul::kFloat32);
  EXPECT_EQ(registry_.Settings()["matmul"], "bfloat16");
}

TEST_F(DrafterRegistryTest, Float32DrafterMatmulReachesTheDraftLm) {
  auto draft = Load("draft-model", {"--drafter-model", target_dir_, "--drafter-matmul=float32"});
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ(static_cast<DraftModelDrafter&>(**draft).model().draft_matmul(), DraftMatmul::kFloat32);
  EXPECT_EQ(registry_.Settings()["matmul"], "float32");
}

TEST_F(DrafterRegistryTest, ContextLoadsTheTargetOnceAndOnlyWhenAsked) {
  DrafterLoadContext context(TinyModelConfig(), target_dir_, {});
  auto first = context.target("beagle");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = context.target("beagle");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, *second);
  DrafterLoadContext nowhere(TinyModelConfig(), tmp_.File("missing"), {});
  EXPECT_EQ(nowhere.target("beagle").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(nowhere.target("beagle").status().message(), HasSubstr("--model (beagle's target)"));
  DrafterLoadContext none(TinyModelConfig(), "", {});
  EXPECT_EQ(none.target("specformer").status().code(), StatusCode::kInvalidArgument);
}

// A family registered from outside common/drafters is loaded like a built-in one.
class EchoFamily : public DrafterFamily {
 public:
  std::string family() const override { return "echo"; }
  std::vector<DrafterVariant> Variants() const override { return {{"echo", "test"}}; }
  void RegisterFlags(FlagSet& flags) override { flags.AddInt("echo-n", &n_, "n"); }
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string&, DrafterLoadContext&) const override {
    return InvalidArgumentError(StrCat("echo ", n_));
  }
  nlohmann::json Settings() const override { return {{"n", n_}}; }

 private:
  int64_t n_ = 1;
};

TEST(DrafterRegistryExtensionTest, AnAddedFamilyIsFoundParsedAndLoaded) {
  DrafterRegistry registry;
  registry.Add(std::make_unique<EchoFamily>());
  FlagSet flags("test");
  registry.RegisterFlags(flags);
  ASSERT_TRUE(flags.Parse({"--echo-n=4"}).ok());
  EXPECT_THAT(registry.Names(), ElementsAre("echo"));
  DrafterLoadContext context(TinyModelConfig(), "", {});
  EXPECT_EQ(registry.Load("echo", context).status().message(), "echo 4");
  EXPECT_EQ(registry.Settings()["echo"]["n"], 4);
}

// What a drafter was asked, for the warm-up tests.
struct CallLog {
  std::vector<std::string> calls;
  std::set<SeqId> held;  // added, not released
};

// A drafter of one hidden layer that logs its calls (and fails its Propose when told to).
class LoggingDrafter : public Drafter {
 public:
  LoggingDrafter(std::shared_ptr<CallLog> log, bool fail) : log_(std::move(log)), fail_(fail) {}
  std::string name() const override { return "logged"; }
  const std::vector<int64_t>& hidden_layers() const override { return layers_; }
  std::vector<int64_t> layers_ = {2};
  Status AddSequence(SeqId seq, const SamplingParams&) override {
    log_->calls.push_back("add");
    log_->held.insert(seq);
    return OkStatus();
  }
  void ReleaseSequence(SeqId seq) override {
    log_->calls.push_back("release");
    log_->held.erase(seq);
  }
  Status Observe(const std::vector<DrafterObservation>& observations) override {
    for (const DrafterObservation& o : observations) {
      std::string call = StrCat("observe ", o.tokens.size(), " tokens");
      for (const at::Tensor& h : o.hidden) {
        call += StrCat(" [", h.size(0), ", ", h.size(1), "] ", h.dtype().name());
      }
      log_->calls.push_back(call);
    }
    return OkStatus();
  }
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& r) override {
    log_->calls.push_back(StrCat("propose ", r.size(), " x ", r[0].max_nodes, " nodes"));
    if (fail_) return InternalError("no drafts today");
    return std::vector<CandidateTree>(r.size());
  }

 private:
  std::shared_ptr<CallLog> log_;
  bool fail_;
};

class LoggingFamily : public DrafterFamily {
 public:
  explicit LoggingFamily(std::shared_ptr<CallLog> log) : log_(std::move(log)) {}
  std::string family() const override { return "logged"; }
  std::vector<DrafterVariant> Variants() const override {
    return {{"logged", "test"}, {"logged-failing", "test"}};
  }
  void RegisterFlags(FlagSet&) override {}
  StatusOr<std::unique_ptr<Drafter>> Load(const std::string& name,
                                          DrafterLoadContext&) const override {
    return std::unique_ptr<Drafter>(new LoggingDrafter(log_, name == "logged-failing"));
  }
  nlohmann::json Settings() const override { return nlohmann::json::object(); }

 private:
  std::shared_ptr<CallLog> log_;
};

// Every loaded drafter runs once on a throwaway sequence (a prompt with the target's hidden
// width, a draft, a steady step, a draft) and holds nothing of it after; one that cannot draft
// fails to load, naming itself and the warm-up.
TEST(DrafterRegistryExtensionTest, LoadedDraftersAreWarmedUpAndKeepNothing) {
  auto log = std::make_shared<CallLog>();
  DrafterRegistry registry;
  registry.Add(std::make_unique<LoggingFamily>(log));
  DrafterLoadContext context(TinyModelConfig(), "", {});
  auto drafter = registry.Load("logged", context);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::string width = std::to_string(TinyModelConfig().hidden_size);
  EXPECT_THAT(
      log->calls,
      ElementsAre("add", "observe 64 tokens [63, " + width + "] float", "propose 1 x 8 nodes",
                  "observe 2 tokens [2, " + width + "] float", "propose 1 x 8 nodes", "release"));
  EXPECT_TRUE(log->held.empty());

  log->calls.clear();
  auto failing = registry.Load("logged-failing", context);
  EXPECT_EQ(failing.status().code(), StatusCode::kInternal);
  EXPECT_THAT(failing.status().message(), HasSubstr("drafter 'logged' warm-up"));
  EXPECT_THAT(failing.status().message(), HasSubstr("no drafts today"));
  EXPECT_TRUE(log->held.empty());  // released after the failure too
}

}  // namespace
}  // namespace specula
