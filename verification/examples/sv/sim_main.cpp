// Verilator's main for tb.sv: the testbench runs in one initial block.
#include <memory>

#include "Vtb.h"
#include "verilated.h"

int main(int argc, char **argv) {
  auto context = std::make_unique<VerilatedContext>();
  context->commandArgs(argc, argv);
  auto top = std::make_unique<Vtb>(context.get());
  while (!context->gotFinish()) {
    top->eval();
    if (!top->eventsPending()) break;
    context->time(top->nextTimeSlot());
  }
  top->final();
  return 0;
}
