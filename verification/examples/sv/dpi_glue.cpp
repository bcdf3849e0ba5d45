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

// The bus monitor of one memory: while on, every DMA write the device makes, stamped with
// the testbench's clock (set before each advance: the writes of an advance are made at the
// time it advances to), as an RTL testbench's monitor on the DUT's write channel would see it.
struct Write {
  uint64_t time;
  uint64_t address;
  std::vector<uint8_t> data;
};
struct Monitor {
  bool on = false;
  uint64_t clock = 0;
  std::vector<Write> writes;
};
constexpr int MONITORS = 4;
Monitor monitors[MONITORS];

Monitor *monitor_of(int memory_id) {
  return memory_id >= 0 && memory_id < MONITORS ? &monitors[memory_id] : nullptr;
}

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
  Monitor *monitor = monitor_of(memory->id);
  if (monitor && monitor->on) monitor->writes.push_back({monitor->clock, address, std::vector<uint8_t>(data, data + length)});
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

// Starts (clearing what it held) or stops the bus monitor of memory `memory_id`.
extern "C" void rnic_dpi_monitor(int memory_id, int on) {
  if (Monitor *monitor = monitor_of(memory_id)) {
    monitor->on = on != 0;
    if (monitor->on) monitor->writes.clear();
  }
}

// The time stamped on the writes memory `memory_id` sees from now on.
extern "C" void rnic_dpi_monitor_clock(int memory_id, unsigned long long time_ps) {
  if (Monitor *monitor = monitor_of(memory_id)) monitor->clock = time_ps;
}

// Tells `checker` (the reference model of the DUT on memory `memory_id`) every DMA write
// the monitor saw, in order; a write starting at `flip_address` gets `flip` XORed into its
// byte 1 first (a broken DUT's CQE write, as rnic_dpi_check_cqe). Stores how many writes
// were told in `told`; returns how many the checker found different (the last one's
// difference is in rnic_vip_last_error), or -1 when a call fails.
extern "C" int rnic_dpi_check_dma_writes(void *checker, int memory_id, unsigned long long flip_address, int flip,
                                         int *told) {
  Monitor *monitor = monitor_of(memory_id);
  *told = 0;
  if (!monitor) return -1;
  int different = 0;
  for (const Write &write : monitor->writes) {
    std::vector<uint8_t> data = write.data;
    if (write.address == flip_address && data.size() > 1) data[1] ^= static_cast<uint8_t>(flip);
    int status = rnic_vip_check_dma_write(static_cast<rnic_vip_device *>(checker), write.time, write.address,
                                          data.data(), data.size());
    if (status == RNIC_VIP_E_MISMATCH) different++;
    else if (status != RNIC_VIP_OK) return -1;
    (*told)++;
  }
  return different;
}

// Tells `checker` every write the monitor of memory `memory_id` saw into the EQ ring
// [`ring`, `ring` + `ring_bytes`) as an EQE of CEQ `eqn` (`RNIC_VIP_AEQ`: the AEQ): how a
// testbench recognises the DUT's EQEs on its bus. Stores how many in `told`; returns how
// many the checker found different, or -1 when a call fails.
extern "C" int rnic_dpi_check_eqes(void *checker, int memory_id, unsigned long long ring, unsigned long long ring_bytes,
                                   unsigned int eqn, int *told) {
  Monitor *monitor = monitor_of(memory_id);
  *told = 0;
  if (!monitor) return -1;
  int different = 0;
  for (const Write &write : monitor->writes) {
    if (write.address < ring || write.address - ring >= ring_bytes) continue;
    int status = rnic_vip_check_eqe(static_cast<rnic_vip_device *>(checker), write.time, eqn, write.data.data(),
                                    write.data.size());
    if (status == RNIC_VIP_E_MISMATCH) different++;
    else if (status != RNIC_VIP_OK) return -1;
    (*told)++;
  }
  return different;
}
