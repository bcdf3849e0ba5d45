// The C side of the SystemVerilog testbench: host memory callbacks that reach the
// testbench's memory through its exported DPI functions, and the wire between two ports.
// Everything else the testbench imports straight from librnicvip (rnicvip.h): its
// functions take only pointers and fixed-width scalars.
#include <cstdint>
#include <cstring>
#include <vector>

#include "svdpi.h"
#include "rnicvip.h"

// Exported by tb.sv (declared here rather than through Verilator's tb header, whose
// declarations of the imported rnic_vip_* functions use DPI's own integer types).
extern "C" unsigned char sv_mem_read8(int id, unsigned long long address);
extern "C" void sv_mem_write8(int id, unsigned long long address, unsigned char value);

namespace {

struct Memory {
  int id;
  svScope scope;
};

int32_t dma_read(void *context, uint64_t address, uint8_t *data, size_t length) {
  Memory *memory = static_cast<Memory *>(context);
  svSetScope(memory->scope);
  for (size_t i = 0; i < length; i++) data[i] = sv_mem_read8(memory->id, address + i);
  return 0;
}

int32_t dma_write(void *context, uint64_t address, const uint8_t *data, size_t length) {
  Memory *memory = static_cast<Memory *>(context);
  svSetScope(memory->scope);
  for (size_t i = 0; i < length; i++) sv_mem_write8(memory->id, address + i, data[i]);
  return 0;
}

}  // namespace

// A device whose host memory is the testbench's memory `memory_id`; NULL on error
// (rnic_vip_last_error says why).
extern "C" void *rnic_dpi_create(const char *config, int memory_id) {
  Memory *memory = new Memory{memory_id, svGetScope()};
  rnic_vip_host_memory host = {memory, dma_read, dma_write};
  rnic_vip_device *device = nullptr;
  if (rnic_vip_create(config, &host, &device) != RNIC_VIP_OK) {
    delete memory;
    return nullptr;
  }
  return device;
}

// Moves every frame `from` transmitted to `to`'s port; returns how many, or -1 when a
// call fails (rnic_vip_last_error says why).
extern "C" int rnic_dpi_forward(void *from, void *to) {
  std::vector<uint8_t> frame(16384);
  int moved = 0;
  for (;;) {
    size_t length = 0;
    uint64_t time = 0;
    int status = rnic_vip_frame_poll(static_cast<rnic_vip_device *>(from), frame.data(), frame.size(), &length, &time);
    if (status == RNIC_VIP_EMPTY) break;
    if (status != RNIC_VIP_OK) return -1;
    if (rnic_vip_frame_receive(static_cast<rnic_vip_device *>(to), frame.data(), length) != RNIC_VIP_OK) return -1;
    moved++;
  }
  return moved;
}
