// TEMPORARY placeholder (replaced this session).
#include <ostream>
namespace flashoverlap::cli {
int run_default_job(std::ostream& out) { (void)out; return 0; }
}
