// ScopedEnv: tests set an environment variable for one scope and get the previous state back.
//
//   ScopedEnv timeout("LBCC_TIMEOUT_S", "2");       // set
//   ScopedEnv algo("LBCC_ALGO", nullptr);           // unset
//
// Thread-safety: setenv is not thread-safe; use it where no other thread reads the environment
// (before ranks start, or while they wait).
#ifndef LBCC_BASE_SCOPED_ENV_H_
#define LBCC_BASE_SCOPED_ENV_H_

#include <cstdlib>
#include <string>

namespace lbcc::testing {

class ScopedEnv {
 public:
  // `value` nullptr: unset.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // Changes the value again within the scope (nullptr: unset).
  void Set(const char* value) {
    if (value != nullptr) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace lbcc::testing

#endif  // LBCC_BASE_SCOPED_ENV_H_
