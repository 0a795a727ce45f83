// The rows family in ascending order (rows.h).
#include "rows.h"

namespace linrec::cpu_launch {

template void forward_rows<Order::Ascending>(const ForwardParams& params, Isa isa);
template void backward_rows<Order::Ascending>(const BackwardParams& params, Isa isa);

}  // namespace linrec::cpu_launch
