// TEMPORARY placeholder (replaced this session).
#include <benchmark/benchmark.h>
BENCHMARK_MAIN();
