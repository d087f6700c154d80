// What this binary was built from, for `foundry --version` and the provenance of measurements.
#pragma once

namespace foundry {

// The source tree's git commit (12 hex digits), with "+changes" when tracked files differed
// from it at build time; "unknown" when built outside a git checkout. Written by
// cmake/build_info.cmake at every build.
const char* build_commit();

}  // namespace foundry
