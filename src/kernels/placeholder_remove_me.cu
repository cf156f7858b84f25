// TEMPORARY: keeps fo_kernels non-empty until the kernels land.
namespace flashoverlap::kernels { int placeholder_symbol = 0; }
