// LoadTlsFiles: which flag combinations are accepted and what the errors name (the credentials
// themselves are exercised against real servers in tls_serve_test).
#include "services/common/tls.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/services/test_certs.h"
#include "tests/testing/temp_dir.h"

namespace specula::services {
namespace {

TEST(TlsTest, NothingGivenMeansInsecure) {
  auto pem = LoadTlsFiles({}, "tls", false);
  ASSERT_TRUE(pem.ok());
  EXPECT_TRUE(pem->cert.empty() && pem->key.empty() && pem->ca.empty());
  EXPECT_TRUE(LoadTlsFiles({}, "peer-tls", true).ok());
}

TEST(TlsTest, ReadsThePemFiles) {
  std::string error;
  const TestCerts* certs = GetTestCerts(&error);
  if (certs == nullptr) GTEST_SKIP() << error;
  auto pem = LoadTlsFiles({certs->cert, certs->key, certs->ca}, "peer-tls", true);
  ASSERT_TRUE(pem.ok()) << pem.status();
  EXPECT_EQ(pem->cert, ReadTextFile(certs->cert));
  EXPECT_EQ(pem->key, ReadTextFile(certs->key));
  EXPECT_EQ(pem->ca, ReadTextFile(certs->ca));
  EXPECT_NE(TlsServerCredentials(*pem), nullptr);
  EXPECT_NE(TlsChannelCredentials(*pem), nullptr);
  EXPECT_TRUE(LoadTlsFiles({certs->cert, certs->key, ""}, "tls", false).ok());
}

TEST(TlsTest, ErrorsNameTheFlag) {
  TempDir dir;
  std::ofstream(dir.File("cert.pem"))
      << "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n";
  std::ofstream(dir.File("key.pem"))
      << "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n";
  std::ofstream(dir.File("junk")) << "junk";
  const std::string cert = dir.File("cert.pem"), key = dir.File("key.pem");
  struct Case {
    TlsFiles files;
    bool all;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{cert, "", ""}, false, "--tls-cert and --tls-key go together"},
      {{"", key, ""}, false, "--tls-cert and --tls-key go together"},
      {{"", "", cert}, false, "--tls-ca (client certificates) needs"},
      {{cert, key, ""}, true, "give all three or none"},
      {{dir.File("none"), key, ""}, false, "--tls-cert: cannot read"},
      {{dir.File("junk"), key, ""}, false, "--tls-cert: '"},
      {{cert, cert, ""}, false, "--tls-key: '"},
      {{cert, key, key}, false, "--tls-ca: '"},
  };
  for (const Case& c : cases) {
    auto pem = LoadTlsFiles(c.files, "tls", c.all);
    ASSERT_FALSE(pem.ok()) << c.message;
    EXPECT_EQ(pem.status().code(), StatusCode::kInvalidArgument);
    const std::string want =
        c.all ? std::string("--tls-cert, --tls-key and --tls-ca go together") : c.message;
    EXPECT_NE(pem.status().message().find(c.all ? "give all three or none" : c.message),
              std::string::npos)
        << want << " / " << pem.status();
  }
}

}  // namespace
}  // namespace specula::services
