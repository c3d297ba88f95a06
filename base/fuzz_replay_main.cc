// Runs a libFuzzer target over files, without libFuzzer: each argument is a file or a folder
// of files, and every file is passed once to LLVMFuzzerTestOneInput. This makes every fuzz
// target's seed corpus (and every crash once found and checked in) a regression test in the
// ordinary test suite; `--config=fuzz` links the real libFuzzer instead (see tools/defs.bzl).
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void CollectFiles(const std::string& path, std::vector<std::string>* files) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return;
  if (S_ISREG(info.st_mode)) {
    files->push_back(path);
    return;
  }
  if (!S_ISDIR(info.st_mode)) return;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    CollectFiles(path + "/" + name, files);
  }
  closedir(dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) CollectFiles(argv[i], &files);
  if (files.empty()) {
    std::fprintf(stderr, "fuzz replay: no input files under the given paths\n");
    return 1;
  }
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("fuzz replay: %zu inputs ran without a failure\n", files.size());
  return 0;
}
