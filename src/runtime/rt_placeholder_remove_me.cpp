// TEMPORARY: keeps fo_runtime non-empty until the runtime lands.
namespace flashoverlap::rt { int placeholder_symbol = 0; }
