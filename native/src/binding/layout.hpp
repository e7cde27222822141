// Pure functions of the protocol's layouts for JS: `layout(ep, worldSize)` (every offset, so tests
// check the layout the executors use, not a copy of it), `alignment`, and `closeFds`.
#pragma once

#include <napi.h>

namespace rankflow::binding {
void RegisterLayout(Napi::Env env, Napi::Object exports);
}
