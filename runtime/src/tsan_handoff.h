// Tells ThreadSanitizer about hand-offs that happen inside libzmq, which is not instrumented: an
// object made by the sending thread and freed by libzmq's I/O thread through a free callback.
// Invariant: with TSan off these are empty inline functions (no cost, no behaviour change).
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TROUPE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TROUPE_TSAN 1
#endif
#endif

#if defined(TROUPE_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace troupe::runtime {

// The thread that passes `p` to libzmq calls this after writing *p...
inline void tsan_handoff_release(const void* p) {
#if defined(TROUPE_TSAN)
  __tsan_release(const_cast<void*>(p));
#else
  (void)p;
#endif
}

// ...and libzmq's free callback calls this before reading or freeing *p.
inline void tsan_handoff_acquire(const void* p) {
#if defined(TROUPE_TSAN)
  __tsan_acquire(const_cast<void*>(p));
#else
  (void)p;
#endif
}

}  // namespace troupe::runtime
