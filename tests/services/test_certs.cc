#include "tests/services/test_certs.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace specula {
namespace {

// Runs a shell command quietly; its output goes to `log`.
bool Run(const std::string& command, const std::string& log) {
  return std::system((command + " >>" + log + " 2>&1").c_str()) == 0;
}

struct CertDir {
  std::filesystem::path path;
  ~CertDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

// A CA `name` and a certificate it signed, `name`-node, for 127.0.0.1 and localhost with both
// serverAuth and clientAuth.
bool MakeCaAndNode(const std::string& dir, const std::string& name, const std::string& log) {
  const std::string d = dir + "/";
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::ofstream(d + "node.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                   "basicConstraints=CA:FALSE\n"
                                   "keyUsage=digitalSignature,keyEncipherment\n"
                                   "extendedKeyUsage=serverAuth,clientAuth\n";
  return Run("openssl req -x509 " + ec + " -keyout " + d + name + "-ca.key -out " + d + name +
                 "-ca.pem -days 1 -subj '/CN=Specula test " + name + " CA'",
             log) &&
         Run("openssl req " + ec + " -keyout " + d + name + "-node.key -out " + d + name +
                 "-node.csr -subj '/CN=localhost'",
             log) &&
         Run("openssl x509 -req -in " + d + name + "-node.csr -CA " + d + name + "-ca.pem -CAkey " +
                 d + name + "-ca.key -CAcreateserial -out " + d + name +
                 "-node.pem -days 1 -extfile " + d + "node.ext",
             log);
}

}  // namespace

const TestCerts* GetTestCerts(std::string* error) {
  static std::string failure;
  static const std::unique_ptr<TestCerts> certs = [] {
    std::unique_ptr<TestCerts> out;
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
      failure = "openssl is not installed (apt-get install openssl; scripts/setup.sh lists it)";
      return out;
    }
    static CertDir dir;
    dir.path =
        std::filesystem::temp_directory_path() / ("specula-certs-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir.path);
    const std::string d = dir.path.string();
    const std::string log = d + "/openssl.log";
    if (!MakeCaAndNode(d, "good", log) || !MakeCaAndNode(d, "other", log)) {
      failure = "openssl failed: " + ReadTextFile(log);
      return out;
    }
    out = std::make_unique<TestCerts>();
    out->ca = d + "/good-ca.pem";
    out->cert = d + "/good-node.pem";
    out->key = d + "/good-node.key";
    out->other_ca = d + "/other-ca.pem";
    out->other_cert = d + "/other-node.pem";
    out->other_key = d + "/other-node.key";
    return out;
  }();
  if (!certs && error) *error = failure;
  return certs.get();
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace specula
