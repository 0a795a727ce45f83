// The rows family in descending order (rows.h).
#include "rows.h"

namespace linrec::cpu_launch {

template void forward_rows<Order::Descending>(const ForwardParams& params, Isa isa);
template void backward_rows<Order::Descending>(const BackwardParams& params, Isa isa);

}  // namespace linrec::cpu_launch
