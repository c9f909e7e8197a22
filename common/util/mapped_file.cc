#include "common/util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace specula {

StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(StrCat("file not found: ", path));
    return InternalError(StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return InternalError(StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return InternalError(StrCat("cannot mmap ", path, ": ", std::strerror(err)));
    }
    data = static_cast<uint8_t*>(addr);
  }
  ::close(fd);
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return NotFoundError(StrCat("file not found: ", path));
    return PermissionDeniedError(StrCat("cannot read file: ", path));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status WriteStringToFile(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return InternalError(StrCat("cannot write file: ", tmp));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) return InternalError(StrCat("short write: ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return InternalError(StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return OkStatus();
}

}  // namespace specula
