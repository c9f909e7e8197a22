// Runs a libFuzzer target without libFuzzer, so every GCC build's test suite fuzzes each target for
// a bounded time (tests/fuzz/README.md). It replays every seed file, then feeds seeded random
// mutations of the seeds (libFuzzer's byte-level mutations, not coverage-guided) until the time is
// up. A crash or a failed invariant (abort) leaves the input that caused it in --crash-file; the
// mutations are drawn from --seed alone, so the same seed and corpus make the same inputs.
//
//   TARGET [--seconds S] [--seed N] [--max-len BYTES] [--crash-file PATH] CORPUS_DIR_OR_FILE...
//   TARGET --crash-file /dev/null FILE   runs one input (reproduce a crash)
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional, as in libFuzzer: targets that need one-time set-up define it.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

using Bytes = std::vector<uint8_t>;

// The input being run, for the signal handler to save (only async-signal-safe calls there).
const uint8_t* g_current = nullptr;
size_t g_current_size = 0;
char g_crash_path[4096] = "";

void SaveCurrentInput(int signo) {
  if (g_crash_path[0] != '\0' && g_current != nullptr) {
    const int fd = open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      size_t done = 0;
      while (done < g_current_size) {
        const ssize_t n = write(fd, g_current + done, g_current_size - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      close(fd);
    }
    static const char kNote[] = "standalone fuzz driver: the failing input is in --crash-file\n";
    (void)!write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
  }
  signal(signo, SIG_DFL);
  raise(signo);
}

void Run(const Bytes& input) {
  g_current = input.data();
  g_current_size = input.size();
  LLVMFuzzerTestOneInput(input.data(), input.size());
  g_current = nullptr;
}

bool ReadFile(const std::filesystem::path& path, Bytes* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// One of libFuzzer's byte-level mutations (or a splice with another seed), kept under max_len.
void Mutate(Bytes& data, const std::vector<Bytes>& seeds, size_t max_len, std::mt19937_64& rng) {
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const uint8_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, '"', '{', '}', '[', ']', ':', ','};
  switch (rng() % 9) {
    case 0:  // flip a bit
      if (!data.empty()) data[below(data.size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:  // set a byte
      if (!data.empty()) data[below(data.size())] = static_cast<uint8_t>(rng());
      break;
    case 2:  // an interesting byte
      if (!data.empty()) data[below(data.size())] = kInteresting[below(std::size(kInteresting))];
      break;
    case 3: {  // insert random bytes
      const size_t n = 1 + below(8);
      Bytes ins(n);
      for (auto& b : ins) b = static_cast<uint8_t>(rng());
      data.insert(data.begin() + static_cast<std::ptrdiff_t>(below(data.size() + 1)), ins.begin(),
                  ins.end());
      break;
    }
    case 4:  // erase a range
      if (!data.empty()) {
        const size_t at = below(data.size());
        const size_t n = 1 + below(std::min<size_t>(16, data.size() - at));
        data.erase(data.begin() + static_cast<std::ptrdiff_t>(at),
                   data.begin() + static_cast<std::ptrdiff_t>(at + n));
      }
      break;
    case 5:  // duplicate a range
      if (!data.empty()) {
        const size_t at = below(data.size());
        const size_t n = 1 + below(std::min<size_t>(32, data.size() - at));
        const Bytes copy(data.begin() + static_cast<std::ptrdiff_t>(at),
                         data.begin() + static_cast<std::ptrdiff_t>(at + n));
        data.insert(data.begin() + static_cast<std::ptrdiff_t>(below(data.size() + 1)),
                    copy.begin(), copy.end());
      }
      break;
    case 6:  // truncate
      data.resize(below(data.size() + 1));
      break;
    case 7: {  // overwrite with a little-endian integer at a boundary
      static const uint64_t kValues[] = {
          0, 1, 0x7f, 0xff, 0x7fff, 0xffff, 0x7fffffff, 0xffffffff, 0x7fffffffffffffffull, ~0ull};
      const uint64_t v = kValues[below(std::size(kValues))];
      const size_t width = size_t{1} << below(4);
      if (data.size() >= width) {
        const size_t at = below(data.size() - width + 1);
        for (size_t i = 0; i < width; ++i) data[at + i] = static_cast<uint8_t>(v >> (8 * i));
      }
      break;
    }
    default: {  // splice: this input's head with another seed's tail
      const Bytes& other = seeds[below(seeds.size())];
      const size_t head = below(data.size() + 1);
      const size_t from = below(other.size() + 1);
      data.resize(head);
      data.insert(data.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
      break;
    }
  }
  if (data.size() > max_len) data.resize(max_len);
}

[[noreturn]] void Usage(const char* argv0, const char* why) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--seconds S] [--seed N] [--max-len BYTES] [--crash-file PATH] "
               "CORPUS_DIR_OR_FILE...\n",
               argv0, why, argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  double seconds = 0;
  uint64_t seed = 1;
  size_t max_len = 65536;
  std::string crash_file;
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(argv[0], (arg + " needs a value").c_str());
      return argv[++i];
    };
    char* end = nullptr;
    if (arg == "--seconds") {
      const std::string v = value();
      seconds = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(seconds >= 0)) Usage(argv[0], "--seconds must be a number >= 0");
    } else if (arg == "--seed") {
      const std::string v = value();
      seed = std::strtoull(v.c_str(), &end, 10);
      if (*end != '\0') Usage(argv[0], "--seed must be an unsigned integer");
    } else if (arg == "--max-len") {
      const std::string v = value();
      max_len = std::strtoull(v.c_str(), &end, 10);
      if (*end != '\0' || max_len == 0) Usage(argv[0], "--max-len must be a positive integer");
    } else if (arg == "--crash-file") {
      crash_file = value();
    } else if (arg.rfind("--", 0) == 0) {
      Usage(argv[0], ("unknown flag " + arg).c_str());
    } else {
      inputs.emplace_back(arg);
    }
  }
  if (inputs.empty()) Usage(argv[0], "no corpus directory or file");
  if (crash_file.size() >= sizeof(g_crash_path)) Usage(argv[0], "--crash-file path too long");
  std::strcpy(g_crash_path, crash_file.c_str());
  for (int signo : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(signo, SaveCurrentInput);

  std::vector<Bytes> seeds;
  for (const auto& input : inputs) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(input)) {
      for (const auto& entry : std::filesystem::directory_iterator(input)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());  // the same order, so a seed reproduces a run
    } else {
      files.push_back(input);
    }
    for (const auto& file : files) {
      Bytes bytes;
      if (!ReadFile(file, &bytes)) Usage(argv[0], ("cannot read " + file.string()).c_str());
      seeds.push_back(std::move(bytes));
    }
  }
  if (seeds.empty()) Usage(argv[0], "the corpus is empty");
  for (const Bytes& s : seeds) Run(s);
  std::fprintf(stderr, "replayed %zu seed inputs\n", seeds.size());

  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  Bytes data;
  while (std::chrono::steady_clock::now() < deadline) {
    // A few stacked mutations of one seed per run, as libFuzzer does.
    data = seeds[rng() % seeds.size()];
    const int depth = 1 + static_cast<int>(rng() % 5);
    for (int d = 0; d < depth; ++d) Mutate(data, seeds, max_len, rng);
    Run(data);
    ++runs;
  }
  std::fprintf(stderr, "ran %llu mutated inputs in %.1f s (seed %llu)\n",
               static_cast<unsigned long long>(runs), seconds,
               static_cast<unsigned long long>(seed));
  return 0;
}
