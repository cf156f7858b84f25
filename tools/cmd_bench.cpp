// TEMPORARY placeholder while the real command is written (replaced this session).
#include "commands.h"
namespace flashoverlap::cli {
void add_bench_command(CLI::App& app, int& rc) { (void)app; (void)rc; }
}
