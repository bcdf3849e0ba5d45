// A SystemVerilog testbench that drives two rnic-emu models through the C ABI
// (librnicvip, imported with DPI-C): host memory lives here, in SystemVerilog associative
// arrays the models reach through DMA callbacks; the testbench brings each device up
// through BAR writes as a driver would (command queue, mailbox commands, contexts built
// field by field from rnicvip_pkg), connects an RC queue pair between them, posts an RDMA
// WRITE, carries the frames between the two ports, and checks the completion and the
// bytes. Device 0 plays the DUT (where RTL would sit): a third model instance, the reference,
// gets the same stimulus, and its checker is told every frame device 0 transmits, the CQE it
// writes and its MSI-X messages. With +break_cqe the testbench corrupts the CQE's STATUS as a
// broken DUT would, and passes only if the checker catches it. Run by
// verification/examples/sv/run (Verilator).
import rnicvip_pkg::*;

module tb;
  // ---- host memory of device 0 and device 1 (served to the models by DMA callbacks) ----
  bit [7:0] mem0 [longint unsigned];
  bit [7:0] mem1 [longint unsigned];
  bit [7:0] mem2 [longint unsigned];  // the reference model's (device 2)

  export "DPI-C" function sv_mem_read8;
  export "DPI-C" function sv_mem_write8;

  function automatic byte unsigned sv_mem_read8(input int id, input longint unsigned address);
    if (id == 0) return mem0.exists(address) ? mem0[address] : 8'h00;
    if (id == 2) return mem2.exists(address) ? mem2[address] : 8'h00;
    return mem1.exists(address) ? mem1[address] : 8'h00;
  endfunction

  function automatic void sv_mem_write8(input int id, input longint unsigned address, input byte unsigned value);
    if (id == 0) mem0[address] = value;
    else if (id == 2) mem2[address] = value;
    else mem1[address] = value;
  endfunction

  // ---- the C ABI ----
  import "DPI-C" context function int unsigned rnic_vip_abi_version();
  import "DPI-C" context function string rnic_vip_last_error();
  import "DPI-C" context function chandle rnic_dpi_create(input string cfg, input int memory_id);
  import "DPI-C" context function void rnic_vip_destroy(input chandle device);
  import "DPI-C" context function int rnic_vip_config_write_value(input chandle device, input int unsigned offset,
                                                          input int unsigned value, input int unsigned length);
  import "DPI-C" context function int rnic_vip_bar_write32(input chandle device, input byte unsigned bar,
                                                   input longint unsigned offset, input int unsigned value);
  import "DPI-C" context function int rnic_vip_bar_write64(input chandle device, input byte unsigned bar,
                                                   input longint unsigned offset, input longint unsigned value);
  import "DPI-C" context function int rnic_vip_bar_read32(input chandle device, input byte unsigned bar,
                                                  input longint unsigned offset, output int unsigned value);
  import "DPI-C" context function int rnic_vip_now(input chandle device, output longint unsigned now_ps);
  import "DPI-C" context function int rnic_vip_next_event_time(input chandle device, output longint unsigned time_ps);
  import "DPI-C" context function int rnic_vip_advance_to(input chandle device, input longint unsigned time_ps);
  import "DPI-C" context function int rnic_vip_run_until_idle(input chandle device, input longint unsigned limit_ps,
                                                      output longint unsigned reached_ps);
  import "DPI-C" context function int rnic_vip_msix_poll(input chandle device, output longint unsigned time_ps,
                                                 output shortint unsigned vector, output longint unsigned address,
                                                 output int unsigned data);
  import "DPI-C" context function int rnic_dpi_forward_checked(input chandle from_device, input chandle to_device,
                                                         input chandle twin, input chandle ref_device);
  import "DPI-C" context function int rnic_dpi_drain(input chandle device);
  import "DPI-C" context function int rnic_dpi_check_cqe(input chandle ref_device, input longint unsigned time_ps,
                                                   input int unsigned cqn, input int memory_id,
                                                   input longint unsigned address, input int length, input int flip);
  import "DPI-C" context function int rnic_vip_check_start_streams(input chandle device, input int unsigned streams,
                                                             input longint unsigned tolerance_ps);
  import "DPI-C" context function int rnic_vip_check_msix(input chandle device, input longint unsigned time_ps,
                                                    input shortint unsigned message_vector,
                                                    input longint unsigned message_address,
                                                    input int unsigned message_data);
  import "DPI-C" context function int rnic_vip_check_finish(input chandle device, output longint unsigned mismatches);
  import "DPI-C" context function int rnic_vip_coverage_write(input chandle device, input string path);
  import "DPI-C" context function int rnic_vip_trace_start(input chandle device);
  import "DPI-C" context function int rnic_vip_trace_write(input chandle device, input string path, input int unsigned pid,
                                                     input string name);
  import "DPI-C" context function int rnic_vip_trace_write_vcd(input chandle device, input string path,
                                                         input int unsigned pid, input string name);

  localparam longint unsigned DMA_BASE = 64'h1000_0000;
  localparam int RING_DEPTH = 64;
  localparam int QPN = 8, CQN = 1, MPT_INDEX = 1, PD = 1;
  localparam int LENGTH = 4096;

  // The checker's streams (RNIC_VIP_CHECK_* of rnicvip.h).
  localparam int unsigned CHECK_FRAMES = 1, CHECK_CQES = 4, CHECK_MSIX = 16;
  localparam int REF = 2;  // the reference model of device 0

  chandle dev[3];
  longint unsigned next_free[3], ring[3], mbox_in[3], mbox_out[3];
  int producer[3];
  int errors = 0;
  int break_cqe = 0;  // +break_cqe: the DUT's CQE is corrupted before the checker sees it

  function automatic void fail(input string what);
    $display("FAIL: %s", what);
    errors++;
  endfunction

  function automatic void check(input int status, input string what);
    if (status != 0) fail($sformatf("%s: status %0d: %s", what, status, rnic_vip_last_error()));
  endfunction

  // ---- host memory helpers ----
  function automatic void mem_write(input int d, input longint unsigned address, input bit [2047:0] value,
                                    input int bytes);
    for (int i = 0; i < bytes; i++) sv_mem_write8(d, address + longint'(i), value[8 * i +: 8]);
  endfunction

  function automatic bit [2047:0] mem_read(input int d, input longint unsigned address, input int bytes);
    bit [2047:0] value = '0;
    for (int i = 0; i < bytes; i++) value[8 * i +: 8] = sv_mem_read8(d, address + longint'(i));
    return value;
  endfunction

  function automatic longint unsigned allocate(input int d, input longint unsigned bytes);
    longint unsigned address = next_free[d];
    next_free[d] += (bytes + 4095) / 4096 * 4096;
    return address;
  endfunction

  // ---- the driver: command queue and mailbox ----
  function automatic void settle(input int d);
    longint unsigned now, reached;
    check(rnic_vip_now(dev[d], now), "now");
    check(rnic_vip_run_until_idle(dev[d], now + 64'd1_000_000_000, reached), "run until idle");
  endfunction

  function automatic bit [191:0] command(input int d, input int opcode, input bit read_back,
                                         input bit [191:0] payload);
    bit [2047:0] descriptor = '0;
    longint unsigned slot = ring[d] + longint'(producer[d] % RING_DEPTH) * 32;
    int retval;
    set_field(descriptor, Descriptor_OPCODE_LO, Descriptor_OPCODE_W, opcode);
    set_field(descriptor, Descriptor_FLAG_LO, Descriptor_FLAG_W, read_back ? 'h9 : 'h1);  // IN (| WR)
    descriptor[64 +: 192] = payload;
    mem_write(d, slot, descriptor, 32);
    producer[d] = (producer[d] + 1) % RING_DEPTH;
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_PRODUCER_INDEX, producer[d]), "CSQ PI");
    settle(d);
    descriptor = mem_read(d, slot, 32);
    retval = int'(get_field(descriptor, Descriptor_RETVAL_LO, Descriptor_RETVAL_W));
    if (retval != 0) fail($sformatf("device %0d command %h: return code %0d", d, opcode, retval));
    return descriptor[64 +: 192];
  endfunction

  function automatic void post_mailbox(input int d, input int opcode, input int tag, input longint unsigned in_param,
                                  input string what);
    bit [2047:0] post = '0;
    bit [2047:0] status = '0;
    set_field(post, PostMailbox_IN_PARAM_LO, PostMailbox_IN_PARAM_W, in_param);
    set_field(post, PostMailbox_CMD_LO, PostMailbox_CMD_W, opcode);
    set_field(post, PostMailbox_TAG_LO, PostMailbox_TAG_W, tag);
    set_field(post, PostMailbox_TOKEN_LO, PostMailbox_TOKEN_W, 'hFFFF);  // poll, no event
    void'(command(d, CMD_PostMailbox, 0, post[191:0]));
    status[191:0] = command(d, CMD_QueryMailboxStatus, 1, '0);
    if (get_field(status, MailboxStatus_STATUS_LO, MailboxStatus_STATUS_W) != 1)  // 1: success
      fail($sformatf("device %0d %s: mailbox status %0d", d, what,
                     get_field(status, MailboxStatus_STATUS_LO, MailboxStatus_STATUS_W)));
  endfunction

  // A mailbox command whose input is a context (and, for MODIFY, its mask).
  function automatic void mailbox_with(input int d, input int opcode, input int tag, input bit [2047:0] ctx,
                                          input int size, input bit [2047:0] mask, input bit with_mask,
                                          input string what);
    mem_write(d, mbox_in[d], ctx, size);
    if (with_mask) mem_write(d, mbox_in[d] + longint'(size), mask, size);
    post_mailbox(d, opcode, tag, mbox_in[d], what);
  endfunction

  // ---- bring-up (hop-0 tables: one 64 KiB chunk per table, contexts at index 0..) ----
  function automatic void bring_up(input int d, input bit [47:0] mac, input bit [31:0] ip);
    bit [2047:0] v;
    bit [2047:0] none = '0;
    longint unsigned chunk, ceq;
    next_free[d] = DMA_BASE;
    producer[d] = 0;
    // PCI: memory decoding and bus mastering, MSI-X on, vector 0 and 1 unmasked.
    check(rnic_vip_config_write_value(dev[d], CFG_COMMAND, COMMAND_MEMORY_SPACE | COMMAND_BUS_MASTER, 2), "COMMAND");
    check(rnic_vip_config_write_value(dev[d], CFG_MSIX_CONTROL, MSIX_CONTROL_ENABLE, 2), "MSI-X enable");
    for (int vector = 0; vector < 8; vector++) begin
      check(rnic_vip_bar_write32(dev[d], MSIX_BAR, MSIX_ENTRY_SIZE * vector, 'hFEE0_0000), "MSI-X address");
      check(rnic_vip_bar_write32(dev[d], MSIX_BAR, MSIX_ENTRY_SIZE * vector + 8, vector), "MSI-X data");
      check(rnic_vip_bar_write32(dev[d], MSIX_BAR, MSIX_ENTRY_SIZE * vector + 12, 0), "MSI-X unmask");
    end
    // The command queue.
    ring[d] = allocate(d, RING_DEPTH * 32);
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_BASE_LOW, ring[d][31:0]), "CSQ base");
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_BASE_HIGH, ring[d][63:32]), "CSQ base");
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_DEPTH, RING_DEPTH / 8), "CSQ depth");
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_CONSUMER_INDEX, 0), "CSQ CI");
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, REG_CSQ_PRODUCER_INDEX, 0), "CSQ PI");
    mbox_in[d] = allocate(d, 4096);
    mbox_out[d] = allocate(d, 4096);
    // Context tables: 4 KiB buffer pages, hop 0.
    v = '0;
    set_field(v, BaseAddressTableAttributes_QPC_BUF_PGSZ_LO, BaseAddressTableAttributes_QPC_BUF_PGSZ_W, 4);
    set_field(v, BaseAddressTableAttributes_MPT_BUF_PGSZ_LO, BaseAddressTableAttributes_MPT_BUF_PGSZ_W, 4);
    set_field(v, BaseAddressTableAttributes_CQC_BUF_PGSZ_LO, BaseAddressTableAttributes_CQC_BUF_PGSZ_W, 4);
    set_field(v, BaseAddressTableAttributes_SRQC_BUF_PGSZ_LO, BaseAddressTableAttributes_SRQC_BUF_PGSZ_W, 4);
    void'(command(d, CMD_ConfigBaseAddressTableAttributes, 0, v[191:0]));
    // GID 0: ::ffff:ip (RoCEv2 over IPv4).
    v = '0;
    set_field(v, GidEntry_SGID_IDX_LO, GidEntry_SGID_IDX_W, 0);
    v[(4 + 10) * 8 +: 8] = 8'hFF;
    v[(4 + 11) * 8 +: 8] = 8'hFF;
    for (int i = 0; i < 4; i++) v[(4 + 12 + i) * 8 +: 8] = ip[31 - 8 * i -: 8];
    set_field(v, GidEntry_SGID_TYPE_LO, GidEntry_SGID_TYPE_W, 1);
    void'(command(d, CMD_ConfigGidTable, 0, v[191:0]));
    // One chunk for each of the QPC, MPT and CQC tables (index 0 slot).
    chunk = allocate(d, 64 * 1024);
    post_mailbox(d, MB_WriteQpcBt0, QPN, chunk, "WRITE_QPC_BT0");
    chunk = allocate(d, 64 * 1024);
    post_mailbox(d, MB_WriteMptBt0, MPT_INDEX, chunk, "WRITE_MPT_BT0");
    chunk = allocate(d, 64 * 1024);
    post_mailbox(d, MB_WriteCqcBt0, CQN, chunk, "WRITE_CQC_BT0");
    // CEQ 0, always armed, and its interrupt.
    ceq = allocate(d, 64 * 4);
    v = '0;
    set_field(v, Eqc_EQ_ST_LO, Eqc_EQ_ST_W, 1);
    set_field(v, Eqc_ARM_ST_LO, Eqc_ARM_ST_W, 3);
    set_field(v, Eqc_SHIFT_LO, Eqc_SHIFT_W, 6);
    set_field(v, Eqc_EQE_BA_LO, Eqc_EQE_BA_W, ceq >> 3);
    mailbox_with(d, MB_CreateCeqc, 0, v, Eqc_SIZE, none, 0, "CREATE_CEQC");
    check(rnic_vip_bar_write32(dev[d], CONTROL_BAR, EVENT_INT_ENABLE_BASE, 1), "CEQ 0 interrupt");
  endfunction

  longint unsigned cq_buffer[3], qp_buffer[3], data[3];

  function automatic void create_objects(input int d, input bit [47:0] peer_mac, input bit [31:0] peer_ip);
    bit [2047:0] v, mask;
    bit [2047:0] none = '0;
    // CQ of 64 CQEs of 64 bytes.
    cq_buffer[d] = allocate(d, 64 * 64);
    v = '0;
    set_field(v, Cqc_CQN_LO, Cqc_CQN_W, CQN);
    set_field(v, Cqc_CQ_ST_LO, Cqc_CQ_ST_W, 1);
    set_field(v, Cqc_SHIFT_LO, Cqc_SHIFT_W, 6);
    set_field(v, Cqc_CQE_SIZE_LO, Cqc_CQE_SIZE_W, 1);
    set_field(v, Cqc_CQE_BA_LO, Cqc_CQE_BA_W, cq_buffer[d] >> 3);
    mailbox_with(d, MB_CreateCqc, CQN, v, Cqc_SIZE, none, 0, "CREATE_CQC");
    // A memory region over 8 KiB, physically addressed, every right; key = rotl32(index, 8).
    data[d] = allocate(d, 8192);
    v = '0;
    set_field(v, Mpt_MPT_ST_LO, Mpt_MPT_ST_W, 1);
    set_field(v, Mpt_PD_LO, Mpt_PD_W, PD);
    set_field(v, Mpt_LW_EN_LO, Mpt_LW_EN_W, 1);
    set_field(v, Mpt_RW_EN_LO, Mpt_RW_EN_W, 1);
    set_field(v, Mpt_RR_EN_LO, Mpt_RR_EN_W, 1);
    set_field(v, Mpt_PA_LO, Mpt_PA_W, 1);
    set_field(v, Mpt_VA_LO, Mpt_VA_W, data[d]);
    set_field(v, Mpt_LEN_LO, Mpt_LEN_W, 8192);
    set_field(v, Mpt_LKEY_LO, Mpt_LKEY_W, MPT_INDEX << 8);
    mailbox_with(d, MB_CreateMpt, MPT_INDEX, v, Mpt_SIZE, none, 0, "CREATE_MPT");
    // The RC QP: 64 SQ WQEs (one page), no extended SGEs, 64 RQ WQEs of 4 SGEs (one page).
    qp_buffer[d] = allocate(d, 2 * 4096);
    v = '0;
    set_field(v, Qpc_QP_ST_LO, Qpc_QP_ST_W, 1);  // INIT
    set_field(v, Qpc_TST_LO, Qpc_TST_W, 0);  // RC
    set_field(v, Qpc_PD_LO, Qpc_PD_W, PD);
    set_field(v, Qpc_SQ_SHIFT_LO, Qpc_SQ_SHIFT_W, 6);
    set_field(v, Qpc_RQ_SHIFT_LO, Qpc_RQ_SHIFT_W, 6);
    set_field(v, Qpc_RQWS_LO, Qpc_RQWS_W, 2);
    set_field(v, Qpc_TX_CQN_LO, Qpc_TX_CQN_W, CQN);
    set_field(v, Qpc_RX_CQN_LO, Qpc_RX_CQN_W, CQN);
    set_field(v, Qpc_WQE_SGE_BA_LO, Qpc_WQE_SGE_BA_W, qp_buffer[d] >> 3);
    set_field(v, Qpc_MTU_LO, Qpc_MTU_W, 3);  // 1024
    set_field(v, Qpc_DQPN_LO, Qpc_DQPN_W, QPN);
    for (int i = 0; i < 6; i++) v[(44 + i) * 8 +: 8] = peer_mac[47 - 8 * i -: 8];  // DMAC, wire order
    v[(28 + 10) * 8 +: 8] = 8'hFF;  // DGID ::ffff:peer_ip
    v[(28 + 11) * 8 +: 8] = 8'hFF;
    for (int i = 0; i < 4; i++) v[(28 + 12 + i) * 8 +: 8] = peer_ip[31 - 8 * i -: 8];
    set_field(v, Qpc_HOPLIMIT_LO, Qpc_HOPLIMIT_W, 64);
    set_field(v, Qpc_VLAN_ID_LO, Qpc_VLAN_ID_W, 'hFFF);
    set_field(v, Qpc_RAQ_PSN_LO, Qpc_RAQ_PSN_W, 'hFF_FFFF);
    set_field(v, Qpc_AT_LO, Qpc_AT_W, 14);
    set_field(v, Qpc_RETRY_NUM_INIT_LO, Qpc_RETRY_NUM_INIT_W, 7);
    set_field(v, Qpc_RETRY_CNT_LO, Qpc_RETRY_CNT_W, 7);
    set_field(v, Qpc_RNR_NUM_INIT_LO, Qpc_RNR_NUM_INIT_W, 7);
    set_field(v, Qpc_RNR_CNT_LO, Qpc_RNR_CNT_W, 7);
    set_field(v, Qpc_MIN_RNR_TIME_LO, Qpc_MIN_RNR_TIME_W, 1);
    set_field(v, Qpc_SR_MAX_LO, Qpc_SR_MAX_W, 4);
    set_field(v, Qpc_RR_MAX_LO, Qpc_RR_MAX_W, 4);
    set_field(v, Qpc_RRE_LO, Qpc_RRE_W, 1);
    set_field(v, Qpc_RWE_LO, Qpc_RWE_W, 1);
    set_field(v, Qpc_FRE_LO, Qpc_FRE_W, 1);
    mailbox_with(d, MB_ModifyQpc, QPN, v, Qpc_SIZE, none, 1, "QP RESET->INIT");
    // INIT->RTR and RTR->RTS change only the state: the mask opens QP_ST alone.
    for (int state = 2; state <= 3; state++) begin
      v = '0;
      mask = '1;
      set_field(v, Qpc_QP_ST_LO, Qpc_QP_ST_W, state);
      set_field(mask, Qpc_QP_ST_LO, Qpc_QP_ST_W, 0);
      mailbox_with(d, MB_ModifyQpc, QPN, v, Qpc_SIZE, mask, 1, $sformatf("QP to state %0d", state));
    end
  endfunction

  // Runs the three devices on one clock and carries frames between the ports of devices 0 and
  // 1 until `limit` events have passed or the CQE of device 0 is valid. Device 1's frames go
  // to device 0 and to the reference model; device 0's frames go to device 1 and to the
  // reference's checker; the reference's own frames are its expectations.
  function automatic bit run_until_cqe(input int limit);
    longint unsigned t, next, now;
    int moved = 0, n;
    bit [2047:0] cqe;
    for (int step = 0; step < limit; step++) begin
      n = rnic_dpi_forward_checked(dev[0], dev[1], null, dev[REF]);
      if (n < 0) begin
        fail($sformatf("carrying frames from device 0: %s", rnic_vip_last_error()));
        return 0;
      end
      moved += n;
      n = rnic_dpi_forward_checked(dev[1], dev[0], dev[REF], null);
      if (n < 0) begin
        fail($sformatf("carrying frames from device 1: %s", rnic_vip_last_error()));
        return 0;
      end
      moved += n;
      if (rnic_dpi_drain(dev[REF]) < 0) begin
        fail($sformatf("draining the reference: %s", rnic_vip_last_error()));
        return 0;
      end
      cqe = mem_read(0, cq_buffer[0], 64);
      if (get_field(cqe, Cqe_OWNER_LO, Cqe_OWNER_W) == 1) begin
        $display("frames carried between the ports: %0d", moved);
        // The DUT's CQE, seen now, told to the reference's checker.
        check(rnic_vip_now(dev[0], now), "now");
        n = rnic_dpi_check_cqe(dev[REF], now, CQN, 0, cq_buffer[0], 64, break_cqe ? 'h05 : 0);
        if (break_cqe) begin
          if (n == 0) fail("the checker accepted the broken CQE");
          else $display("PASS: broken CQE caught: %s", rnic_vip_last_error());
        end else if (n != 0) fail($sformatf("checker, CQE: %s", rnic_vip_last_error()));
        return 1;
      end
      t = 64'hFFFF_FFFF_FFFF_FFFF;
      for (int d = 0; d < 3; d++)
        if (rnic_vip_next_event_time(dev[d], next) == 0 && next < t) t = next;
      if (t == 64'hFFFF_FFFF_FFFF_FFFF) return 0;  // nothing pending anywhere
      for (int d = 0; d < 3; d++) check(rnic_vip_advance_to(dev[d], t), $sformatf("advance %0d", d));
    end
    return 0;
  endfunction

  initial begin
    bit [2047:0] wqe, cqe;
    bit [47:0] mac[2];
    bit [31:0] ip[2];
    longint unsigned t0, t1;
    int unsigned id;
    longint unsigned msix_time, msix_address;
    shortint unsigned msix_vector;
    int unsigned msix_data;
    int interrupts = 0;
    longint unsigned mismatches;
    string coverage_dir;
    string trace_dir = "";

    if (rnic_vip_abi_version() >> 16 != 1) fail($sformatf("ABI version %h: major 1 expected", rnic_vip_abi_version()));
    mac[0] = 48'h02_52_4e_49_43_01;
    mac[1] = 48'h02_52_4e_49_43_02;
    ip[0] = 32'h0a_00_00_01;
    ip[1] = 32'h0a_00_00_02;
    dev[0] = rnic_dpi_create("mac = \"02:52:4e:49:43:01\"", 0);
    dev[1] = rnic_dpi_create("mac = \"02:52:4e:49:43:02\"", 1);
    dev[REF] = rnic_dpi_create("mac = \"02:52:4e:49:43:01\"", REF);
    break_cqe = $test$plusargs("break_cqe");
    if (dev[0] == null || dev[1] == null || dev[REF] == null) begin
      $display("FAIL: rnic_vip_create: %s", rnic_vip_last_error());
      $finish;
    end
    for (int d = 0; d < 2; d++) begin
      bring_up(d, mac[d], ip[d]);
      check(rnic_vip_bar_read32(dev[d], CONTROL_BAR, REG_ID, id), "ID");
      if (id != 32'h43494e52) fail($sformatf("device %0d ID %h, expected \"RNIC\"", d, id));
      create_objects(d, mac[1 - d], ip[1 - d]);
    end
    // The reference model of device 0: the same stimulus.
    bring_up(REF, mac[0], ip[0]);
    create_objects(REF, mac[1], ip[1]);
    // One clock for all: the latest device's time.
    check(rnic_vip_now(dev[0], t0), "now");
    check(rnic_vip_now(dev[1], t1), "now");
    if (t1 > t0) t0 = t1;
    check(rnic_vip_now(dev[REF], t1), "now");
    if (t1 > t0) t0 = t1;
    for (int d = 0; d < 3; d++) check(rnic_vip_advance_to(dev[d], t0), "align");
    // The bring-up's interrupts are not checked; from here on, the reference checks device 0's
    // frames, CQEs and MSI-X messages, to the picosecond.
    for (int d = 0; d < 3; d++)
      while (rnic_vip_msix_poll(dev[d], msix_time, msix_vector, msix_address, msix_data) == 0) begin end
    check(rnic_vip_check_start_streams(dev[REF], CHECK_FRAMES | CHECK_CQES | CHECK_MSIX, 0), "check start");
    // Trace the WRITE (not the bring-up) when asked to.
    if ($value$plusargs("trace_dir=%s", trace_dir))
      for (int d = 0; d < 2; d++) check(rnic_vip_trace_start(dev[d]), "trace start");
    // The payload on device 0 (and its reference), zeroes on device 1.
    for (int i = 0; i < LENGTH; i++) begin
      sv_mem_write8(0, data[0] + longint'(i), 8'((i * 7 + 3) & 'hFF));
      sv_mem_write8(REF, data[REF] + longint'(i), 8'((i * 7 + 3) & 'hFF));
    end
    // SQ WQE 0 of device 0: RDMA WRITE of LENGTH bytes to device 1's region.
    wqe = '0;
    set_field(wqe, RcSqWqe_OPCODE_LO, RcSqWqe_OPCODE_W, SQ_RdmaWrite);
    set_field(wqe, RcSqWqe_OWNER_LO, RcSqWqe_OWNER_W, 1);  // index 0 of a 64-deep SQ
    set_field(wqe, RcSqWqe_CQE_LO, RcSqWqe_CQE_W, 1);
    set_field(wqe, RcSqWqe_MSG_LEN_LO, RcSqWqe_MSG_LEN_W, LENGTH);
    set_field(wqe, RcSqWqe_SGE_NUM_LO, RcSqWqe_SGE_NUM_W, 1);
    set_field(wqe, RcSqWqe_RKEY_LO, RcSqWqe_RKEY_W, MPT_INDEX << 8);
    set_field(wqe, RcSqWqe_VA_LO, RcSqWqe_VA_W, data[1]);
    set_field(wqe, 256 + Sge_LEN_LO, Sge_LEN_W, LENGTH);  // SGE 0 at byte 32
    set_field(wqe, 256 + Sge_LKEY_LO, Sge_LKEY_W, MPT_INDEX << 8);
    set_field(wqe, 256 + Sge_ADDR_LO, Sge_ADDR_W, data[0]);
    mem_write(0, qp_buffer[0], wqe, 64);
    mem_write(REF, qp_buffer[REF], wqe, 64);  // the same addresses: the same allocations
    // SQ doorbell: TAG = QPN, CMD = SQ (0), PI = 1.
    wqe = '0;
    set_field(wqe, Doorbell_TAG_LO, Doorbell_TAG_W, QPN);
    set_field(wqe, Doorbell_CMD_LO, Doorbell_CMD_W, 0);
    set_field(wqe, Doorbell_PI_LO, Doorbell_PI_W, 1);
    check(rnic_vip_bar_write64(dev[0], DOORBELL_BAR, DB_OFFSET, wqe[63:0]), "SQ doorbell");
    check(rnic_vip_bar_write64(dev[REF], DOORBELL_BAR, DB_OFFSET, wqe[63:0]), "SQ doorbell (reference)");
    if (!run_until_cqe(100000)) fail("no CQE on device 0");
    cqe = mem_read(0, cq_buffer[0], 64);
    if (get_field(cqe, Cqe_STATUS_LO, Cqe_STATUS_W) != CQE_Success)
      fail($sformatf("CQE status %h", get_field(cqe, Cqe_STATUS_LO, Cqe_STATUS_W)));
    if (get_field(cqe, Cqe_OPCODE_LO, Cqe_OPCODE_W) != SQ_RdmaWrite)
      fail($sformatf("CQE opcode %h", get_field(cqe, Cqe_OPCODE_LO, Cqe_OPCODE_W)));
    if (get_field(cqe, Cqe_LCL_QPN_LO, Cqe_LCL_QPN_W) != QPN)
      fail($sformatf("CQE QPN %0d", get_field(cqe, Cqe_LCL_QPN_LO, Cqe_LCL_QPN_W)));
    for (int i = 0; i < LENGTH; i++)
      if (sv_mem_read8(1, data[1] + longint'(i)) != 8'((i * 7 + 3) & 'hFF)) begin
        fail($sformatf("byte %0d of the WRITE on device 1: %h", i, sv_mem_read8(1, data[1] + longint'(i))));
        break;
      end
    while (rnic_vip_msix_poll(dev[0], msix_time, msix_vector, msix_address, msix_data) == 0) begin
      interrupts++;
      check(rnic_vip_check_msix(dev[REF], msix_time, msix_vector, msix_address, msix_data), "checker, MSI-X");
    end
    // Everything the reference produced, device 0 produced too (the broken CQE aside).
    if (rnic_vip_check_finish(dev[REF], mismatches) != 0 && !(break_cqe && mismatches == 1))
      fail($sformatf("checker: %0d mismatches; %s", mismatches, rnic_vip_last_error()));
    else $display("checker: device 0 against its reference model: %0d mismatch(es)", mismatches);
    check(rnic_vip_now(dev[0], t0), "now");
    $display("RDMA WRITE of %0d bytes completed at %0d ps (CQE status %0d, %0d MSI-X on device 0)", LENGTH, t0,
             get_field(cqe, Cqe_STATUS_LO, Cqe_STATUS_W), interrupts);
    // Functional coverage of each device, for `rnic-vip coverage merge/report`.
    if ($value$plusargs("coverage_dir=%s", coverage_dir))
      for (int d = 0; d < 2; d++)
        check(rnic_vip_coverage_write(dev[d], $sformatf("%s/coverage-%0d.json", coverage_dir, d)), "coverage");
    if (trace_dir != "")
      for (int d = 0; d < 2; d++) begin
        check(rnic_vip_trace_write(dev[d], $sformatf("%s/trace-%0d.json", trace_dir, d), d, $sformatf("device %0d", d)),
              "trace write");
        check(rnic_vip_trace_write_vcd(dev[d], $sformatf("%s/trace-%0d.vcd", trace_dir, d), d,
                                       $sformatf("device %0d", d)), "VCD write");
      end
    rnic_vip_destroy(dev[0]);
    rnic_vip_destroy(dev[1]);
    rnic_vip_destroy(dev[REF]);
    if (errors == 0) $display("PASS: sv example");
    else $display("FAIL: sv example, %0d errors", errors);
    $finish;
  end
endmodule
