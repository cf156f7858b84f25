// version.cpp — flashoverlap::version(): the project's version, which
// src/api/CMakeLists.txt passes as FO_VERSION (project(... VERSION ...)).
#include "flashoverlap/flashoverlap.h"

#ifndef FO_VERSION
#error "FO_VERSION is defined by src/api/CMakeLists.txt"
#endif

const char* flashoverlap::version() { return FO_VERSION; }
