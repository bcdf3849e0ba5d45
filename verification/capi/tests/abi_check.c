/* Compiled against include/rnicvip.h and linked with librnicvip.so by tests/abi.rs: every
 * function of the header is called, so a header that drifts from the library fails to
 * compile, link or behave. Prints "abi_check: ok" when every check held. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rnicvip.h"

static int failures = 0;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "abi_check:%d: ", __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, " (%s)\n", rnic_vip_last_error()); \
            failures++;                                   \
        }                                                 \
    } while (0)

/* Testbench memory for the callback device: 1 MiB at 0x1000_0000. */
static uint8_t host[1 << 20];
static const uint64_t HOST_BASE = 0x10000000;
static int dma_reads = 0, dma_writes = 0;

static int32_t host_read(void *context, uint64_t address, uint8_t *data, size_t length) {
    (void)context;
    if (address < HOST_BASE || address - HOST_BASE + length > sizeof host) return -1;
    memcpy(data, host + (address - HOST_BASE), length);
    dma_reads++;
    return 0;
}

static int32_t host_write(void *context, uint64_t address, const uint8_t *data, size_t length) {
    (void)context;
    if (address < HOST_BASE || address - HOST_BASE + length > sizeof host) return -1;
    memcpy(host + (address - HOST_BASE), data, length);
    dma_writes++;
    return 0;
}

static int msix_seen = 0;
static void on_msix(void *context, uint64_t time_ps, uint16_t vector, uint64_t address, uint32_t data) {
    (void)context; (void)time_ps; (void)vector; (void)address; (void)data;
    msix_seen++;
}

static int frames_seen = 0;
static void on_frame(void *context, uint64_t time_ps, const uint8_t *frame, size_t length) {
    (void)context; (void)time_ps; (void)frame; (void)length;
    frames_seen++;
}

/* Runs QUERY_FW_VER through the command queue at `ring` and returns the version. */
static uint32_t query_firmware_version(rnic_vip_device *device, uint64_t ring) {
    uint8_t descriptor[32] = {0};
    uint64_t reached = 0, value = 0;
    CHECK(rnic_vip_field_set(descriptor, sizeof descriptor, "Descriptor", "OPCODE", 0x0001) == RNIC_VIP_OK, "OPCODE");
    CHECK(rnic_vip_field_set(descriptor, sizeof descriptor, "Descriptor", "FLAG", 0x9) == RNIC_VIP_OK, "FLAG");
    CHECK(rnic_vip_mem_write(device, ring, descriptor, sizeof descriptor) == RNIC_VIP_OK, "ring write");
    CHECK(rnic_vip_bar_write32(device, 0, 0x7000, (uint32_t)ring) == RNIC_VIP_OK, "CSQ_BASE_LOW");
    CHECK(rnic_vip_bar_write32(device, 0, 0x7004, (uint32_t)(ring >> 32)) == RNIC_VIP_OK, "CSQ_BASE_HIGH");
    CHECK(rnic_vip_bar_write32(device, 0, 0x7008, 1) == RNIC_VIP_OK, "CSQ_DEPTH");
    CHECK(rnic_vip_bar_write32(device, 0, 0x7014, 0) == RNIC_VIP_OK, "CSQ_CONSUMER_INDEX");
    CHECK(rnic_vip_bar_write32(device, 0, 0x7010, 1) == RNIC_VIP_OK, "CSQ_PRODUCER_INDEX");
    CHECK(rnic_vip_run_until_idle(device, 1000000000ull, &reached) == RNIC_VIP_OK, "run");
    CHECK(reached > 0, "time moved");
    CHECK(rnic_vip_mem_read(device, ring, descriptor, sizeof descriptor) == RNIC_VIP_OK, "ring read");
    CHECK(rnic_vip_field_get(descriptor, sizeof descriptor, "Descriptor", "RETVAL", &value) == RNIC_VIP_OK && value == 0,
          "RETVAL %llu", (unsigned long long)value);
    uint32_t version = 0;
    memcpy(&version, descriptor + 8, 4);
    return version;
}

static void enable(rnic_vip_device *device) {
    uint8_t command[2] = {0x06, 0x00}; /* memory space | bus master */
    CHECK(rnic_vip_config_write(device, 0x04, command, 2) == RNIC_VIP_OK, "COMMAND");
    CHECK(rnic_vip_config_write_value(device, 0x82, 0x8000, 2) == RNIC_VIP_OK, "MSI-X enable");
}

int main(void) {
    CHECK(rnic_vip_abi_version() >> 16 == RNIC_VIP_ABI_VERSION >> 16, "ABI major");

    /* Errors: a status and a message, never a crash. */
    rnic_vip_device *device = NULL;
    CHECK(rnic_vip_create("nope = 1", NULL, &device) == RNIC_VIP_E_CONFIG && device == NULL, "bad config");
    CHECK(strstr(rnic_vip_last_error(), "nope") != NULL, "the message names the key: %s", rnic_vip_last_error());
    CHECK(rnic_vip_advance_to(NULL, 1) == RNIC_VIP_E_INVALID, "NULL device");
    CHECK(rnic_vip_create(NULL, NULL, NULL) == RNIC_VIP_E_INVALID, "NULL out");
    uint32_t size = 0, lo = 0, width = 0;
    CHECK(rnic_vip_layout_size("Qpc", &size) == RNIC_VIP_OK && size == 256, "Qpc size %u", size);
    CHECK(rnic_vip_field_info("Qpc", "DQPN", &lo, &width) == RNIC_VIP_OK && width == 24, "DQPN");
    CHECK(rnic_vip_field_info("Qpc", "NOPE", &lo, &width) == RNIC_VIP_E_INVALID, "unknown field");

    /* The model's own memory (backdoor regions). */
    CHECK(rnic_vip_create("mac = \"02:00:00:00:00:01\"\nmemory = [{ base = 0x10000000, size = 0x100000 }]", NULL,
                          &device) == RNIC_VIP_OK, "create");
    CHECK(rnic_vip_record_start(device) == RNIC_VIP_OK, "record");
    uint32_t id = 0;
    CHECK(rnic_vip_bar_read32(device, 0, 0, &id) == RNIC_VIP_OK && id == 0xFFFFFFFFu, "decoding off: %x", id);
    enable(device);
    uint8_t bytes[4] = {0};
    CHECK(rnic_vip_config_read(device, 0, bytes, 4) == RNIC_VIP_OK && bytes[0] == 0x34, "vendor id");
    uint32_t command = 0;
    CHECK(rnic_vip_config_read32(device, 4, &command) == RNIC_VIP_OK && (command & 6) == 6, "COMMAND");
    CHECK(rnic_vip_bar_read(device, 0, 0, bytes, 4) == RNIC_VIP_OK && memcmp(bytes, "RNIC", 4) == 0, "ID");
    CHECK(rnic_vip_bar_write(device, 0, 0x13000, bytes, 3) == RNIC_VIP_E_INVALID, "3-byte BAR write");
    CHECK(query_firmware_version(device, 0x10000000) == 0x00010000, "firmware version");
    uint64_t now = 0, next = 0, word = 0;
    CHECK(rnic_vip_now(device, &now) == RNIC_VIP_OK && now > 0, "now");
    CHECK(rnic_vip_advance_to(device, now - 1) == RNIC_VIP_E_INVALID, "time runs forward");
    CHECK(rnic_vip_advance_to(device, now + 1000) == RNIC_VIP_OK, "advance");
    int status = rnic_vip_next_event_time(device, &next);
    CHECK(status == RNIC_VIP_EMPTY || status == RNIC_VIP_OK, "next event");
    CHECK(rnic_vip_mem_write64(device, 0x10001000, 0x1122334455667788ull) == RNIC_VIP_OK, "mem_write64");
    CHECK(rnic_vip_mem_read64(device, 0x10001000, &word) == RNIC_VIP_OK && word == 0x1122334455667788ull, "read64");
    CHECK(rnic_vip_mem_read64(device, 0x90000000, &word) == RNIC_VIP_E_MEMORY, "unmapped");
    uint8_t frame[2048];
    size_t length = 0;
    uint64_t when = 0;
    CHECK(rnic_vip_frame_poll(device, frame, sizeof frame, &length, &when) == RNIC_VIP_EMPTY, "no frame");
    uint16_t vector = 0;
    uint64_t address = 0;
    uint32_t data = 0;
    CHECK(rnic_vip_msix_poll(device, &when, &vector, &address, &data) == RNIC_VIP_EMPTY, "no MSI-X");
    CHECK(rnic_vip_frame_receive(device, frame, 10) == RNIC_VIP_OK, "a runt is the device's problem, not an error");
    uint8_t qpc[256];
    CHECK(rnic_vip_context_read(device, 0, 1, qpc, sizeof qpc) == RNIC_VIP_E_INVALID, "no QPC table yet");
    CHECK(rnic_vip_context_read(device, 9, 1, qpc, sizeof qpc) == RNIC_VIP_E_INVALID, "no table 9");
    CHECK(rnic_vip_set_msix_callback(device, on_msix, NULL) == RNIC_VIP_OK, "msix callback");
    CHECK(rnic_vip_set_frame_callback(device, on_frame, NULL) == RNIC_VIP_OK, "frame callback");
    CHECK(rnic_vip_bar_write64(device, 2, 0x230, 0) == RNIC_VIP_OK, "a doorbell for nothing is dropped, not an error");
    CHECK(rnic_vip_trace_write(device, "/tmp/never.json", 0, "d") == RNIC_VIP_E_INVALID, "no trace started");
    CHECK(rnic_vip_trace_write_vcd(device, "/tmp/never.vcd", 0, "d") == RNIC_VIP_E_INVALID, "no trace, no VCD");
    CHECK(rnic_vip_trace_start(device) == RNIC_VIP_OK, "trace start");
    CHECK(rnic_vip_trace_write(device, "/nonexistent-dir/trace.json", 0, "d") == RNIC_VIP_E_IO, "trace to nowhere");
    CHECK(rnic_vip_trace_write_vcd(device, "/nonexistent-dir/trace.vcd", 0, "d") == RNIC_VIP_E_IO, "VCD to nowhere");
    CHECK(rnic_vip_coverage_write(device, "/nonexistent-dir/coverage.json") == RNIC_VIP_E_IO, "coverage to nowhere");
    char coverage_path[64];
    snprintf(coverage_path, sizeof coverage_path, "/tmp/rnicvip-abi-coverage-%ld.json", (long)clock());
    CHECK(rnic_vip_coverage_write(device, coverage_path) == RNIC_VIP_OK, "coverage");
    FILE *coverage = fopen(coverage_path, "r");
    char head[256] = {0};
    CHECK(coverage && fread(head, 1, sizeof head - 1, coverage) > 0 && strstr(head, "rnic-vip-coverage/1"),
          "the coverage file names its schema: %s", head);
    if (coverage) fclose(coverage);
    remove(coverage_path);
    /* The checker: a DUT frame the model never sent is a mismatch that names it. */
    uint8_t dut[128];
    size_t dut_length = 0;
    CHECK(rnic_vip_check_frame(device, 0, dut, 4) == RNIC_VIP_E_INVALID, "no check started");
    CHECK(rnic_vip_check_start(device, RNIC_VIP_TIME_ANY) == RNIC_VIP_OK, "check start");
    CHECK(rnic_vip_frame_encode("bth.opcode=0x04 bth.dqpn=0x42", NULL, 0, dut, sizeof dut, &dut_length) ==
          RNIC_VIP_OK, "encode for the checker");
    CHECK(rnic_vip_check_frame(device, 0, dut, dut_length) == RNIC_VIP_E_MISMATCH &&
              strstr(rnic_vip_last_error(), "frame 0 (QP 66), field frame: model nothing"),
          "unexpected frame: %s", rnic_vip_last_error());
    uint64_t mismatches = 0;
    CHECK(rnic_vip_check_finish(device, &mismatches) == RNIC_VIP_E_MISMATCH && mismatches == 1, "finish: %llu",
          (unsigned long long)mismatches);
    char recording_path[64];
    snprintf(recording_path, sizeof recording_path, "/tmp/rnicvip-abi-recording-%ld.jsonl", (long)clock());
    CHECK(rnic_vip_record_write(device, recording_path) == RNIC_VIP_OK, "record write");
    uint64_t replayed = 0;
    CHECK(rnic_vip_replay(recording_path, &replayed) == RNIC_VIP_OK && replayed > 20, "replay: %llu events",
          (unsigned long long)replayed);
    remove(recording_path);
    CHECK(rnic_vip_replay("/nonexistent-dir/recording.jsonl", NULL) == RNIC_VIP_E_IO, "replay of nothing");
    rnic_vip_destroy(device);
    rnic_vip_destroy(NULL);

    /* The testbench's memory, through callbacks. */
    rnic_vip_host_memory memory = {NULL, host_read, host_write};
    CHECK(rnic_vip_create("{\"mac\": \"02:00:00:00:00:02\"}", &memory, &device) == RNIC_VIP_OK, "create (callbacks)");
    /* Recorded: the DMA answers of the callbacks are the recording's inputs. */
    CHECK(rnic_vip_record_start(device) == RNIC_VIP_OK, "record (callbacks)");
    enable(device);
    /* The checker's other streams, against a "DUT" that does what the test says below. */
    CHECK(rnic_vip_check_start_streams(device, 0, RNIC_VIP_TIME_ANY) == RNIC_VIP_E_INVALID, "no stream");
    CHECK(rnic_vip_check_start_streams(device, 1u << 9, RNIC_VIP_TIME_ANY) == RNIC_VIP_E_INVALID, "unknown stream");
    CHECK(rnic_vip_check_start_streams(device,
                                       RNIC_VIP_CHECK_FRAMES | RNIC_VIP_CHECK_DMA_WRITES | RNIC_VIP_CHECK_CQES |
                                           RNIC_VIP_CHECK_EQES | RNIC_VIP_CHECK_MSIX,
                                       RNIC_VIP_TIME_ANY) == RNIC_VIP_OK, "check start (every stream)");
    CHECK(query_firmware_version(device, HOST_BASE) == 0x00010000, "firmware version through callbacks");
    CHECK(dma_reads > 0 && dma_writes > 0, "the model's DMA went through the callbacks (%d reads, %d writes)",
          dma_reads, dma_writes);
    /* The model wrote the descriptor back; a DUT that wrote RETVAL 1 into it differs. */
    uint8_t written[32];
    memcpy(written, host, sizeof written);
    written[4] ^= 1; /* RETVAL */
    CHECK(rnic_vip_check_dma_write(device, 0, HOST_BASE, written, sizeof written) == RNIC_VIP_E_MISMATCH &&
              strstr(rnic_vip_last_error(), "DMA write 0 (address 0x10000000), field "),
          "wrong DMA write: %s", rnic_vip_last_error());
    uint8_t entry[64] = {0};
    CHECK(rnic_vip_check_cqe(device, 0, 1, entry, sizeof entry) == RNIC_VIP_E_MISMATCH &&
              strstr(rnic_vip_last_error(), "CQE 0 (CQ 1 QP 0), field entry: model nothing"),
          "unexpected CQE: %s", rnic_vip_last_error());
    CHECK(rnic_vip_check_eqe(device, 0, RNIC_VIP_AEQ, entry, 16) == RNIC_VIP_E_MISMATCH &&
              strstr(rnic_vip_last_error(), "EQE 0 (AEQ), field entry: model nothing"),
          "unexpected AEQE: %s", rnic_vip_last_error());
    CHECK(rnic_vip_check_msix(device, 0, 3, 0xFEE00000u, 3) == RNIC_VIP_E_MISMATCH &&
              strstr(rnic_vip_last_error(), "MSI-X 0 (vector 3), field entry: model nothing"),
          "unexpected MSI-X: %s", rnic_vip_last_error());
    mismatches = 0;
    CHECK(rnic_vip_check_finish(device, &mismatches) == RNIC_VIP_E_MISMATCH && mismatches >= 4 &&
              strstr(rnic_vip_last_error(), "first divergence: DMA write 0"),
          "finish: %llu", (unsigned long long)mismatches);
    snprintf(recording_path, sizeof recording_path, "/tmp/rnicvip-abi-recording-cb-%ld.jsonl", (long)clock());
    CHECK(rnic_vip_record_write(device, recording_path) == RNIC_VIP_OK, "record write (callbacks)");
    FILE *recorded = fopen(recording_path, "r");
    char recording_text[8192] = {0};
    CHECK(recorded && fread(recording_text, 1, sizeof recording_text - 1, recorded) > 0 &&
              strstr(recording_text, "\"event\":\"dma_read\"") && strstr(recording_text, "\"event\":\"dma_write\""),
          "the DMA answers are recorded: %s", recording_text);
    if (recorded) fclose(recorded);
    rnic_vip_destroy(device);
    int reads_before = dma_reads;
    replayed = 0;
    CHECK(rnic_vip_replay(recording_path, &replayed) == RNIC_VIP_OK && replayed > 8, "replay (callbacks): %llu",
          (unsigned long long)replayed);
    CHECK(dma_reads == reads_before, "the replay needs no callbacks");
    remove(recording_path);

    /* The codec: encode from fields, decode back, refuse a corrupted frame. */
    uint8_t wire[256];
    size_t wire_length = 0, needed = 0;
    const uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(rnic_vip_frame_encode("bth.opcode=0x0a bth.dqpn=0x11 bth.psn=77,reth.len=8 reth.rkey=0x100", payload,
                                sizeof payload, wire, sizeof wire, &wire_length) == RNIC_VIP_OK, "encode");
    char text[1024];
    CHECK(rnic_vip_frame_decode(wire, wire_length, text, sizeof text, &needed) == RNIC_VIP_OK, "decode");
    CHECK(strstr(text, "bth.opcode=0xa\n") && strstr(text, "bth.psn=0x4d\n") && strstr(text, "reth.len=0x8\n"),
          "decoded fields: %s", text);
    CHECK(strlen(text) + 1 == needed, "needed %zu", needed);
    CHECK(rnic_vip_frame_decode(wire, wire_length, text, 4, &needed) == RNIC_VIP_E_BUFFER && needed > 4, "small");
    CHECK(rnic_vip_frame_encode("bth.nope=1", NULL, 0, wire, sizeof wire, &wire_length) != RNIC_VIP_OK, "unknown");
    CHECK(rnic_vip_frame_encode("bth.opcode=0x0a", payload, sizeof payload, wire, 8, &wire_length) ==
          RNIC_VIP_E_BUFFER, "frame too big for the buffer");
    CHECK(rnic_vip_frame_encode("bth.opcode=0x04", payload, sizeof payload, wire, sizeof wire, &wire_length) ==
          RNIC_VIP_OK, "encode SEND ONLY");
    wire[wire_length - 1] ^= 1; /* the ICRC */
    CHECK(rnic_vip_frame_decode(wire, wire_length, text, sizeof text, &needed) == RNIC_VIP_E_CODEC, "bad ICRC");

    if (failures) {
        fprintf(stderr, "abi_check: %d failures\n", failures);
        return 1;
    }
    printf("abi_check: ok\n");
    return 0;
}
