// Certificates for the TLS tests, generated at test time with Debian's `openssl` CLI (EC P-256,
// valid one day): a CA, a certificate it signed for 127.0.0.1 / localhost usable as server and as
// client, and a second, unrelated CA with its own such certificate (the "wrong" one).
#pragma once

#include <string>

namespace specula {

struct TestCerts {
  std::string ca, cert, key;                    // paths (PEM)
  std::string other_ca, other_cert, other_key;  // signed by an unrelated CA
};

// Generated once per process into a directory removed at exit. Null with the reason in `error`
// when openssl is missing or fails (tests then skip with that reason).
const TestCerts* GetTestCerts(std::string* error);

// The contents of a file ("" if it cannot be read).
std::string ReadTextFile(const std::string& path);

}  // namespace specula
