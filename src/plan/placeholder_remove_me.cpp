// TEMPORARY: keeps fo_plan non-empty until the planner sources land.
namespace flashoverlap::plan { int placeholder_symbol = 0; }
