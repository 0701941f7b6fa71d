#include "formats/base/thread_name.h"

#include <pthread.h>

namespace ckpt::store {

void name_store_thread(const char* name) {
  thread_local const char* current = nullptr;
  if (current == name) return;
  current = name;
  (void)pthread_setname_np(pthread_self(), name);
}

}  // namespace ckpt::store
