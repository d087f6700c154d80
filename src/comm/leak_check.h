// Excluding the MPI library's own never-freed allocations from leak checking.
//
// Open MPI keeps process-lifetime state from MPI_Init and MPI_T_init that it never frees,
// and allocates more in MPI_Finalize and in some MPI_T calls (variable values, enumeration
// names), partly from plugins it unloads before exit, so LeakSanitizer's reports of them
// cannot even be matched by library name in a suppression list. None of that is ours.
// LeakSanitizer never reports allocations made while it is disabled on the allocating
// thread, so those calls run inside a LeakCheckPause scope; every allocation of Foundry's
// own, including everything between MPI_Init and MPI_Finalize, is still checked. Outside
// sanitizer builds this is an empty scope.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace foundry {

struct LeakCheckPause {
#if defined(__SANITIZE_ADDRESS__)
  LeakCheckPause() { __lsan_disable(); }
  ~LeakCheckPause() { __lsan_enable(); }
#else
  LeakCheckPause() {}
  ~LeakCheckPause() {}  // non-trivial, so a scope guard is not an "unused variable"
#endif
  LeakCheckPause(const LeakCheckPause&) = delete;
  LeakCheckPause& operator=(const LeakCheckPause&) = delete;
};

}  // namespace foundry
