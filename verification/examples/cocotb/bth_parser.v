// A streaming RoCEv2 header parser: the example design the cocotb test checks frame by
// frame against the model's codec (docs/guides/verification.md). One byte of an Ethernet
// frame (no FCS) per clock while in_valid, in_last on its final byte; one cycle after the
// final byte, out_valid pulses with the BTH fields and, for the opcodes that carry one, the
// RETH fields (has_reth). Ethernet II with an optional 802.1Q tag; IPv4 (20-byte header,
// as RoCEv2 sends) or IPv6; UDP; then BTH and RETH (IBA 9.2, 9.3.2). Frames the parser
// cannot place (another EtherType) pulse out_valid with bad_ethertype set.
//
// BROKEN = 1 is the deliberately broken variant the test must catch: it recognises a RETH
// only after RC opcodes, so UC RDMA WRITE FIRST/ONLY frames come out without one.
module bth_parser #(
    parameter BROKEN = 0
) (
    input  wire        clk,
    input  wire        rst,
    input  wire        in_valid,
    input  wire [7:0]  in_data,
    input  wire        in_last,
    output reg         out_valid,
    output reg         bad_ethertype,
    output reg  [7:0]  opcode,
    output reg         se,
    output reg         m,
    output reg  [1:0]  pad,
    output reg  [3:0]  tver,
    output reg  [15:0] pkey,
    output reg         fecn,
    output reg         becn,
    output reg  [23:0] dqpn,
    output reg         ackreq,
    output reg  [23:0] psn,
    output reg         has_reth,
    output reg  [63:0] reth_va,
    output reg  [31:0] reth_rkey,
    output reg  [31:0] reth_len
);
  // Position of the current byte in the frame.
  reg [15:0] pos;
  reg        vlan;
  reg        ipv6;
  reg        ip_known;
  reg [7:0]  ethertype_hi;

  // Where the BTH starts: Ethernet (14, +4 with a tag), IP (20 or 40), UDP (8).
  wire [15:0] bth_start = 16'd14 + (vlan ? 16'd4 : 16'd0) + (ipv6 ? 16'd40 : 16'd20) + 16'd8;
  wire [15:0] k = pos - bth_start;

  // The opcodes whose BTH is followed by a RETH: RDMA WRITE FIRST, ONLY, ONLY with
  // immediate and RDMA READ request, for RC (0x00-0x1f) and UC (0x20-0x3f); the UC set has
  // no READ. The broken variant forgets UC.
  function reth_follows(input [7:0] op);
    begin
      case (op)
        8'h06, 8'h0a, 8'h0b, 8'h0c: reth_follows = 1'b1;
        8'h26, 8'h2a, 8'h2b: reth_follows = (BROKEN == 0);
        default: reth_follows = 1'b0;
      endcase
    end
  endfunction

  always @(posedge clk) begin
    out_valid <= 1'b0;
    if (rst) begin
      pos <= 16'd0;
      vlan <= 1'b0;
      ipv6 <= 1'b0;
      ip_known <= 1'b0;
      bad_ethertype <= 1'b0;
      has_reth <= 1'b0;
    end else if (in_valid) begin
      // The EtherType, after an optional 802.1Q tag.
      if (pos == 16'd12 || (vlan && pos == 16'd16)) ethertype_hi <= in_data;
      if (pos == 16'd13 || (vlan && pos == 16'd17)) begin
        if (!vlan && pos == 16'd13 && {ethertype_hi, in_data} == 16'h8100) vlan <= 1'b1;
        else if ({ethertype_hi, in_data} == 16'h0800) ip_known <= 1'b1;
        else if ({ethertype_hi, in_data} == 16'h86dd) begin
          ipv6 <= 1'b1;
          ip_known <= 1'b1;
        end else bad_ethertype <= 1'b1;
      end
      if (pos == 16'd0) has_reth <= 1'b0;
      if (ip_known && pos >= bth_start) begin
        case (k)
          16'd0: begin
            opcode <= in_data;
            has_reth <= reth_follows(in_data);
          end
          16'd1: begin
            se <= in_data[7];
            m <= in_data[6];
            pad <= in_data[5:4];
            tver <= in_data[3:0];
          end
          16'd2: pkey[15:8] <= in_data;
          16'd3: pkey[7:0] <= in_data;
          16'd4: begin
            fecn <= in_data[7];
            becn <= in_data[6];
          end
          16'd5: dqpn[23:16] <= in_data;
          16'd6: dqpn[15:8] <= in_data;
          16'd7: dqpn[7:0] <= in_data;
          16'd8: ackreq <= in_data[7];
          16'd9: psn[23:16] <= in_data;
          16'd10: psn[15:8] <= in_data;
          16'd11: psn[7:0] <= in_data;
          default: begin
            // RETH: virtual address (8 bytes), R_Key (4), DMA length (4), big-endian.
            if (k >= 16'd12 && k < 16'd20) reth_va <= {reth_va[55:0], in_data};
            else if (k >= 16'd20 && k < 16'd24) reth_rkey <= {reth_rkey[23:0], in_data};
            else if (k >= 16'd24 && k < 16'd28) reth_len <= {reth_len[23:0], in_data};
          end
        endcase
      end
      if (in_last) begin
        out_valid <= 1'b1;
        pos <= 16'd0;
        vlan <= 1'b0;
        ipv6 <= 1'b0;
        ip_known <= 1'b0;
      end else begin
        pos <= pos + 16'd1;
      end
    end
    // A new frame starts clean.
    if (out_valid && !rst) bad_ethertype <= 1'b0;
  end
endmodule
