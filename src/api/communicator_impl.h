// communicator_impl.h — what a flashoverlap::Communicator holds (internal to
// the library's API files).
#pragma once
#include "flashoverlap/flashoverlap.h"
#include "runtime/core/communicator.h"

namespace flashoverlap {

struct Communicator::Impl {
  rt::Communicator comm;  // adopted (not owned) or created here (owned)
};

}  // namespace flashoverlap
