// ThreadSanitizer's default suppressions for LBCC binaries (read only under -fsanitize=thread).
//
// Debian's Abseil is a prebuilt shared library without TSan instrumentation: TSan sees neither
// the atomic reference counts of absl::Status / absl::Cord nor absl::Mutex, so it reports races
// on memory those synchronise (a Status copied to another thread and destroyed there, say).
// Races whose stacks pass through Abseil's libraries are suppressed; LBCC's own locking uses
// lbcc::Mutex (base/mutex.h), which TSan sees.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libabsl_status.so\n"
         "race:libabsl_cord.so\n"
         "race:libabsl_cord_internal.so\n"
         "race:absl::debian3::Status::UnrefNonInlined\n"
         // The same, where the uninstrumented UnrefNonInlined frame is missing from the stack
         // and the delete shows under the inline Status::Unref that called it.
         "race:absl::debian3::Status::Unref\n"
         // glibc's dynamic TLS blocks (the thread-locals of UCX, loaded with dlmopen into a
         // namespace of its own) are allocated and freed by ld.so under its own lock, which TSan
         // does not see: a thread's exit freeing its block and another thread's first access
         // allocating one at the same address are reported as a race.
         "race:_dl_deallocate_tls\n";
}
