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

// Moves every frame `from` transmitted to `to` (and to `twin` unless NULL: the reference
// model beside `to`, which must see the same input) and, unless `checker` is NULL, tells
// the checker of `checker` (the reference model of `from`) that `from` transmitted it.
// Returns how many frames moved, or -1 when a call fails (rnic_vip_last_error says why).
// A frame the checker finds different is not a failure here: the checker keeps it, and
// rnic_vip_check_finish reports it.
extern "C" int rnic_dpi_forward_checked(void *from, void *to, void *twin, void *checker) {
  std::vector<uint8_t> frame(16384);
  int moved = 0;
  for (;;) {
    size_t length = 0;
    uint64_t time = 0;
    int status = rnic_vip_frame_poll(static_cast<rnic_vip_device *>(from), frame.data(), frame.size(), &length, &time);
    if (status == RNIC_VIP_EMPTY) break;
    if (status != RNIC_VIP_OK) return -1;
    if (rnic_vip_frame_receive(static_cast<rnic_vip_device *>(to), frame.data(), length) != RNIC_VIP_OK) return -1;
    if (twin && rnic_vip_frame_receive(static_cast<rnic_vip_device *>(twin), frame.data(), length) != RNIC_VIP_OK)
      return -1;
    if (checker) {
      status = rnic_vip_check_frame(static_cast<rnic_vip_device *>(checker), time, frame.data(), length);
      if (status != RNIC_VIP_OK && status != RNIC_VIP_E_MISMATCH) return -1;
    }
    moved++;
  }
  return moved;
}

// Takes (and drops) every frame `device` transmitted: the reference model's own frames
// are already its checker's expectations. Returns how many, or -1.
extern "C" int rnic_dpi_drain(void *device) {
  std::vector<uint8_t> frame(16384);
  int drained = 0;
  for (;;) {
    size_t length = 0;
    uint64_t time = 0;
    int status = rnic_vip_frame_poll(static_cast<rnic_vip_device *>(device), frame.data(), frame.size(), &length, &time);
    if (status == RNIC_VIP_EMPTY) return drained;
    if (status != RNIC_VIP_OK) return -1;
    drained++;
  }
}

// Tells `checker` that the DUT wrote the CQE at `address` of the testbench's memory
// `memory_id` (`length` bytes) to CQ `cqn` at `time_ps`; `flip` is XORed into byte 1
// (STATUS) first, as a broken DUT would write it. Returns the status of
// rnic_vip_check_cqe.
extern "C" int rnic_dpi_check_cqe(void *checker, unsigned long long time_ps, unsigned int cqn, int memory_id,
                                  unsigned long long address, int length, int flip) {
  std::vector<uint8_t> entry(static_cast<size_t>(length > 0 ? length : 0));
  for (size_t i = 0; i < entry.size(); i++) entry[i] = sv_mem_read8(memory_id, address + i);
  if (entry.size() > 1) entry[1] ^= static_cast<uint8_t>(flip);
  return rnic_vip_check_cqe(static_cast<rnic_vip_device *>(checker), time_ps, cqn, entry.data(), entry.size());
}
