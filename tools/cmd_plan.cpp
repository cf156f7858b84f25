// TEMPORARY placeholder while the real command is written (replaced this session).
#include "commands.h"
namespace flashoverlap::cli {
void add_plan_command(CLI::App& app, int& rc) { (void)app; (void)rc; }
}
namespace flashoverlap::cli {
int print_plan(const PlanOptions&, std::ostream&) { return 0; }
}
